"""Batcher: rows join, leave and decode in shared passes; each row's output equals its solo run."""

from __future__ import annotations

import itertools
import threading

import pytest
from recording import Recording

from jacobi_rt.runtime import Generator
from jacobi_rt.runtime.acceptance import PassCosts
from jacobi_rt.runtime.batcher import Batcher
from jacobi_rt.runtime.config import AutoConfig, CostConfig, DraftConfig
from jacobi_rt.runtime.errors import BackendError, ContextLimitError, InputError
from jacobi_rt.runtime.pass_budget import PassBudget
from jacobi_rt.runtime.proposers import JacobiProposer, LookaheadProposer, NoProposer
from jacobi_rt.runtime.row import END, Row
from jacobi_rt.runtime.sampling import Sampler, SamplingParams
from jacobi_rt.runtime.windows import AdaptiveWindow

PROMPTS = [
    [5, 6, 7, 8, 9],
    [11, 12, 13, 11, 12, 13, 11, 12],
    [40, 41, 42],
    [7, 7, 7, 7, 100, 101, 102, 7, 7, 7],
    list(range(20, 60)),
]
PROPOSERS = {"greedy": (NoProposer, 1), "jacobi": (JacobiProposer, 4), "lookahead": (LookaheadProposer, 8)}


@pytest.fixture(scope="module")
def gen(artifact):
    return Generator.load(artifact("llama"), graph="inplace", threads=1)


def clock():
    ticks = itertools.count()
    return lambda: next(ticks) * 0.01  # every reading 10 ms later: passes have a cost, tests no sleep


def batcher(gen, slots, chunk=256, wide=False):
    """wide: a flat cost curve (wide passes free, as on a GPU), so every row gets the window it asks for."""
    flat = {1: 1.0, 4096: 1.0}
    budget = PassBudget(costs=PassCosts(CostConfig(flat, learn=False, batch_pass_costs=flat))) if wide else None
    return Batcher.open(gen.backend, slots, prefill_chunk=chunk, budget=budget, clock=clock())


def row(gen, prompt, max_new=16, strategy="greedy", sampling=None):
    make, window = PROPOSERS[strategy]
    sampler = Sampler(sampling or SamplingParams(), len(prompt))
    policy = AdaptiveWindow(window) if strategy == "jacobi" else window
    return Row(list(prompt), max_new, make(), sampler, policy, set(gen.manifest.tokens.eos_ids), gen.limits.max_context)


def drained(r: Row) -> list[int]:
    out = []
    while (batch := r.tokens.get_nowait()) is not END:
        out += batch
    return out


def solo(gen, prompt, max_new=16, **kw):
    return gen.generate(prompt, max_new_tokens=max_new, strategy="greedy", **kw).ids


def run_until_done(eng, rows, limit=500):
    for _ in range(limit):
        if all(r.finished and r.slot < 0 for r in rows):
            return
        eng.step()
    raise AssertionError("the batcher did not finish its rows")


@pytest.mark.parametrize("wide", [False, True])
def test_rows_joining_and_leaving_mid_generation_equal_their_solo_greedy(gen, wide):
    eng = batcher(gen, slots=2, wide=wide)
    a, b = eng.submit(row(gen, PROMPTS[0], 24, "jacobi")), eng.submit(row(gen, PROMPTS[1], 6, "lookahead"))
    c = row(gen, PROMPTS[2], 10)
    for _ in range(3):
        eng.step()
    eng.submit(c)  # waits: both slots are taken
    eng.step()
    assert c.slot == -1 and eng.queued == 1
    run_until_done(eng, [a, b, c])
    assert (drained(a), drained(b), drained(c)) == (
        solo(gen, PROMPTS[0], 24),
        solo(gen, PROMPTS[1], 6),
        solo(gen, PROMPTS[2], 10),
    )
    assert eng.running == 0 and eng.ctx.lengths.tolist() == [0, 0]
    eng.close()


def test_a_finished_row_in_a_low_slot_is_replaced_by_the_last_one(gen):
    eng = batcher(gen, slots=3)
    rows = [eng.submit(row(gen, p, n)) for p, n in zip(PROMPTS, (3, 20, 20))]
    while not rows[0].finished:
        eng.step()
    eng.step()
    assert (rows[0].slot, rows[2].slot, rows[1].slot) == (-1, 0, 1)  # the last row moved into slot 0
    run_until_done(eng, rows)
    assert [drained(r) for r in rows] == [solo(gen, p, n) for p, n in zip(PROMPTS, (3, 20, 20))]
    eng.close()


def test_a_cancelled_row_frees_its_slot_before_the_next_pass(gen):
    eng = batcher(gen, slots=1)
    a, b = eng.submit(row(gen, PROMPTS[0], 50)), eng.submit(row(gen, PROMPTS[1], 5))
    eng.step()
    eng.step()
    eng.cancel(a)
    record = eng.step()
    assert a.slot == -1 and a.progress.finish_reason == "cancelled" and b.slot == 0
    assert record.rows == 1  # the pass ran b alone
    tokens = drained(a)
    assert tokens == solo(gen, PROMPTS[0], 50)[: len(tokens)]
    run_until_done(eng, [b])
    assert drained(b) == solo(gen, PROMPTS[1], 5)
    eng.close()


def test_a_long_prompt_is_prefilled_in_chunks_between_the_others_passes(gen):
    eng = batcher(gen, slots=2, chunk=8)
    a = eng.submit(row(gen, PROMPTS[0], 30))
    for _ in range(3):
        eng.step()
    long = eng.submit(row(gen, PROMPTS[4], 5))  # 40 tokens: 5 chunks of 8
    kinds = []
    while long.prefilling:
        before = a.produced
        kinds.append(eng.step().kind)
        if kinds[-1] == "decode":
            assert a.produced > before
    assert kinds.count("prefill") == 5 and "decode" in kinds
    assert max(len(list(g)) for k, g in itertools.groupby(kinds) if k == "prefill") == 1  # never two in a row
    run_until_done(eng, [a, long])
    assert drained(a) == solo(gen, PROMPTS[0], 30) and drained(long) == solo(gen, PROMPTS[4], 5)
    eng.close()


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3", "mistral"])
def test_mixed_strategies_in_one_batch_equal_solo_greedy(artifact, family):
    gen = Generator.load(artifact(family), graph="inplace", threads=1)
    eng = batcher(gen, slots=4, wide=True)
    strategies = ["greedy", "jacobi", "lookahead", "lookahead", "jacobi"]
    rows = [eng.submit(row(gen, p, 20, s)) for p, s in zip(PROMPTS, strategies)]
    widths = []
    eng.stats.observers.append(lambda record: widths.append(record.window))
    run_until_done(eng, rows)
    assert [drained(r) for r in rows] == [solo(gen, p, 20) for p in PROMPTS]
    assert max(widths) >= 4  # guesses were verified in shared passes
    eng.close()


def test_a_sampling_row_in_a_batch_samples_what_it_samples_alone(gen):
    params = SamplingParams(temperature=0.8, top_k=20, seed=7)
    eng = batcher(gen, slots=3)
    rows = [
        eng.submit(row(gen, PROMPTS[0], 12, "greedy", params)),
        eng.submit(row(gen, PROMPTS[1], 12)),
        eng.submit(row(gen, PROMPTS[3], 12, "lookahead", params)),
    ]
    run_until_done(eng, rows)
    alone = [
        gen.generate(p, max_new_tokens=12, strategy="greedy", temperature=0.8, top_k=20, seed=7).ids
        for p in (PROMPTS[0], PROMPTS[3])
    ]
    assert [drained(rows[0]), drained(rows[2])] == alone
    assert drained(rows[1]) == solo(gen, PROMPTS[1], 12)
    eng.close()


def test_generate_batch_fails_only_the_prompt_over_the_context(gen):
    too_long = list(range(3, 3 + gen.limits.max_context))
    results = gen.generate_batch([PROMPTS[0], too_long, PROMPTS[2]], max_new_tokens=8, strategy="lookahead")
    assert isinstance(results[1], ContextLimitError) and "shorten the prompt" in str(results[1])
    assert [results[0].ids, results[2].ids] == [solo(gen, PROMPTS[0], 8), solo(gen, PROMPTS[2], 8)]
    assert results[0].stats.strategy == "lookahead" and results[0].stats.new_tokens == 8


def test_the_started_engine_runs_generate_stream_and_start_with_their_own_stop_strings(gen):
    text = gen.generate(PROMPTS[0], max_new_tokens=20, strategy="greedy").text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    gen.start_batching(3)
    try:
        results = {}

        def run(name, **kw):
            results[name] = gen.generate(PROMPTS[0], max_new_tokens=20, **kw)

        threads = [
            threading.Thread(target=run, args=(n,), kwargs=kw)
            for n, kw in [
                ("plain", {"strategy": "greedy"}),
                ("stop", {"strategy": "jacobi", "stop": stop}),
                ("look", {"strategy": "lookahead"}),
            ]
        ]
        [t.start() for t in threads]
        [t.join() for t in threads]
        streamed = "".join(gen.stream(PROMPTS[0], max_new_tokens=20, strategy="lookahead"))
        early = gen.start(PROMPTS[1], max_new_tokens=200, strategy="greedy")
        next(iter(early))
        early.close()  # cancels its row
    finally:
        engine_ = gen.batcher
        gen.stop_batching()
    assert results["plain"].text == results["look"].text == streamed == text
    assert results["stop"].text == text[: text.index(stop)] and results["stop"].stats.finish_reason == "stop"
    assert results["look"].stats.target_passes > 0 and engine_.running == 0


def test_bad_engine_requests_are_clear_errors(gen, artifact):
    with pytest.raises(InputError, match="at least 1 slot"):
        Batcher.open(gen.backend, 0)
    portable = Generator.load(artifact("llama"), graph="portable", threads=1)
    with pytest.raises(BackendError, match="in-place graph"):
        Batcher.open(portable.backend, 2)
    one_by_one = portable.generate_batch([PROMPTS[0], PROMPTS[2]], max_new_tokens=6, strategy="jacobi")
    assert [r.ids for r in one_by_one] == [solo(gen, PROMPTS[0], 6), solo(gen, PROMPTS[2], 6)]
    with pytest.raises(InputError, match="list of prompts"):
        gen.generate_batch("one prompt")
    gen.start_batching(1)
    try:
        with pytest.raises(InputError, match="already runs"):
            gen.start_batching(1)
    finally:
        gen.stop_batching()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["greedy", "auto"])
def test_smollm2_sixteen_rows_equal_their_solo_greedy(artifact, strategy):
    """The real model: 16 chat prompts in one batch, each output its solo greedy's token for token."""
    from jacobi_rt.runtime.manifest import load_manifest

    folder = artifact("smollm2-135m")
    if "inplace" not in load_manifest(folder, verify=False).graphs:
        pytest.skip(f"{folder} has no in-place graph; re-export it (`python tests/make_artifacts.py DIR --smollm2`)")
    gen = Generator.load(folder, graph="inplace", verify=False)
    topics = [
        "the sea",
        "prime numbers",
        "a Python function that reverses a string",
        "the Roman Empire",
        "bread",
        "volcanoes",
        "a haiku about rain",
        "how vaccines work",
        "chess openings",
        "the moon landing",
        "compilers",
        "sleep",
        "photosynthesis",
        "a limerick about a cat",
        "binary search",
        "the water cycle",
    ]
    prompts = [
        gen.tokenizer.encode(
            gen.chat_prompt([{"role": "user", "content": f"Tell me about {t}."}]), add_special_tokens=False
        )
        for t in topics
    ]
    solo = [gen.generate(p, max_new_tokens=32, strategy="greedy").ids for p in prompts]
    batched = gen.generate_batch(prompts, max_new_tokens=32, strategy=strategy)
    for i, (alone, result) in enumerate(zip(solo, batched)):
        if result.ids != alone:
            at = next(
                (k for k, (a, b) in enumerate(zip(alone, result.ids)) if a != b), min(len(alone), len(result.ids))
            )
            pytest.fail(
                f"prompt {i} ({topics[i]!r}): batched differs from solo greedy first at new token {at}; "
                "run benchmarks/batch_check.py for the top-2 logit gap (a gap near 1e-4 is a numerical near-tie)"
            )


def test_a_started_engine_with_a_smaller_context_sets_the_limits(gen):
    gen.start_batching(2, capacity=32)
    try:
        assert gen.limits.max_context == 32
        with pytest.raises(ContextLimitError, match="holds 32"):
            gen.generate(list(range(3, 40)), max_new_tokens=4)
        assert gen.generate(PROMPTS[0], max_new_tokens=40, strategy="greedy").stats.finish_reason == "context"
    finally:
        gen.stop_batching()
    assert gen.limits.max_context == gen.backend.limits.max_context


def test_the_default_slot_context_is_capped_where_attention_reads_the_capacity(gen, monkeypatch):
    from jacobi_rt.runtime import slots as module

    monkeypatch.setattr(module, "DEFAULT_BATCH_CONTEXT", 48)
    for attention, expected in (("scatter", 48), ("gqa", gen.backend.limits.max_context)):
        monkeypatch.setitem(
            gen.manifest.check, "inplace", {**gen.manifest.check.get("inplace", {}), "attention": attention}
        )
        gen.start_batching(1)
        try:
            assert gen.batcher.capacity == expected
        finally:
            gen.stop_batching()


def test_each_row_gets_one_pass_result_timed_once_around_the_batched_forward(gen):
    eng = batcher(gen, 2, wide=True)
    rows = [
        Row(
            list(p),
            8,
            Recording(),
            Sampler(SamplingParams(), len(p)),
            4,
            set(gen.manifest.tokens.eos_ids),
            gen.limits.max_context,
        )
        for p in PROMPTS[:2]
    ]
    for r in rows:
        eng.submit(r)
    run_until_done(eng, rows)
    for r in rows:
        assert r.proposer.results and all(res.seconds == pytest.approx(0.01) for res in r.proposer.results)
        assert all(res.window == len(res.tree.tokens) and res.width >= res.window for res in r.proposer.results)
    assert any((res.rows, res.width) == (2, 4) for res in rows[0].proposer.results)  # a shared pass
    eng.close()


def test_union_and_auto_rows_bid_their_offers_and_equal_their_solo_greedy(artifact):
    from jacobi_rt.runtime.allocator import Offer
    from jacobi_rt.runtime.auto import AutoProposer
    from jacobi_rt.runtime.draft import DraftProposer
    from jacobi_rt.runtime.proposers import UnionProposer

    gen = Generator.load(artifact("llama"), draft=artifact("llama-draft1"), graph="inplace", threads=1)

    def union():
        return UnionProposer({"draft": DraftProposer(gen.draft, 128), "lookahead": LookaheadProposer(1)})

    proposers = [
        union(),
        AutoProposer({"lookahead": LookaheadProposer(), "draft": union()}, AutoConfig(warmup=1, probe_every=4)),
        union(),
        AutoProposer({"lookahead": LookaheadProposer(), "draft": union()}, AutoConfig(warmup=1, probe_every=4)),
    ]
    eng = batcher(gen, slots=4, wide=True)
    bids, decide = [], eng.budget.decode_window
    eng.budget.decode_window = lambda b: bids.append(b) or decide(b)
    rows = [
        eng.submit(
            Row(
                list(p),
                20,
                proposer,
                Sampler(SamplingParams(), len(p)),
                8,
                set(gen.manifest.tokens.eos_ids),
                gen.limits.max_context,
            )
        )
        for p, proposer in zip(PROMPTS, proposers)
    ]
    run_until_done(eng, rows)
    assert [drained(r) for r in rows] == [solo(gen, p, 20) for p in PROMPTS[:4]]
    offers = [bid.offer for pass_bids in bids for bid in pass_bids]
    assert offers and all(isinstance(offer, Offer) for offer in offers)  # every row offers: no measured-rate stand-in
    assert any(offer.parts for offer in offers)  # the unions' offers (and auto's drafting arm's) reach the budget
    assert any(r.proposer.stats["draft"]["draft_passes"] for r in rows[::2])  # the drafts' chains were sent
    for r in rows[1::2]:  # auto gave each pass with room for a guess to one arm (the last pass may have none)
        assert (
            r.progress.target_passes - 1 <= sum(r.proposer.stats["passes_by_arm"].values()) <= r.progress.target_passes
        )
    eng.close()


@pytest.mark.parametrize("sampled", [False, True])
def test_speculative_rows_share_batched_draft_passes_and_equal_their_solo_output(artifact, sampled):
    """Seated on the batcher's draft slots, rows of different K (one adapting) draft together: each pass of
    the draft serves several rows, and each row still equals its solo greedy (or seeded sampling) run."""
    from jacobi_rt.runtime.draft import DraftProposer
    from jacobi_rt.runtime.draft_length import DraftLength

    gen = Generator.load(artifact("llama"), draft=artifact("llama-draft1"), graph="inplace", threads=1)
    params = SamplingParams(temperature=0.8, top_k=20, seed=7) if sampled else SamplingParams()
    flat = {1: 1.0, 4096: 1.0}
    budget = PassBudget(costs=PassCosts(CostConfig(flat, learn=False, batch_pass_costs=flat)))

    def draft(k):  # wide passes and draft passes free (as on a GPU): the budget sends every row's chain
        length = DraftLength(PassCosts(CostConfig(flat, learn=False)), DraftConfig(prior_cost=0.0))
        return DraftProposer(gen.draft, 128, DraftConfig(length=k), length=length)

    def batch(slotted):
        eng = Batcher.open(
            gen.backend, 4, prefill_chunk=256, budget=budget, clock=clock(), draft=gen.draft if slotted else None
        )
        rows = [
            eng.submit(
                Row(
                    list(p),
                    16,
                    draft(k),
                    Sampler(params, len(p)),
                    8,
                    set(gen.manifest.tokens.eos_ids),
                    gen.limits.max_context,
                )
            )
            for p, k in zip(PROMPTS, [3, 2, None, 1, 3])
        ]  # 5 rows on 4 slots: the last takes a freed seat
        return eng, rows

    eng, rows = batch(slotted=True)
    served, run_pass = [], eng.drafts.forward
    eng.drafts.forward = lambda windows, logits: served.append(len(windows)) or run_pass(windows, logits)
    run_until_done(eng, rows)
    sampling = dict(temperature=0.8, top_k=20, seed=7) if sampled else {}
    assert [drained(r) for r in rows] == [solo(gen, p, 16, **sampling) for p in PROMPTS]
    assert max(served) >= 3  # the drafts' passes were shared
    assert sorted(eng.drafts.free) == [0, 1, 2, 3]  # every finished row gave its seat back
    eng.close()
    own, own_rows = batch(slotted=False)  # each draft on a context of its own, one pass per row: the same guesses
    assert own.drafts is None
    run_until_done(own, own_rows)
    counts = [(r.proposer.stats["proposed"], r.proposer.stats["accepted"]) for r in rows]
    assert counts == [(r.proposer.stats["proposed"], r.proposer.stats["accepted"]) for r in own_rows]
    assert all(proposed for proposed, _ in counts)
    own.close()
