"""PassBudget: a lone row gets its own window; rows share a pass by what their offers pay."""

from __future__ import annotations

from jacobi_rt.runtime.acceptance import PassCosts
from jacobi_rt.runtime.allocator import Guess, Offer
from jacobi_rt.runtime.config import CostConfig
from jacobi_rt.runtime.pass_budget import BATCH_PASS_COSTS, Bid, PassBudget

SOLO = PassCosts(CostConfig(learn=False))  # a row's own one-row curve (the CPU prior)


def budget(**costs) -> PassBudget:
    return PassBudget(
        prefill_tokens=64, costs=PassCosts(CostConfig(learn=False, batch_pass_costs=costs or BATCH_PASS_COSTS))
    )


def offering(want: int, p: float, cost: float = 0.0) -> Bid:
    """A row offering one chain of want - 1 guesses, each right with chance p."""
    return Bid(want, Offer((Guess((p,) * (want - 1), cost=cost),), branches=1, margin=0.03), SOLO)


def union(want: int, draft_p: float, copy_p: float) -> Bid:
    """A union row (runtime.proposers.UnionProposer's offer): a draft's chain (a draft pass a token) beside a free
    copy."""
    guesses = (
        Guess((draft_p,) * (want - 1), cost=0.3, margin=0.03, part=0),
        Guess((copy_p,) * (want - 1), margin=0.03, part=1),
    )
    return Bid(want, Offer(guesses, branches=2, parts=(1, 1)), SOLO)


def test_a_lone_row_gets_the_window_it_asks_for():
    assert budget().decode_window([offering(16, 0.05)]) == 16  # its own policy decided, as in a single generation
    assert budget().decode_window([offering(1, 0.9)]) == 1


def test_many_rows_that_rarely_accept_decode_greedily():
    assert budget().decode_window([offering(8, 0.05)] * 16) == 1


def test_rows_whose_guesses_pay_get_wider_passes_and_fewer_rows_wider_still():
    assert budget().decode_window([offering(8, 0.8)] * 2) > 1
    assert budget().decode_window([offering(8, 0.8)] * 2) >= budget().decode_window([offering(8, 0.8)] * 16)


def test_a_flat_cost_curve_gives_every_row_its_widest_window():
    flat = {1: 1.0, 4096: 1.0}
    bids = [offering(4, 0.5), offering(8, 0.5), offering(2, 0.5)]
    assert PassBudget(costs=PassCosts(CostConfig(flat, learn=False, batch_pass_costs=flat))).decode_window(bids) == 8


def test_no_window_is_wider_than_any_row_asks():
    assert budget().decode_window([offering(2, 0.9), offering(1, 0.9), offering(2, 0.9)]) <= 2


def test_union_rows_bid_their_best_parts_guess_with_its_production_cost():
    copy_only = union(8, draft_p=0.0, copy_p=0.9)
    assert copy_only.expected(8) == offering(8, 0.9).expected(8)  # the draft's chain that never hits is not sent
    assert copy_only.expected(8)[1] == 0.0  # and costs nothing
    drafted = union(8, draft_p=0.9, copy_p=0.0)
    tokens, made = drafted.expected(8)
    assert tokens > 2 and made > 0  # the draft's chain, priced
    assert budget().decode_window([union(8, 0.9, 0.9)] * 2) > 1
    assert budget().decode_window([union(8, 0.05, 0.05)] * 16) == 1


def test_a_prefill_pass_serves_the_first_arrivals_first_within_its_tokens():
    b = budget()  # 64 tokens a prefill pass
    assert b.prefill_pass([200], chunk=256) == (1, 200)  # one row may take a whole chunk
    assert b.prefill_pass([200, 10], chunk=48) == (1, 48)
    assert b.prefill_pass([20, 30, 5, 40], chunk=256) == (2, 30)  # a third row would make 3 x 30 > 64
    assert b.prefill_pass([8, 0, 8, 8, 8, 8, 8, 8, 8, 8], chunk=256) == (8, 8)  # a decoding row inside costs its place
    assert b.prefill_pass([8, 0, 0, 0, 0, 0, 0, 0, 100], chunk=256) == (1, 8)  # never ends on a decoding row


def test_the_width_follows_the_rows_offers():
    assert budget().decode_window([offering(8, 0.9)] * 2) > 1  # guesses that are nearly always right pay
    assert budget().decode_window([offering(8, 0.05)] * 16) == 1  # guesses that rarely hit do not
    assert budget().decode_window([offering(8, 0.9)] * 2) >= budget().decode_window([offering(8, 0.9)] * 16)


def test_a_guess_producers_own_cost_counts_against_a_wider_pass():
    assert budget().decode_window([offering(8, 0.7)] * 4) > 1
    assert budget().decode_window([offering(8, 0.7, cost=1.0)] * 4) == 1  # a draft as slow as the target


def forced(want: int, run: int, p: float = 0.05) -> Bid:
    """A constrained row whose grammar forces `run` tokens next (runtime.grammar.Matcher.constrain's offer:
    right with chance 1 and free), its proposer's guesses past the run rarely right."""
    return Bid(want, Offer((Guess((1.0,) * run + (p,) * (want - 1 - run), free=run, margin=0.03),), margin=0.03), SOLO)


def test_a_forced_run_widens_the_pass_to_just_hold_it():
    # two rows (priors: 2 x 1 tokens 1.09, 2 x 2 1.27, 2 x 3 1.48, 2 x 4 1.68 W=1 passes): the run of 2 gives
    # 2 / 1.09 = 1.8 tokens a unit at W=1, 3 / 1.27 = 2.4 at W=2, 4 / 1.48 = 2.7 at W=3, 4 / 1.68 = 2.4 at W=4:
    # W=1 would ignore the run's value, W=2 or 4 (the grid) cut it or pad past it
    assert budget().decode_window([forced(8, 2), offering(8, 0.05)]) == 3
    assert forced(8, 2).sure == 3 and forced(4, 6).sure == 4 and offering(8, 0.9).sure == 1
    # 16 rows, half holding runs of 4: 40 tokens / 6.8 at W=4 < 16 / 2.5 at W=1; the padded pass costs every row
    assert budget().decode_window([forced(8, 4)] * 8 + [offering(8, 0.05)] * 8) == 1
