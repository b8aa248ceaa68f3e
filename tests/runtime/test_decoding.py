"""The decoding loop: accept rule, proposer, and Jacobi == greedy token for token on every tiny family."""

from __future__ import annotations

import pytest
from alone import decode, propose, send, tokens
from make_artifacts import FAMILIES
from text_helpers import clean_substring

from jacobi_rt.runtime.allocator import Guess, Offer
from jacobi_rt.runtime.config import DraftConfig, JacobiConfig
from jacobi_rt.runtime.passes import pass_result
from jacobi_rt.runtime.proposers import JacobiProposer, NoProposer, Proposer
from jacobi_rt.runtime.tree import build_tree

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):",
    "Numbers 0 1 2 3",
    "unicode: café, naïve, 東京, 🙂.",
]


@pytest.mark.parametrize(
    "guesses, predictions, n",
    [
        ([], [7], 1),  # greedy: the window is the last token alone
        ([5, 6, 7], [9, 6, 7, 8], 1),  # first guess wrong: only the prediction after `last`
        ([5, 6, 7], [5, 6, 1, 2], 3),  # two right guesses + the prediction after them
        ([5, 6, 7], [5, 6, 7, 8], 4),  # all right: W tokens
    ],
)
def test_accept(guesses, predictions, n):
    verdict = build_tree(3, [guesses] if guesses else []).accept(predictions)
    assert verdict.committed == predictions[:n] and verdict.keep == list(range(n)) and verdict.contiguous


def test_jacobi_proposer_uses_predictions_past_the_accepted_point():
    p = JacobiProposer()
    p.start([1, 2, 3], first=4)
    guesses, sent = propose(p, 3)
    assert guesses == [[4, 4, 4]]  # nothing known yet: repeat the last token
    tree = build_tree(4, [[4, 4, 4]])
    predictions = [4, 11, 12, 13]  # one right guess: commits 4, 11
    p.observe(pass_result(tree, predictions, tree.accept(predictions), 0.01, sent=sent))
    assert send(p, 3) == [[12, 13, 13]]  # predictions[2:], padded with its last entry


def test_jacobi_offers_its_whole_window_with_the_trajectorys_measured_acceptance():
    p = JacobiProposer()
    p.start([1, 2, 3], first=4)
    prior = p.offer(3).guesses[0].accept[0]
    for wrong in range(100, 104):
        (chain,), sent = propose(p, 3)
        tree = build_tree(p.last, [chain])
        predictions = [wrong] * len(tree.tokens)  # a new token every pass: every guess wrong
        p.observe(pass_result(tree, predictions, tree.accept(predictions), 0.01, sent=sent))
    offer = p.offer(3)
    assert offer.fixed and len(offer.guesses[0].tokens) == 3  # its policy chose the window: sent whole
    assert offer.guesses[0].accept[0] < prior / 2  # wrong trajectories lower the estimate the engine weighs


@pytest.mark.parametrize("family", FAMILIES)
def test_jacobi_equals_greedy(generator, family):
    gen = generator(family)
    for prompt in PROMPTS:
        for new in (1, 7, 40):
            greedy = gen.generate(prompt, max_new_tokens=new, strategy="greedy")
            assert greedy.stats.tokens_per_pass in (0.0, 1.0)
            for window in (2, 4, 8, 16):
                jacobi = gen.generate(prompt, max_new_tokens=new, strategy="jacobi", window=window)
                assert jacobi.ids == greedy.ids, (family, prompt, new, window)
                assert jacobi.text == greedy.text
                assert len(jacobi.ids) <= new


def test_window_one_jacobi_is_greedy(generator):
    gen = generator("llama")
    assert gen.generate("The quick", 20, window=1).ids == gen.generate("The quick", 20, strategy="greedy").ids


def test_max_new_tokens_is_exact_even_when_a_window_accepts_more(generator):
    gen = generator("llama")
    for new in (1, 2, 3, 5, 9, 17):
        result = gen.generate([5] * 3, max_new_tokens=new, window=16)
        assert len(result.ids) == new and result.stats.finish_reason == "length"


def test_eos_inside_an_accepted_run_ends_there(artifact):
    from jacobi_rt.runtime import Generator

    gen = Generator.load(artifact("llama"))
    free = gen.generate("Jacobi decoding", max_new_tokens=40, strategy="greedy").ids
    stop_token = free[len(free) // 2]
    first = free.index(stop_token)
    gen.manifest.tokens.eos_ids = [stop_token]  # this Generator's own manifest copy
    for strategy, window in (("greedy", None), ("jacobi", 4), ("jacobi", 16)):
        result = gen.generate("Jacobi decoding", max_new_tokens=40, strategy=strategy, window=window)
        assert result.ids == free[: first + 1], strategy
        assert result.stats.finish_reason == "eos"


def test_generation_ends_at_the_context_limit(generator):
    gen = generator("llama")
    limit = gen.manifest.max_context
    prompt = [7] * (limit - 5)
    greedy = gen.generate(prompt, max_new_tokens=50, strategy="greedy")
    jacobi = gen.generate(prompt, max_new_tokens=50, window=8)
    assert len(greedy.ids) == 5 and greedy.stats.finish_reason == "context"
    assert jacobi.ids == greedy.ids and jacobi.stats.finish_reason == "context"


def test_long_prompt_is_prefilled_in_chunks(artifact):
    from jacobi_rt.runtime import Generator

    whole = Generator.load(artifact("qwen2"), prefill_chunk=512)
    chunked = Generator.load(artifact("qwen2"), prefill_chunk=16)
    prompt = list(range(3, 203))
    a = whole.generate(prompt, max_new_tokens=20, strategy="greedy")
    b = chunked.generate(prompt, max_new_tokens=20, window=4)
    assert b.stats.prefill_passes == 13 and a.ids == b.ids


def test_stop_string_cuts_text_and_ids(generator):
    gen = generator("llama")
    free = gen.generate("The quick brown fox", max_new_tokens=40, strategy="greedy")
    stop = clean_substring(free.text, start=8)
    cut = free.text.index(stop)
    for window in (None, 4):
        result = gen.generate("The quick brown fox", max_new_tokens=40, window=window, stop=[stop, "never appears"])
        assert result.text == free.text[:cut]
        assert result.stats.finish_reason == "stop"
        # ids end with the token that completed the stop string
        assert result.ids == free.ids[: len(result.ids)]
        assert stop in gen.tokenizer.decode(result.ids) and stop not in gen.tokenizer.decode(result.ids[:-1])


def _chain_result(window: int, committed: int, seconds: float):
    """A PassResult of a chain of `window` tokens of which the first committed-1 guesses were right."""
    tree = build_tree(0, [list(range(1, window))])
    predictions = [*range(1, committed), 99, *[98] * window][:window]
    return pass_result(tree, predictions, tree.accept(predictions), seconds)


def test_adaptive_window_settles_on_the_faster_arm():
    from jacobi_rt.runtime.windows import AdaptiveWindow

    policy = AdaptiveWindow(8, JacobiConfig(probe_every=10, smoothing=0.25))
    chosen = []
    for _ in range(40):
        w = policy.next()
        chosen.append(w)
        # greedy: 1 token in 10 ms; jacobi: 1.2 tokens in 14 ms -> greedy is faster
        policy.observe(_chain_result(w, 1 if w == 1 else 2 if len(chosen) % 5 == 0 else 1, 0.010 if w == 1 else 0.014))
    assert chosen[:2] == [8, 1]
    assert chosen[2:].count(1) > 30 and 8 in chosen[10:]  # mostly greedy, still probing


def test_adaptive_jacobi_equals_greedy(generator):
    gen = generator("mistral")
    for prompt in PROMPTS:
        adaptive = gen.generate(prompt, max_new_tokens=80, strategy="jacobi")
        assert adaptive.stats.adaptive and adaptive.stats.window == 8
        assert adaptive.ids == gen.generate(prompt, max_new_tokens=80, strategy="greedy").ids


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("strategy", ["lookahead", "auto"])
def test_guessing_strategies_equal_greedy(generator, family, strategy):
    gen = generator(family)
    for prompt in PROMPTS + ["The quick brown fox jumps over the lazy dog. The quick brown fox"]:
        greedy = gen.generate(prompt, max_new_tokens=60, strategy="greedy")
        for window in (None, 4, 16):
            result = gen.generate(prompt, max_new_tokens=60, strategy=strategy, window=window)
            assert result.ids == greedy.ids, (family, strategy, prompt, window)


class BranchOracle(Proposer):
    """Proposes two branches each pass: a wrong one first, then the true continuation (known in
    advance), so the accepted branch is never the window's prefix and its KV must be gathered."""

    def __init__(self, truth: list[int]):
        super().__init__()
        self.truth, self.done, self.gathers = truth, 0, 0

    def start(self, prompt, first):
        self.done = 1

    def offer(self, limit, after=()):
        right = self.truth[self.done : self.done + 3]
        wrong = [(t + 1) % 300 for t in right]
        self.offered = [wrong, right] if right else []
        return Offer(tuple(Guess((1.0,) * len(g), tuple(g)) for g in self.offered), fixed=True)

    def observe(self, result):
        self.gathers += not result.verdict.contiguous
        self.done += len(result.committed)


@pytest.mark.parametrize("family", FAMILIES)
def test_side_branch_accepted_commits_its_kv_and_output_stays_greedy(artifact, family, graph):
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend
    from jacobi_rt.runtime.manifest import load_manifest

    path = artifact(family)
    manifest = load_manifest(path)
    prompt = [5, 17, 42, 8, 99, 23]
    with OrtBackend(path, manifest, "cpu", 1, graph=graph) as backend:

        def run(proposer, window):
            with backend.context(64) as ctx:
                return tokens(ctx, prompt, proposer, window, 40)

        truth = run(NoProposer(), 1)
        oracle = BranchOracle(truth)
        assert run(oracle, 8) == truth
        assert oracle.gathers >= 5  # the side branch really was accepted, pass after pass


def test_auto_with_a_history_equals_greedy_and_reports_what_sat_out(artifact):
    from jacobi_rt.runtime import Generator

    gen = Generator.load(artifact("llama"), draft=artifact("llama-draft1"), verify=False)
    prompt = [5, 17, 42, 8, 99, 23, 5, 17, 42]
    expected = gen.generate(prompt, max_new_tokens=30, strategy="greedy").ids
    for _ in range(6):
        benched = gen.arm_history.sit_out.get("draft", 0) > 0  # what the record says before the call
        result = gen.generate(prompt, max_new_tokens=30, strategy="auto")
        assert result.ids == expected
        assert (result.stats.proposer["sat_out"] == ["draft"]) == benched
        if benched:
            assert result.stats.proposer["passes_by_arm"]["draft"] == 0
            assert result.stats.proposer["arms"]["draft"]["draft"]["draft_passes"] == 0


def test_auto_with_a_draft_and_lookahead_in_one_arm_equals_greedy_on_every_family(artifact):
    from jacobi_rt.runtime import Generator

    for family in ("llama", "qwen2", "gpt2"):
        gen = Generator.load(artifact(family), draft=artifact(f"{family}-draft1"), verify=False)
        for prompt in ([5, 17, 42, 8, 99, 23, 5, 17, 42, 8], "The quick brown fox jumps over the lazy dog. The quick"):
            expected = gen.generate(prompt, max_new_tokens=40, strategy="greedy").ids
            for _ in range(3):
                result = gen.generate(prompt, max_new_tokens=40, strategy="auto")
                assert result.ids == expected, (family, prompt)
                assert set(result.stats.proposer["arms"]["draft"]) == {"draft", "lookahead"}


def test_tokens_after_an_eos_are_not_counted_as_accepted(artifact):
    """A pass that commits past an EOS keeps only the tokens up to it; tokens_per_pass counts what was kept."""
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend
    from jacobi_rt.runtime.draft import DraftProposer
    from jacobi_rt.runtime.manifest import load_manifest

    folder = artifact("llama")
    backend = OrtBackend(folder, load_manifest(folder), "cpu", threads=1)
    prompt = [5, 17, 33]
    with backend.context(64) as ctx:
        free = tokens(ctx, prompt, NoProposer(), 1, 40, chunk=16)
    # an EOS in the middle of the first 9-token pass (the target drafts for itself: every guess is right)
    cut = next(i for i in range(2, 8) if free.index(free[i]) == i)
    with backend.context(64) as ctx, DraftProposer(backend, 64, DraftConfig(length=8)) as proposer:
        row, batches = decode(ctx, prompt, proposer, 9, 40, eos={free[cut]}, chunk=16)
    ids, progress = [t for b in batches for t in b], row.progress
    assert ids == free[: cut + 1] and progress.finish_reason == "eos"
    assert progress.target_passes == 1
    assert progress.accepted == len(ids) - 1  # not the 9 tokens the pass committed


def test_a_chunked_prefill_hands_back_control_after_every_pass(artifact, graph):
    """run_alone() yields [] after each prefill chunk but the last, so a caller (the server's worker) can
    stop a long prefill within one pass; the tokens are the same as with a one-chunk prefill."""
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend
    from jacobi_rt.runtime.manifest import load_manifest

    path = artifact("llama")
    prompt = [5, 17, 42, 8, 99, 23, 7, 64, 3, 11]  # 10 tokens: chunks of 4, 4 and 2
    with OrtBackend(path, load_manifest(path), "cpu", 1, graph=graph) as backend:

        def batches(chunk):
            with backend.context(64) as ctx:
                return decode(ctx, prompt, NoProposer(), 1, 5, chunk=chunk)[1]

        chunked, whole = batches(4), batches(256)
    assert chunked[:2] == [[], []] and all(chunked[2:]) and all(whole)
    assert [t for b in chunked for t in b] == [t for b in whole for t in b]
