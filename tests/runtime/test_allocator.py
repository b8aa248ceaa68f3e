"""The allocator: cuts each offered guess by the one length rule, drops those that do not beat greedy, sends the best."""

from __future__ import annotations

import pytest

from jacobi_rt.runtime.acceptance import PassCosts, best_length, pass_cost
from jacobi_rt.runtime.allocator import Guess, Offer, allocate, cut, expected_tokens

COST = PassCosts(learn=False)


def test_cut_is_the_length_rule_and_equals_best_length_for_a_constant_rate():
    for p in (0.05, 0.4, 0.8, 0.97):
        assert cut((p,) * 12, 12, pass_cost) == best_length(p, 12, pass_cost)
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
    assert allocation.lengths(3)[0] == 0
    assert allocation.expected == pytest.approx(expected_tokens(strong, allocation.picks[0][1]))


def test_the_limit_and_a_fixed_offer():
    offer = Offer((Guess((0.9,) * 8, tuple(range(8))),), fixed=True)
    assert allocate(offer, 3, COST).picks == [(0, 3)]  # a fixed offer is sent whole, within the room
    assert allocate(offer, 0, COST).picks == [] and allocate(None, 5, COST).picks == []


def test_production_cost_is_charged_and_shortens_the_guess():
    free = allocate(Offer((Guess((0.7,) * 8),), margin=0.03), 8, COST)
    drafted = allocate(Offer((Guess((0.7,) * 8, cost=0.5),), margin=0.03), 8, COST)
    assert drafted.picks[0][1] <= free.picks[0][1] and free.production == 0.0
    assert drafted.production == pytest.approx(0.5 * drafted.picks[0][1])
