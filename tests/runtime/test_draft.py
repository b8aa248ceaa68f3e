"""The draft-model proposer: output == greedy token for token, the draft's cache follows the committed
sequence through every rollback, K adapts, and a draft of another vocabulary is refused.

Drafts of the tiny families: a 1-layer draft exported from the same tiny model (`<family>-draft1`,
exported here with torch, or prebuilt under JACOBI_RT_TEST_ARTIFACTS), the target itself (every
guess right) and another tiny family (same tokenizer, unrelated weights: almost every guess wrong).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest
from alone import decode, passes, send
from make_artifacts import FAMILIES

from jacobi_rt.runtime.acceptance import PassCosts, pass_cost
from jacobi_rt.runtime.allocator import allocate
from jacobi_rt.runtime.backends.onnxrt import OrtBackend
from jacobi_rt.runtime.config import CostConfig, DraftConfig
from jacobi_rt.runtime.draft import DraftProposer, check_draft
from jacobi_rt.runtime.draft_length import DraftLength
from jacobi_rt.runtime.errors import ArtifactError, InputError
from jacobi_rt.runtime.manifest import load_manifest
from jacobi_rt.runtime.proposers import NoProposer

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "test-artifacts"
TORCH_FREE = os.environ.get("JACOBI_RT_TORCH_FREE") == "1"
PROMPTS = [[5, 17, 33, 80, 2], [101, 102, 103], list(range(40, 72)), [7]]


# -- fixtures -------------------------------------------------------------------------------------


def _unavailable(message: str) -> None:
    if TORCH_FREE:
        pytest.fail(message + " (JACOBI_RT_TORCH_FREE=1: the runtime tests must not skip)")
    pytest.skip(message)


def _export_tiny(name: str, family: str, retokenize: bool = False) -> Path:
    """A 1-layer draft of the tiny `family` model (with another tokenizer when `retokenize`), cached."""
    prebuilt = os.environ.get("JACOBI_RT_TEST_ARTIFACTS")
    folder = Path(prebuilt) / name if prebuilt else CACHE / name
    try:
        load_manifest(folder, verify=False)
        return folder
    except ArtifactError:
        pass
    try:
        import torch  # noqa: F401
    except ImportError:
        _unavailable(
            f"draft artifact {name!r} not found at {folder}; export it with torch "
            f"(`jacobi-rt export TINY_{family.upper()} --role draft --keep-layers 1 --out {folder}`)"
        )
    from make_artifacts import export_draft

    return export_draft(family, folder, other_vocab=retokenize)


@pytest.fixture(scope="session")
def backend(artifact, graph):
    """backend(name) -> an OrtBackend (1 thread, on `graph`) of a tiny family, a tiny draft
    ("<family>-draft1"), or a real artifact folder path; loaded once per session."""
    loaded: dict[str, OrtBackend] = {}

    def get(name: str) -> OrtBackend:
        if name not in loaded:
            if name.endswith("-draft1"):
                folder = _export_tiny(name, name.removesuffix("-draft1"))
            elif os.sep in name:
                folder = Path(name)
            else:
                folder = artifact(name)
            manifest = load_manifest(folder, verify=False)
            variant = (
                graph if graph in manifest.graphs else "portable"
            )  # a real draft exported before the in-place graph
            loaded[name] = OrtBackend(folder, manifest, "cpu", threads=1, graph=variant)
        return loaded[name]

    return get


class NoisyBackend:
    """The target as its own draft, but each greedy id it returns is replaced with chance 1/3:
    guesses are rejected at random depths, while the cache stays the real model's."""

    def __init__(self, backend: OrtBackend, seed: int = 0):
        self.backend, self.manifest, self.rng = backend, backend.manifest, np.random.default_rng(seed)

    def context(self, capacity: int, batch: int = 1):
        return NoisyContext(self.backend.context(capacity, batch), self)


class NoisyContext:
    def __init__(self, ctx, owner: NoisyBackend):
        self._ctx, self._owner = ctx, owner

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def forward(self, ids, *args, **kwargs):
        out = self._ctx.forward(ids, *args, **kwargs)
        flip = self._owner.rng.random(out.greedy_ids.shape) < 1 / 3
        out.greedy_ids[flip] = (out.greedy_ids[flip] + 1) % self._owner.manifest.architecture.vocab_size
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._ctx.close()


def _draft(backend, family: str, kind: str):
    """The draft of `kind` for a tiny `family` target."""
    if kind == "noisy":
        return NoisyBackend(backend(family))
    return backend(_drafts(family)[kind])


def _drafts(family: str) -> dict[str, str]:
    other = "qwen2" if family != "qwen2" else "llama"
    return {"1-layer": f"{family}-draft1", "self": family, "other": other}


# -- driving the loop ----------------------------------------------------------------------------


def generate(target: OrtBackend, prompt: list[int], new: int, proposer, window: int):
    """(the new tokens, the row's Progress)."""
    with target.context(len(prompt) + new) as ctx:
        row, batches = decode(ctx, prompt, proposer, window, new, max_context=target.manifest.max_context, chunk=16)
    return [t for piece in batches for t in piece], row.progress


def greedy(target: OrtBackend, prompt: list[int], new: int) -> list[int]:
    return generate(target, prompt, new, NoProposer(), 1)[0]


def feed(ctx, tokens: list[int], chunk: int) -> None:
    """Write the KV of `tokens` into `ctx`, `chunk` tokens a pass."""
    for start in range(0, len(tokens), chunk):
        piece = tokens[start : start + chunk]
        ctx.forward(np.array([piece], dtype=np.int64))
        ctx.commit(len(piece))


def assert_draft_cache_follows(proposer: DraftProposer, draft: OrtBackend) -> None:
    """The draft's cache holds exactly the KV of the committed sequence's first ctx.length tokens,
    and at least the last committed token is still to be fed."""
    ctx, tokens = proposer.row.slots.ctx, proposer.tokens  # its own one-row draft slots' context
    ctx = getattr(ctx, "_ctx", ctx)  # a NoisyContext's real one
    assert ctx.pending == 0 and ctx.length <= len(tokens) - 1
    with draft.context(len(tokens)) as fresh:
        if ctx.length:
            feed(fresh, tokens[: ctx.length], chunk=7)
        for layer in range(draft.manifest.architecture.num_layers):
            for kind in ("key", "value"):
                np.testing.assert_allclose(ctx.kv(layer, kind), fresh.kv(layer, kind), rtol=1e-4, atol=1e-4)
        # and the next pass over the pending tokens predicts what a fresh draft predicts
        pending = np.array([tokens[ctx.length :]], dtype=np.int64)
        assert fresh.forward(pending).greedy_ids.tolist() == ctx.forward(pending).greedy_ids.tolist()
        fresh.commit(0)
        ctx.commit(0)


# -- output == greedy -----------------------------------------------------------------------------


# Every target family with a draft whose guesses are partly right (1-layer), all right (self) and wrong at
# random depths, the first one too (noisy: the target's rejections and rollbacks); the unrelated family's
# draft (other: almost every guess wrong) for two targets, one each way (qwen2 drafting for llama, llama
# for qwen2): on the other four its target side repeats noisy's proof and its draft side qwen2's draft.
DRAFT_CASES = [(kind, family) for kind in ("1-layer", "self", "noisy") for family in FAMILIES] + [
    ("other", "llama"),
    ("other", "qwen2"),
]


@pytest.mark.parametrize("kind,family", DRAFT_CASES)
def test_draft_equals_greedy(backend, family, kind):
    target, draft = backend(family), _draft(backend, family, kind)
    for prompt in PROMPTS:
        for new in (1, 9, 40):
            expected = greedy(target, prompt, new)
            for k in (None, 1, 3, 8):
                for jacobi in (False, True):
                    with DraftProposer(draft, len(prompt) + new, DraftConfig(length=k, jacobi_tail=jacobi)) as proposer:
                        ids, progress = generate(target, prompt, new, proposer, 9)
                    assert ids == expected, (family, kind, prompt, new, k, jacobi)
                    assert progress.target_passes <= max(new - 1, 0)


def test_full_acceptance_takes_one_pass_per_k_plus_one_tokens(backend):
    target = backend("llama")
    with DraftProposer(
        target, 64, DraftConfig(length=3)
    ) as proposer:  # the target drafts for itself: every guess right
        ids, progress = generate(target, [5, 17, 33], 41, proposer, 4)
    assert ids == greedy(target, [5, 17, 33], 41)
    assert progress.target_passes == 10  # 1 from the prefill + 10 passes x 4 tokens
    assert proposer.stats["proposed"] == proposer.stats["accepted"] == 30
    assert proposer.stats["draft_passes"] == 30  # one pass per guess; the first also feeds the prompt


def test_budget_caps_the_chain(backend):
    target = backend("llama")
    with DraftProposer(target, 64, DraftConfig(length=8)) as proposer:
        proposer.start([5, 17, 33], greedy(target, [5, 17, 33], 1)[0])
        assert send(proposer, 0) == [] and proposer.stats["draft_passes"] == 0  # nothing asked: no draft work
        assert [len(c) for c in send(proposer, 2)] == [2]


# -- the draft's cache through rollbacks ---------------------------------------------------------


class RandomBudget:
    """A window policy that gives each pass a random room for guesses (0: the draft sits out and catches up
    later) and the draft a random K."""

    def __init__(self, rng: random.Random, proposer: DraftProposer):
        self.rng, self.proposer = rng, proposer

    def next(self) -> int:
        self.proposer.k = self.rng.choice([0, 1, 2, 5, 8])
        return 1 + self.rng.choice([0, 1, 3, 8])

    def observe(self, result) -> None:
        pass


@pytest.mark.parametrize("kind", ["1-layer", "self", "other", "noisy"])
@pytest.mark.parametrize("jacobi", [False, True])
def test_draft_cache_equals_the_committed_sequence_after_every_pass(backend, kind, jacobi):
    """Random budgets (0 included: the draft sits out and catches up later) and random k."""
    rng = random.Random(kind + str(jacobi))
    target, draft = backend("llama"), _draft(backend, "llama", kind)
    for prompt in PROMPTS[:3]:
        expected = greedy(target, prompt, 60)
        config = DraftConfig(length=8, jacobi_tail=jacobi)
        with target.context(len(prompt) + 80) as ctx, DraftProposer(draft, len(prompt) + 80, config) as proposer:
            out = []
            row, batches = passes(ctx, prompt, proposer, RandomBudget(rng, proposer), 60, chunk=16)
            for new in batches:
                out += new
                if row.prefilling:  # a prompt chunk: nothing to check yet
                    continue
                assert proposer.tokens == [*prompt, *out]
                if not row.finished:  # a finished row's proposer is closed with it
                    assert_draft_cache_follows(proposer, target if kind == "noisy" else draft)
        assert out == expected
        if kind == "noisy":
            assert 0 < proposer.stats["accepted"] < proposer.stats["proposed"]


# -- K -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [-1, 9, 2.0, True])
def test_k_out_of_range_is_refused(k):  # 9: past draft.max_length (8)
    with pytest.raises(InputError, match="draft.length"):
        DraftConfig(length=k)


@pytest.mark.parametrize("k_max", [0, -3, 1.5])
def test_k_max_must_be_positive(k_max):
    with pytest.raises(InputError, match="draft.max_length"):
        DraftConfig(max_length=k_max)


def test_k_zero_is_greedy_with_no_draft_pass(backend):
    target = backend("llama")
    with DraftProposer(target, 64, DraftConfig(length=0)) as proposer:
        ids, progress = generate(target, [5, 17, 33], 20, proposer, 9)
    assert ids == greedy(target, [5, 17, 33], 20) and progress.target_passes == 19
    assert proposer.stats["draft_passes"] == 0 and proposer.stats["proposed"] == 0  # never asked: never run


def choose(length: DraftLength, limit: int) -> int:
    """K for one pass: the draft's offer (a probe after probe_every - 1 passes without it) cut by the allocator."""
    picks = allocate(length.offer(limit), limit, length.costs).picks
    k = picks[0][1] if picks else 0
    length.sent(k)
    return k


def test_length_grows_with_acceptance_and_cheap_drafts():
    length = DraftLength()
    length.draft_seconds, length.costs.seconds = 0.1, {(1, 1): 1.0}
    for _ in range(40):
        length.observe_acceptance(8, 8)
    assert length.p > 0.95 and choose(length, 8) == 8
    assert choose(length, 3) == 3  # never past the budget


def test_length_is_zero_when_the_draft_does_not_pay_then_probes():
    length = DraftLength(config=DraftConfig(probe_every=5))
    length.draft_seconds, length.costs.seconds = 1.0, {(1, 1): 1.0}  # the draft costs a target pass
    for _ in range(40):
        length.observe_acceptance(4, 1)
    choices = [choose(length, 8) for _ in range(10)]
    assert choices.count(0) == 8 and all(c >= 1 for i, c in enumerate(choices) if i % 5 == 4)


def test_length_follows_measured_costs():
    length = DraftLength()
    for _ in range(40):
        length.observe_acceptance(8, 6)
    length.costs.observe(1, 0.030)
    length.costs.observe(5, 0.030 * pass_cost(5))
    assert length.costs.unit_seconds() == pytest.approx(0.030, rel=1e-3)
    length.observe_draft(0.003)
    cheap = choose(length, 8)
    length.draft_seconds = 0.020
    assert 1 <= choose(length, 8) < cheap


def test_length_keeps_the_prior_cost_when_target_passes_time_as_zero():
    """A clock too coarse to time a target pass (0 s measured) leaves the draft's cost at its prior,
    instead of dividing by zero."""
    length = DraftLength(config=DraftConfig(prior_cost=0.4))
    length.costs.observe(1, 0.0)
    length.observe_draft(0.002)
    assert length.relative_cost == 0.4
    assert choose(length, 8) >= 0


def test_adaptive_proposer_stops_drafting_when_the_draft_is_as_slow_as_the_target(backend):
    """A draft pass that costs a target pass (pinned: on a loaded machine a measured cost curve can make
    wide passes look free, and then even rare hits pay) and guesses that are wrong: mostly greedy passes."""
    target = backend("llama")
    length = DraftLength(
        PassCosts(CostConfig(learn=False)), DraftConfig(prior_cost=1.0)
    )  # no measured costs: the priors decide
    with DraftProposer(backend("qwen2"), 200, length=length) as proposer:  # unrelated weights: guesses are wrong
        generate(target, [5, 17, 33], 120, proposer, 9)
    assert proposer.stats["proposed"] < 40  # mostly greedy passes, with a probe now and then


# -- vocabulary check ----------------------------------------------------------------------------


def test_check_draft_accepts_a_draft_of_the_same_vocabulary(backend):
    check_draft(backend("llama").manifest, backend("qwen2").manifest)
    check_draft(backend("llama").manifest, backend("llama").manifest)


def test_check_draft_refuses_another_vocabulary_manifest(backend):
    target = backend("llama").manifest
    draft = dataclasses.replace(target, tokenizer={**target.tokenizer, "vocab_sha256": "0" * 64})
    with pytest.raises(InputError, match="different vocabulary .* same tokenizer"):
        check_draft(target, draft, "T", "D")
    arch = dataclasses.replace(target.architecture, vocab_size=target.architecture.vocab_size + 64)
    with pytest.raises(InputError, match="output ids"):
        check_draft(target, dataclasses.replace(target, architecture=arch))
    with pytest.raises(InputError, match="exported as a draft"):
        check_draft(dataclasses.replace(target, role="draft"), target)
    with pytest.raises(ArtifactError, match="vocab_sha256"):
        check_draft(target, dataclasses.replace(target, tokenizer={}))


def test_check_draft_refuses_a_draft_exported_with_another_tokenizer():
    folder = _export_tiny("llama-othervocab-draft1", "llama", retokenize=True)
    target_folder = (
        CACHE / "llama"
        if not os.environ.get("JACOBI_RT_TEST_ARTIFACTS")
        else Path(os.environ["JACOBI_RT_TEST_ARTIFACTS"]) / "llama"
    )
    with pytest.raises(
        InputError, match=re.escape(f"draft {folder} has a different vocabulary from target {target_folder}")
    ):
        check_draft(
            load_manifest(target_folder, verify=False),
            load_manifest(folder, verify=False),
            str(target_folder),
            str(folder),
        )


# -- SmolLM2 with real drafts ---------------------------------------------------------------------


SMOL_DRAFTS = ["smollm2-135m-int8", "smollm2-135m-draft6"]
SMOL_PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nTell me a short story about a robot who learns to paint.<|im_end|>\n<|im_start|>assistant\n",
]


def _smol_draft(name: str) -> Path:
    prebuilt = os.environ.get("JACOBI_RT_TEST_ARTIFACTS")
    folder = Path(prebuilt) / name if prebuilt else REPO / "build" / name
    try:
        load_manifest(folder, verify=False)
    except ArtifactError:
        _unavailable(
            f"{name} not found at {folder}; export it with `python tests/make_artifacts.py DIR --smollm2` "
            "or `jacobi-rt export smollm2-135m --role draft "
            + ("--quantize int8" if "int8" in name else "--keep-layers 6")
            + f" --out {folder}`"
        )
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("name", SMOL_DRAFTS)
def test_smollm2_with_a_draft_equals_greedy(artifact, name):
    from jacobi_rt.runtime.tokenizer import Tokenizer

    folder = artifact("smollm2-135m")
    manifest = load_manifest(folder, verify=False)
    draft_folder = _smol_draft(name)
    draft_manifest = load_manifest(draft_folder, verify=False)
    check_draft(manifest, draft_manifest)
    target = OrtBackend(folder, manifest, "cpu")
    draft = OrtBackend(draft_folder, draft_manifest, "cpu")
    tokenizer = Tokenizer(folder, manifest)
    for text, (k, jacobi) in zip(SMOL_PROMPTS, [(None, False), (4, True), (None, True)]):
        prompt = tokenizer.encode(text, add_special_tokens=False)
        expected = greedy(target, prompt, 48)
        with DraftProposer(draft, len(prompt) + 48, DraftConfig(length=k, jacobi_tail=jacobi)) as proposer:
            ids, progress = generate(target, prompt, 48, proposer, 9)
        assert ids == expected, (name, text, k, jacobi)
        # 96% agreement: a fixed K must cut the target's passes. A learned K is timed and may rightly
        # stop drafting, since on a CPU the int8 draft's pass costs about as much as the target's.
        if "int8" in name and k is not None:
            assert progress.target_passes < 47 * 0.7, proposer.stats
    from jacobi_rt.runtime import Generator

    gen = Generator.load(folder, draft=draft_folder, verify=False)
    expected = gen.generate(SMOL_PROMPTS[1], max_new_tokens=48, strategy="greedy").ids
    for strategy in ("speculative", "auto"):
        assert gen.generate(SMOL_PROMPTS[1], max_new_tokens=48, strategy=strategy).ids == expected, (name, strategy)


# -- through the Generator ------------------------------------------------------------------------


def test_generator_speculative_and_auto_with_a_draft_equal_greedy(artifact):
    from jacobi_rt.runtime import Generator

    gen = Generator.load(artifact("qwen2"), draft=_export_tiny("qwen2-draft1", "qwen2"))
    for prompt in ("The quick brown fox", "def add(a, b):"):
        greedy = gen.generate(prompt, max_new_tokens=40, strategy="greedy")
        for strategy in ("speculative", "auto"):
            result = gen.generate(prompt, max_new_tokens=40, strategy=strategy)
            assert result.ids == greedy.ids, (prompt, strategy)
            stats = (
                result.stats.proposer if strategy == "speculative" else result.stats.proposer["arms"]["draft"]["draft"]
            )
            benched = strategy == "auto" and result.stats.proposer["sat_out"] == ["draft"]  # lost an earlier call
            assert (stats["draft_passes"] == 0) if benched else (stats["draft_passes"] >= 1)


def test_generator_refuses_a_draft_with_another_vocabulary(artifact):
    from jacobi_rt.runtime import Generator

    draft = _export_tiny("llama-othervocab-draft1", "llama", retokenize=True)
    with pytest.raises(InputError, match="different vocabulary"):
        Generator.load(artifact("llama"), draft=draft)


def test_generator_refuses_a_missing_or_corrupt_draft(artifact, tmp_path):
    import shutil

    from jacobi_rt.runtime import Generator

    with pytest.raises(ArtifactError, match="does not exist"):
        Generator.load(artifact("llama"), draft=tmp_path / "nowhere")
    broken = tmp_path / "draft"
    shutil.copytree(_export_tiny("llama-draft1", "llama"), broken)
    (broken / "model.onnx").write_bytes(b"not an onnx graph")
    with pytest.raises(ArtifactError, match="changed after export"):
        Generator.load(artifact("llama"), draft=broken)


def test_speculative_without_a_draft_is_a_clear_error(artifact):
    from jacobi_rt.runtime import Generator

    gen = Generator.load(artifact("llama"))
    with pytest.raises(InputError, match="needs a draft model"):
        gen.generate("The quick", max_new_tokens=4, strategy="speculative")
    assert gen.generate("The quick", max_new_tokens=4, strategy="greedy").ids  # still usable


def test_jacobi_tail_is_an_option_of_generate_stream_and_start(artifact):
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.generator import DEFAULT_JACOBI_TAIL

    gen = Generator.load(artifact("llama"), draft=_export_tiny("llama-draft1", "llama"))
    prompt = "The quick brown fox"
    greedy = gen.generate(prompt, max_new_tokens=30, strategy="greedy")
    for tail in (True, False, None):
        result = gen.generate(prompt, max_new_tokens=30, strategy="speculative", jacobi_tail=tail)
        assert result.ids == greedy.ids
        assert result.stats.proposer["jacobi_tail"] is (DEFAULT_JACOBI_TAIL if tail is None else tail)
        assert "".join(gen.stream(prompt, max_new_tokens=30, strategy="speculative", jacobi_tail=tail)) == greedy.text
        stream = gen.start(prompt, max_new_tokens=30, strategy="auto", jacobi_tail=tail)
        assert "".join(stream) == greedy.text
    for strategy, tail in (("lookahead", True), ("greedy", False), ("speculative", "yes")):
        with pytest.raises(InputError, match="jacobi_tail"):
            gen.generate(prompt, max_new_tokens=4, strategy=strategy, jacobi_tail=tail)


def test_a_chain_after_a_forced_run_continues_it(backend):
    """Told the tokens a pass sends first (a grammar's forced run), the draft runs them in its first pass and
    its chain continues them; after the pass its cache holds what the target committed, and only its own
    tokens count as its guesses."""
    from jacobi_rt.runtime.allocator import Allocation, produced, sent_guesses
    from jacobi_rt.runtime.draft import produce
    from jacobi_rt.runtime.passes import pass_result
    from jacobi_rt.runtime.tree import build_tree

    target = backend("llama")
    prompt = [5, 17, 33]
    expected = greedy(target, prompt, 12)
    with DraftProposer(
        target, 64, DraftConfig(length=4)
    ) as proposer:  # the target drafts for itself: its chain is greedy's
        proposer.start(prompt, expected[0])
        run = expected[1:3]
        assert proposer.offer(8, after=run).guesses[0].accept == (proposer.length.p,) * 4
        offer = proposer.offer(8, after=run)
        sent = Allocation([(0, 4)])
        produce(produced(offer, sent))
        (chain,) = sent_guesses(offer, sent)
        assert chain == expected[3:7] and proposer.stats["draft_passes"] == 4  # the run cost no pass of its own
        tree = build_tree(expected[0], [run + chain])
        predictions = expected[1:8]  # the target's pick after each node of the chain
        proposer.observe(pass_result(tree, predictions, tree.accept(predictions), 0.01, sent=sent))
        assert proposer.tokens == [*prompt, *expected[:8]] and proposer.stats["accepted"] == 4
        assert_draft_cache_follows(proposer, target)
