"""The allocator: cuts each offered guess by the one length rule, drops those that do not beat greedy, sends the
best."""

from __future__ import annotations

import pytest

from jacobi_rt.runtime.acceptance import PassCosts, pass_cost
from jacobi_rt.runtime.allocator import Guess, Offer, allocate, cut, expected_tokens
from jacobi_rt.runtime.config import CostConfig

COST = PassCosts(CostConfig(learn=False))


def test_cut_is_the_length_rule():
    for p in (0.05, 0.4, 0.8, 0.97):  # the L maximising (1 + p + ... + p^L) / cost(L + 1), by brute force
        gains = {n: sum(p**i for i in range(n + 1)) / pass_cost(n + 1) for n in range(1, 13)}
        best = max(gains, key=gains.get)
        assert cut((p,) * 12, 12, pass_cost) == (best, pytest.approx(gains[best]))
    assert cut((0.9,) * 3, 12, pass_cost)[0] <= 3  # never longer than the guess
    assert cut((0.9, 0.9, 0.0, 0.9), 4, lambda w: 1.0)[0] == 2  # a token sure to be wrong ends the useful part


def test_expected_tokens_multiplies_the_per_token_rates():
    assert expected_tokens(Guess((0.5, 0.5)), 2) == pytest.approx(1.75)
    assert expected_tokens(Guess((0.5, 0.5)), 0) == 1.0


def test_guesses_that_do_not_beat_greedy_by_the_margin_are_not_sent():
    offer = Offer((Guess((0.02,) * 8, tuple(range(8))),), branches=2, margin=0.03)
    allocation = allocate(offer, 8, COST)
    assert allocation.picks == [] and allocation.expected == 1.0


def test_the_best_guesses_go_first_and_only_as_many_as_the_branches():
    weak, strong, middle = Guess((0.5,) * 6, (1,) * 6), Guess((0.95,) * 6, (2,) * 6), Guess((0.8,) * 6, (3,) * 6)
    allocation = allocate(Offer((weak, strong, middle), branches=2, margin=0.03), 6, COST)
    assert [i for i, _ in allocation.picks] == [1, 2]  # ranked by gain, at most two branches
    assert 0 not in dict(allocation.picks)  # the weak guess is not sent
    assert allocation.expected == pytest.approx(expected_tokens(strong, allocation.picks[0][1]))


def test_the_limit_and_a_fixed_offer():
    offer = Offer((Guess((0.9,) * 8, tuple(range(8))),), fixed=True)
    assert allocate(offer, 3, COST).picks == [(0, 3)]  # a fixed offer is sent whole, within the room
    assert allocate(offer, 0, COST).picks == [] and allocate(Offer(), 5, COST).picks == []


def test_production_cost_is_charged_and_shortens_the_guess():
    free = allocate(Offer((Guess((0.7,) * 8),), margin=0.03), 8, COST)
    drafted = allocate(Offer((Guess((0.7,) * 8, cost=0.5),), margin=0.03), 8, COST)
    assert drafted.picks[0][1] <= free.picks[0][1] and free.production == 0.0
    assert drafted.production == pytest.approx(0.5 * drafted.picks[0][1])


def union_offer(*guesses: Guess, parts=(1, 1)) -> Offer:
    return Offer(guesses, branches=sum(parts), parts=parts)


def test_a_unions_guesses_share_one_limit_best_first_and_each_part_keeps_its_branches():
    draft = Guess((0.9,) * 8, cost=0.2, margin=0.03, part=0)
    copies = [Guess((p,) * 8, tuple(range(8)), margin=0.03, part=1) for p in (0.95, 0.8)]
    allocation = allocate(union_offer(draft, *copies), 12, COST)
    # in tree order, part by part; the runner-up copy is not sent (one branch a part)
    assert [i for i, _ in allocation.picks] == [0, 1]
    assert allocation.sent <= 12  # one limit for all
    drafted, copied = (n for _, n in allocation.picks)
    assert 0 < drafted == cut(draft.accept, 12 - copied, COST, draft.cost)[0] < 8  # the best copy chosen first:
    assert allocation.production == pytest.approx(0.2 * drafted)  # the draft cut again to the room it left


def test_each_guess_of_a_union_keeps_its_own_margin():
    guess = Guess((0.3,) * 4, margin=0.0, part=0)
    gain = cut(guess.accept, 4, COST)[1]
    assert allocate(union_offer(guess, parts=(1,)), 4, COST).picks  # beats greedy by more than its own margin
    strict = Guess((0.3,) * 4, margin=gain, part=0)  # the same guess, a margin it cannot beat
    assert not allocate(union_offer(strict, parts=(1,)), 4, COST).picks


def test_a_fixed_guess_in_a_union_is_sent_whole_and_first():
    fixed = Guess((0.1,) * 3, fixed=True, part=0)  # a fixed-K draft: sent whatever it is worth
    copy = Guess((0.95,) * 8, tuple(range(8)), part=1)
    assert allocate(union_offer(fixed, copy), 6, COST).picks[0] == (0, 3)
    assert allocate(union_offer(fixed, copy), 2, COST).picks == [(0, 2)]  # no room left for the copy


def test_an_allocations_value_prices_its_production():
    greedy = allocate(Offer(), 4, COST)
    assert greedy.value(COST) == pytest.approx(1.0) and greedy.units(COST) == 1.0
    free = allocate(Offer((Guess((0.9,) * 4),)), 4, COST)
    paid = allocate(Offer((Guess((0.9,) * 4, cost=0.3),), fixed=True), 4, COST)
    assert free.value(COST) > paid.value(COST) and paid.units(COST) == pytest.approx(COST(5) + 1.2)


def test_an_offer_cut_for_a_trial():
    offer = Offer((Guess((0.9,) * 8, tuple(range(8)), cost=0.1), Guess((0.5,) * 2)), branches=2)
    cut3 = offer.cut_to(3)
    assert [len(g.accept) for g in cut3.guesses] == [3, 2] and cut3.guesses[0].tokens == (0, 1, 2)
    assert cut3.guesses[0].cost == 0.1 and cut3.branches == 2
