"""PassBudget: a lone row gets its own window; rows share a pass by what their offers (or measured rates) pay."""

from __future__ import annotations

from jacobi_rt.runtime.acceptance import PassCosts
from jacobi_rt.runtime.allocator import Guess, Offer
from jacobi_rt.runtime.scheduler import BATCH_PASS_COSTS, Bid, PassBudget, RowRate

SOLO = PassCosts(learn=False)  # a row's own one-row curve (the CPU prior)


def budget(**costs) -> PassBudget:
    return PassBudget(prefill_tokens=64, costs=PassCosts(learn=False, batch_table=costs or dict(BATCH_PASS_COSTS)))


def measured(tokens: float, window: int) -> RowRate:
    rate = RowRate(smoothing=1.0)
    rate.observe(window, tokens)
    return rate


def bids(wanted: list[int], rates: list[RowRate]) -> list[Bid]:
    """Rows whose proposers do not offer (a draft's): their measured rate stands in."""
    return [Bid(want, None, SOLO, rate) for want, rate in zip(wanted, rates)]


def offering(want: int, p: float, cost: float = 0.0) -> Bid:
    """A row offering one chain of want - 1 guesses, each right with chance p."""
    return Bid(want, Offer((Guess((p,) * (want - 1), cost=cost),), branches=1, margin=0.03), SOLO, RowRate())


def test_a_lone_row_gets_the_window_it_asks_for():
    assert budget().decode_window(bids([16], [measured(1.0, 16)])) == 16
    assert budget().decode_window(bids([1], [RowRate()])) == 1


def test_many_rows_that_rarely_accept_decode_greedily():
    rows = 16
    assert budget().decode_window(bids([8] * rows, [measured(1.05, 8)] * rows)) == 1


def test_rows_whose_guesses_pay_get_wider_passes_and_fewer_rows_wider_still():
    good = measured(3.0, 8)
    assert budget().decode_window(bids([8, 8], [good, good])) > 1
    assert budget().decode_window(bids([8] * 2, [good] * 2)) >= budget().decode_window(bids([8] * 16, [good] * 16))


def test_a_flat_cost_curve_gives_every_row_its_widest_window():
    flat = {1: 1.0, 4096: 1.0}
    assert PassBudget(costs=PassCosts(flat, learn=False, batch_table=flat)).decode_window(bids([4, 8, 2], [measured(1.5, 4)] * 3)) == 8


def test_no_window_is_wider_than_any_row_asks():
    assert budget().decode_window(bids([2, 1, 2], [measured(2.0, 2)] * 3)) <= 2


def test_a_prefill_pass_serves_the_first_arrivals_first_within_its_tokens():
    b = budget()  # 64 tokens a prefill pass
    assert b.prefill_pass([200], chunk=256) == (1, 200)  # one row may take a whole chunk
    assert b.prefill_pass([200, 10], chunk=48) == (1, 48)
    assert b.prefill_pass([20, 30, 5, 40], chunk=256) == (2, 30)  # a third row would make 3 x 30 > 64
    assert b.prefill_pass([8, 0, 8, 8, 8, 8, 8, 8, 8, 8], chunk=256) == (8, 8)  # a decoding row inside costs its place
    assert b.prefill_pass([8, 0, 0, 0, 0, 0, 0, 0, 100], chunk=256) == (1, 8)  # never ends on a decoding row


def test_a_greedy_pass_says_nothing_about_a_rows_guesses():
    rate = RowRate()
    rate.observe(1, 1)
    assert rate.expected(8) == 1.0 and (rate.tokens, rate.window) == (1.0, 1.0)
    rate.observe(8, 4)
    assert rate.expected(8) > rate.expected(2) > 1.0


def test_the_width_follows_the_rows_offers():
    assert budget().decode_window([offering(8, 0.9)] * 2) > 1  # guesses that are nearly always right pay
    assert budget().decode_window([offering(8, 0.05)] * 16) == 1  # guesses that rarely hit do not
    assert budget().decode_window([offering(8, 0.9)] * 2) >= budget().decode_window([offering(8, 0.9)] * 16)


def test_a_guess_producers_own_cost_counts_against_a_wider_pass():
    assert budget().decode_window([offering(8, 0.7)] * 4) > 1
    assert budget().decode_window([offering(8, 0.7, cost=1.0)] * 4) == 1  # a draft as slow as the target
