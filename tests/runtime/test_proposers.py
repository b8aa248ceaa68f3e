"""Union and auto proposers: the union's offer and shares, auto's arm choice by offer value, its probes and sit-outs.

The target here is a script (it predicts `truth`) and every pass's seconds are injected: 10 ms plus 1 ms a
window token, so a W=1 pass takes 11 ms (the prior cost table's W=4 cost, 1.25, is about 14/11).
"""

from __future__ import annotations

import pytest
from alone import propose, send

from jacobi_rt.runtime.allocator import Allocation, Guess, Offer, sent_guesses
from jacobi_rt.runtime.auto import ArmHistory, AutoProposer
from jacobi_rt.runtime.config import AutoConfig
from jacobi_rt.runtime.passes import pass_result
from jacobi_rt.runtime.proposers import Proposer, UnionProposer
from jacobi_rt.runtime.tree import build_tree

UNIT = 0.011  # seconds of a W=1 pass


class Scripted(Proposer):
    """An arm that always offers the same guess (right or wrong), each token right with chance `p` by its
    own estimate, producing a token costing `cost` target W=1 passes; `asked` keeps the tokens each pass sent of
    its offer (a pass that did not allocate its offer adds nothing)."""

    def __init__(self, guess: list[int], p: float = 0.9, cost: float = 0.0):
        super().__init__()
        self.guess, self.p, self.cost, self.asked = guess, p, cost, []

    def start(self, prompt, first):
        pass

    def offer(self, limit, after=()):
        tokens = tuple(self.guess[:limit])
        return Offer((Guess((self.p,) * len(tokens), tokens, self.cost),), margin=0.03) if tokens else Offer()

    def observe(self, result):
        if result.sent is not None:
            self.asked.append(result.sent.sent)


class Modelled(Scripted):
    """A Scripted arm that runs a model of its own: `cost` W=1 passes of model time a token it makes (reported
    as own_seconds, not slept), and a one-time catch-up of `catchup` seconds the first time (a draft's prefill)."""

    def __init__(self, guess, p=0.9, cost=0.0, catchup=0.0):
        super().__init__(guess, p, cost)
        self.catchup, self.model = catchup, 0.0

    @property
    def own_seconds(self):
        return self.model

    def observe(self, result):
        super().observe(result)
        if result.sent is not None and result.sent.sent:
            self.catchup_seconds += self.catchup  # not own time: paid once, not per pass
            self.catchup = 0.0
            self.model += self.cost * UNIT * result.sent.sent


class Flaky(Scripted):
    """A prompt-lookup-like arm: it has a (right) guess only on every other pass."""

    def __init__(self, guess, p=0.95):
        super().__init__(guess, p)
        self.calls = 0

    def offer(self, limit, after=()):
        self.calls += 1
        return super().offer(limit, after) if self.calls % 2 else Offer()


def _pass(proposer, budget=3, truth=(1, 2, 3, 4)):
    """One pass of `proposer` against a target that predicts `truth`."""
    guesses, sent = propose(proposer, budget)
    tree = build_tree(0, guesses, max_nodes=budget + 1)
    predictions = list(truth[: len(tree.tokens)])
    seconds = 0.010 + 0.001 * len(tree.tokens)
    proposer.observe(pass_result(tree, predictions, tree.accept(predictions), seconds, sent=sent))
    return tree


def _auto_call(auto, passes=20) -> list[str]:
    auto.start([0], 0)
    chosen = []
    for _ in range(passes):
        _pass(auto)
        chosen.append(auto.current)
    auto.close()
    return chosen


# -- union ---------------------------------------------------------------------------------------


def test_union_offers_its_parts_guesses_side_by_side_with_their_own_margins_and_costs():
    draft, copy = Scripted([1, 2, 3], p=0.8, cost=0.3), Scripted([1, 5, 6, 7], p=0.95)
    union = UnionProposer({"draft": draft, "copy": copy})
    union.start([0], 0)
    offer = union.offer(5)
    assert [g.part for g in offer.guesses] == [0, 1] and offer.parts == (1, 1)
    assert offer.guesses[0].cost == 0.3 and offer.guesses[1].cost == 0.0
    assert all(g.margin == 0.03 for g in offer.guesses)  # each part's own margin travels with its guesses


def test_union_hands_each_part_its_own_share_of_what_was_sent():
    first, second = Scripted([1, 2, 3], p=0.95), Scripted([1, 5, 6, 7], p=0.8)
    union = UnionProposer({"first": first, "second": second})
    union.start([0], 0)
    offer = union.offer(5)
    sent = Allocation([(0, 3), (1, 2)])
    branches = sent_guesses(offer, sent)
    assert branches == [[1, 2, 3], [1, 5]]
    tree = build_tree(0, branches)
    predictions = [1, 5, 9, 9, 6]  # the second branch is right: 1, 5, then 6
    verdict = tree.accept([predictions[i] for i in range(len(tree.tokens))])
    union.observe(pass_result(tree, predictions, verdict, 0.01, sent=sent))
    assert verdict.committed[:2] == [1, 5] and (first.asked, second.asked) == ([3], [2])
    offer = union.offer(5)
    sent = Allocation([(1, 4)])
    assert sent_guesses(offer, sent) == [[1, 5, 6, 7]]
    tree = build_tree(0, [[1, 5, 6, 7]])
    union.observe(pass_result(tree, [1] * 5, tree.accept([1] * 5), 0.01, sent=sent))
    assert first.asked[-1] == 0 and second.asked[-1] == 4  # a part not chosen sent nothing
    assert set(union.stats) == {"first", "second"}


def test_union_through_the_allocator_sends_the_better_part_first_and_the_other_in_the_room_left():
    first, second = Scripted([1, 2, 3], p=0.95), Scripted([1, 5, 6, 7], p=0.8)
    union = UnionProposer({"first": first, "second": second})
    union.start([0], 0)
    branches, sent = propose(union, 5)
    assert branches == [[1, 2, 3], [1, 5]] and sent.picks == [(0, 3), (1, 2)]
    slow = UnionProposer({"draft": Scripted([1, 2, 3], p=0.95, cost=2.0), "copy": Scripted([1, 5, 6, 7], p=0.8)})
    slow.start([0], 0)
    assert send(slow, 5) == [[1, 5, 6, 7]]  # a draft dearer than the target pass is not run; the free copy is


# -- auto ----------------------------------------------------------------------------------------


def test_auto_tries_every_arm_then_prefers_the_one_that_delivers_and_keeps_probing():
    good, bad = Scripted([1, 2, 3]), Scripted([9, 9, 9])  # the same estimates: the measured record decides
    auto = AutoProposer({"bad": bad, "good": good}, AutoConfig(warmup=2, probe_every=10, probe_budget=2))
    auto.start([0], 0)
    chosen = []
    for _ in range(40):
        _pass(auto)
        chosen.append(auto.current)
    assert chosen[:4] == ["bad", "bad", "good", "good"]  # each arm measured first
    assert good.asked[:2] == [2, 2]  # warming up, the second arm is on trial: at most probe_budget guesses
    probes = [i for i, who in enumerate(chosen) if i >= 4 and who == "bad"]
    assert probes == [9, 19, 39]  # probed when due, the wait doubling: 10, 20
    assert len(bad.asked) == chosen.count("bad") and bad.asked[2:] == [2, 2, 2]  # only the chosen arm is taken from
    assert auto.calibration("good") > 3 * auto.calibration("bad")
    assert auto.won == {
        "bad": 0,
        "good": 4 * chosen[4:].count("good"),
    }  # the call's winner: warm-ups and probes not counted


def test_auto_gives_each_pass_to_the_arm_whose_offer_is_worth_most():
    copy = Flaky([1, 2, 3])  # free, but only every other pass
    draft = Modelled([1, 2, 3], p=0.95, cost=0.3)  # always, at 0.3 W=1 passes a token
    auto = AutoProposer({"copy": copy, "draft": draft}, AutoConfig(warmup=2, probe_every=10))
    auto.start([0], 0)
    chosen, offered = [], []
    for _ in range(30):
        _pass(auto)
        chosen.append(auto.current)
        offered.append(copy.calls % 2 == 1)
    after = list(zip(chosen, offered))[4:]
    assert all(who == ("copy" if has else "draft") for who, has in after)  # the copy when it has one, else the draft
    assert auto.calibration("copy") == pytest.approx(auto.calibration("draft"), rel=0.15)  # both honest


def test_auto_prices_a_drafts_production_and_its_own_time_but_not_its_one_time_catch_up():
    late = Modelled([1, 2, 3], catchup=0.2)
    auto = AutoProposer({"first": Scripted([1, 2, 3]), "late": late}, AutoConfig(warmup=2))
    _auto_call(auto, passes=6)
    assert late.catchup_seconds == 0.2
    # counted, the 0.2 s would make "late" about ten times slower than "first" (passes take 14 ms)
    assert auto.rate("late") == pytest.approx(auto.rate("first"))
    slow = Modelled([1, 2, 3], cost=1.0)  # the same guesses, but a model as slow as the target, priced in its offer
    auto = AutoProposer({"slow": slow, "free": Scripted([1, 2, 3])}, AutoConfig(warmup=2, probe_every=100))
    assert _auto_call(auto, passes=12)[4:] == ["free"] * 8
    assert auto.rate("free") > 1.5 * auto.rate("slow")  # and the measured record agrees


def test_auto_does_not_probe_an_arm_with_nothing_to_send():
    quiet = Flaky([9, 9, 9])  # wrong when it guesses
    auto = AutoProposer({"good": Scripted([1, 2, 3]), "quiet": quiet}, AutoConfig(warmup=2, probe_every=3))
    chosen = _auto_call(auto, passes=30)
    probes = [i for i, who in enumerate(chosen) if i >= 4 and who == "quiet"]
    assert probes and all(i % 2 == 0 for i in probes)  # only on passes where it offers (odd offer calls)


def test_auto_history_benches_a_losing_arm_for_doubling_calls_and_a_win_resets_it():
    history = ArmHistory(max_sit_out=4)
    good, bad = Scripted([1, 2, 3]), Scripted([9, 9, 9])
    tried = []
    for _ in range(12):
        chosen = _auto_call(AutoProposer({"good": good, "bad": bad}, AutoConfig(warmup=2), history=history))
        tried.append("bad" in chosen)
    # lose -> sit out 1 call; lose -> 2; -> 4; -> 4 (capped)
    assert tried == [True, False, True, False, False, True, False, False, False, False, True, False]
    # the same arm, now winning: one win and it is back in every call
    history.sit_out["bad"] = 0
    for _ in range(3):
        assert "bad" in _auto_call(
            AutoProposer({"good": bad, "bad": Scripted([1, 2, 3])}, AutoConfig(warmup=2), history=history)
        )
    assert history.losses["bad"] == 0
    # a short answer (fewer passes than probe_every) is no fair trial: nothing is recorded
    _auto_call(
        AutoProposer({"good": good, "bad": bad}, AutoConfig(warmup=2, probe_every=16), history=history), passes=10
    )
    assert history.losses["bad"] == 0 and history.sit_out["bad"] == 0


def test_auto_takes_nothing_from_a_pass_without_room():
    arm = Scripted([1, 2, 3])
    auto = AutoProposer({"a": arm, "b": Scripted([1, 2, 3])}, AutoConfig(warmup=1))
    auto.start([0], 0)
    assert send(auto, 0) == [] and arm.asked == [] and auto.passes == 0


def test_lookahead_guesses_past_a_forced_run():
    """Its lookups are keyed on the committed tokens followed by the run: "3 4" after 9 is found in the prompt."""
    from jacobi_rt.runtime.proposers import LookaheadProposer

    proposer = LookaheadProposer(branches=1)
    proposer.start([1, 2, 3, 4, 5, 6, 7, 8], 9)
    assert proposer.offer(3).guesses == ()  # nothing follows 9 yet
    assert [g.tokens for g in proposer.offer(3, after=[3, 4]).guesses] == [(5, 6, 7)]
