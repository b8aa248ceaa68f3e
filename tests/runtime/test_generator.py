"""Generator: bad requests are clear errors (and the Generator stays usable), streaming, chat, threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from text_helpers import clean_substring

from jacobi_rt.runtime import ContextLimitError, InputError


@pytest.fixture(scope="module")
def gen(generator):
    return generator("llama")


BAD_REQUESTS = [
    (dict(prompt=""), InputError, "empty"),
    (dict(prompt=[]), InputError, "empty"),
    (dict(prompt=None), InputError, "prompt"),
    (dict(prompt=[1, 2, 384]), InputError, "outside this model's vocabulary"),
    (dict(prompt=[1, -1]), InputError, "outside this model's vocabulary"),
    (dict(prompt=[1, 2**70]), InputError, f"token id {2**70} is outside"),  # numpy holds it as an object
    (dict(prompt=[1.5, 2.0]), InputError, "integers"),
    (dict(prompt=[[1, 2]]), InputError, "flat"),
    (dict(prompt=[3] * 256), ContextLimitError, "context holds 256"),
    (dict(messages=[{"role": "user", "content": "fox " * 300}]), ContextLimitError, "context holds 256"),
    (dict(prompt="fox " * 300, chat=True), ContextLimitError, "context holds 256"),
    (dict(prompt="hi", max_new_tokens=0), InputError, "max_new_tokens"),
    (dict(prompt="hi", max_new_tokens=-3), InputError, "max_new_tokens"),
    (dict(prompt="hi", window=0), InputError, "window"),
    (dict(prompt="hi", window=65), InputError, "window"),
    (dict(prompt="hi", strategy="greedy", window=4), InputError, "window of 1"),
    (dict(prompt="hi", strategy="beam"), InputError, "strategy"),
    (dict(prompt="hi", stop=[""]), InputError, "stop"),
    (dict(messages=[{"content": "no role"}]), InputError, "role"),
    (dict(messages=[]), InputError, "non-empty"),
]


@pytest.mark.parametrize("kwargs, error, match", BAD_REQUESTS)
def test_bad_request_is_a_clear_error_and_the_generator_survives(gen, kwargs, error, match):
    with pytest.raises(error, match=match):
        gen.generate(**kwargs)
    with pytest.raises(error, match=match):
        gen.stream(**kwargs)  # checked when called, before the first piece
    assert len(gen.generate("The quick", max_new_tokens=3).ids) == 3


def test_longest_prompt_that_fits_gives_one_token(gen):
    result = gen.generate([3] * 255, max_new_tokens=10)
    assert len(result.ids) == 1 and result.stats.finish_reason == "context"


def test_text_and_ids_prompts_agree(gen):
    ids = gen.tokenizer.encode("Jacobi decoding guesses")
    assert gen.generate("Jacobi decoding guesses", 12).ids == gen.generate(ids, 12).ids


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3"])
def test_stream_joins_to_generate(generator, family):
    gen = generator(family)
    for prompt in ("unicode: café, naïve, 東京, 🙂.", "The quick brown fox", "東京 🙂"):
        for strategy in ("greedy", "jacobi"):
            full = gen.generate(prompt, max_new_tokens=48, strategy=strategy)
            pieces = list(gen.stream(prompt, max_new_tokens=48, strategy=strategy))
            assert "".join(pieces) == full.text
            # an incomplete character at the very end is dropped, not written as U+FFFD
            assert full.text == gen.tokenizer.decode(full.ids).rstrip("\ufffd")


def test_a_text_stream_shows_the_tokens_committed_up_to_each_piece(gen):
    """TextStream.committed: after each piece, the ids committed so far (and their logprobs, when asked for),
    growing with the pieces and ending as the result's (the server's per-chunk logprobs read it)."""
    stream = gen.start("The quick brown fox", max_new_tokens=12, strategy="jacobi", temperature=0.8, seed=3, logprobs=2)
    seen = []
    for _piece in stream.steps():
        seen.append(len(stream.committed.ids))
        assert len(stream.committed.logprobs) >= seen[-1]
    assert seen == sorted(seen) and seen[-1] == len(stream.result.ids) and len(set(seen)) > 2
    assert stream.committed.ids == stream.result.ids
    assert stream.committed.logprobs[: len(stream.result.ids)] == stream.result.logprobs


def test_detokenizer_holds_back_split_characters(gen):
    from jacobi_rt.runtime.tokenizer import Detokenizer

    text = "café 東京 🙂 naïve"
    ids = gen.tokenizer.encode(text)
    pieces = []
    detok = Detokenizer(gen.tokenizer)
    for token in ids:
        pieces.append(detok.add(token))
    pieces.append(detok.flush())
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    singles = [gen.tokenizer.decode([t]) for t in ids]
    assert any("\ufffd" in s for s in singles), "the test text should split a character across tokens"


def test_stream_with_stop_matches_generate(gen):
    free = gen.generate("The quick brown fox", max_new_tokens=40, strategy="greedy").text
    stop = clean_substring(free, start=10)
    assert "".join(gen.stream("The quick brown fox", max_new_tokens=40, stop=stop)) == free[: free.index(stop)]


def test_chat_prompt_renders_the_template(gen):
    rendered = gen.chat_prompt([{"role": "user", "content": "Hi"}])
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    a = gen.generate(messages=[{"role": "user", "content": "Hi"}], max_new_tokens=8)
    b = gen.generate("Hi", chat=True, max_new_tokens=8)
    c = gen.generate(gen.tokenizer.encode(rendered, add_special_tokens=False), max_new_tokens=8)
    assert a.ids == b.ids == c.ids
    assert a.stats.prompt_tokens == len(gen.tokenizer.encode(rendered, add_special_tokens=False))


def test_stats_are_filled(gen):
    s = gen.generate("The quick brown fox", max_new_tokens=30, strategy="jacobi", window=4).stats
    assert s.strategy == "jacobi" and s.window == 4 and s.new_tokens == 30
    assert s.target_passes >= 1 and s.tokens_per_pass >= 1.0
    assert 0 < s.session_seconds <= s.wall_seconds and 0 <= s.overhead_share < 1


def test_concurrent_generate_equals_sequential(gen):
    jobs = [
        (p, s, n) for p in ("The quick", "def add(a, b):", "café 東京") for s in ("greedy", "jacobi") for n in (17, 33)
    ]
    sequential = [gen.generate(p, max_new_tokens=n, strategy=s).ids for p, s, n in jobs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(
            pool.map(lambda job: gen.generate(job[0], max_new_tokens=job[2], strategy=job[1]).ids, jobs * 2)
        )
    assert threaded == sequential * 2


def test_a_backend_without_branches_gets_one_chain_proposers(artifact, monkeypatch):
    """BackendLimits.branches False (int8-activation artifacts): lookahead sends one n-gram chain and
    auto's draft arm drops its extra lookahead branch, so no pass holds a side branch."""
    import dataclasses

    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.backends.base import Backend
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend
    from jacobi_rt.runtime.proposers import UnionProposer

    monkeypatch.setattr(
        OrtBackend, "limits", property(lambda self: dataclasses.replace(Backend.limits.fget(self), branches=False))
    )
    generator = Generator.load(artifact("llama"), draft=artifact("llama-draft1"))
    from jacobi_rt.runtime.params import GenerationParams

    request = generator._request("the fox", None, False, GenerationParams(8, "lookahead"))
    with generator._proposer(request, 64) as lookahead:
        assert lookahead.branches == 1
    with generator._proposer(dataclasses.replace(request, strategy="auto"), 64) as auto:
        arms = auto.parts
        assert arms["lookahead"].branches == 1 and not isinstance(arms["draft"], UnionProposer)
    greedy = generator.generate("the fox", max_new_tokens=16, strategy="greedy").ids
    assert generator.generate("the fox", max_new_tokens=16, strategy="auto").ids == greedy


# -- the decoding config ----------------------------------------------------------------------------


def test_a_calls_config_tunes_its_proposer_and_the_output_stays_greedy(gen):
    from jacobi_rt.runtime.config import DecodingConfig

    prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox"
    greedy = gen.generate(prompt, max_new_tokens=40, strategy="greedy").ids
    for config in (
        {"lookahead": {"branches": 1, "margin": 0.0}},
        {"costs.pass_costs": [[1, 1.0], [64, 1.0]]},
        DecodingConfig(window=4),
        {"jacobi.window": 4},
    ):
        for strategy in ("jacobi", "lookahead"):
            assert gen.generate(prompt, max_new_tokens=40, strategy=strategy, config=config).ids == greedy, (
                config,
                strategy,
            )
    assert gen.generate(prompt, max_new_tokens=8, strategy="jacobi", config={"jacobi": {"window": 4}}).stats.window == 4
    fixed = gen.generate(prompt, max_new_tokens=8, strategy="jacobi", config={"window": 4}).stats
    assert fixed.window == 4 and not fixed.adaptive  # a window, from the argument or the config, is fixed
    assert (
        gen.generate(prompt, max_new_tokens=8, strategy="lookahead", window=2, config={"window": 4}).stats.window == 2
    )


def test_a_generators_config_is_its_callers_default(artifact):
    from jacobi_rt.runtime import Generator

    tuned = Generator.load(
        artifact("llama"), verify=False, config={"window": 4, "lookahead": {"branches": 1}}, prefill_chunk=8
    )
    assert (
        tuned.config.lookahead.branches == 1
        and tuned.config.batch.prefill_chunk == 8
        and tuned.limits.prefill_chunk == 8
    )
    result = tuned.generate("hello there", max_new_tokens=6, strategy="lookahead")
    assert result.stats.window == 4 and result.stats.prefill_passes == 1
    assert (
        tuned.generate("hello there", max_new_tokens=6, strategy="greedy").stats.window == 1
    )  # its window is not an error
    with pytest.raises(InputError, match="unknown decoding config field"):
        Generator.load(artifact("llama"), verify=False, config={"branchez": 1})


@pytest.mark.parametrize(
    "config, message",
    [
        ({"batch": {"prefill_chunk": 8}}, "set where the generator is loaded"),
        ({"lookahead.branches": 0}, "lookahead.branches must be from 1 to 16"),
        ({"window": 0}, "window must be from 1 to 64"),
        ("lookahead.branches=1", "config must be a DecodingConfig or a mapping"),
    ],
)
def test_a_bad_config_is_refused_before_anything_runs(gen, config, message):
    with pytest.raises(InputError, match=message):
        gen.start("hi", strategy="lookahead", config=config)
