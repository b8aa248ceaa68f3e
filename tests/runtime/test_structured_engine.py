"""Structured output through the one batcher (runtime/batcher.py's Row with a Matcher): every strategy gives
one-token constrained decoding's tokens (tests/constrained.py, the oracle), greedy and seeded; constrained
and free rows share passes and each equals its solo run; bad constraints fail before any work."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llguidance", reason="structured output needs llguidance: pip install '.[structured]'")

from constrained import constrained_decode  # noqa: E402

from benchmarks.extraction import extraction_set  # noqa: E402
from jacobi_rt.runtime import Generator  # noqa: E402
from jacobi_rt.runtime.constraints import Constraint  # noqa: E402
from jacobi_rt.runtime.errors import InputError  # noqa: E402
from jacobi_rt.runtime.params import GenerationParams  # noqa: E402
from jacobi_rt.runtime.sampling import SamplingParams  # noqa: E402

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "count", "kind", "tags"],
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "count": {"type": "integer", "maximum": 999},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
}
CONSTRAINTS = [
    Constraint.json_schema(SCHEMA),
    Constraint.choice(["north", "south", "east west"]),
    Constraint.regex(r"[0-9]{3}-[a-z]{2}"),
]
SEEDED = SamplingParams(temperature=1.0, seed=7)
FAMILIES = {"llama": "llama-draft1", "qwen2": "qwen2-draft1"}  # target -> a draft of its vocabulary


@pytest.fixture(scope="module")
def loaded(artifact):
    """(name, draft) -> a Generator (in-place graph, one thread) with that draft, loaded once: keyed on both, so a
    draft-less load of a model never stands in for its load with a draft (xdist may run either first)."""
    made = {}

    def get(name: str, draft: str | None = None) -> Generator:
        if (name, draft) not in made:
            made[name, draft] = Generator.load(
                artifact(name), draft=artifact(draft) if draft else None, graph="inplace", threads=1, verify=False
            )
        return made[name, draft]

    return get


def oracle(
    gen: Generator, prompt: list[int], constraint: Constraint, n: int, sampling: SamplingParams | None
) -> list[int]:
    return constrained_decode(gen.backend, prompt, gen.grammars().matcher(constraint), n, sampling).ids


def sampling_options(sampling: SamplingParams | None) -> dict:
    return {} if sampling is None else dict(temperature=sampling.temperature, seed=sampling.seed)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("sampling", [None, SEEDED], ids=["greedy", "seeded"])
def test_every_strategy_equals_one_token_constrained_decoding(loaded, family, sampling):
    gen = loaded(family, FAMILIES[family])
    prompt = gen.tokenizer.encode("hello there, a record:", add_special_tokens=False)
    for constraint in CONSTRAINTS:
        expected = oracle(gen, prompt, constraint, 48, sampling)
        for strategy in ("greedy", "jacobi", "lookahead", "speculative", "auto"):
            result = gen.generate(prompt, 48, strategy=strategy, constraint=constraint, **sampling_options(sampling))
            assert result.ids == expected, (family, constraint.kind, strategy)
            finished = result.stats.finish_reason == "eos"
            assert result.stats.constraint["complete"] == finished  # "length": never claimed complete
            if strategy != "greedy" and constraint.kind == "json_schema":
                assert result.stats.constraint["forced_committed"] > 0  # the forced runs went in as guesses


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [None, SEEDED], ids=["greedy", "seeded"])
def test_smollm2_extraction_under_every_strategy_equals_the_oracle_and_validates(loaded, sampling):
    jsonschema = pytest.importorskip("jsonschema")
    gen = loaded("smollm2-135m", "smollm2-135m-int8")
    for item in extraction_set()[:2]:
        constraint = Constraint.json_schema(item.schema)
        prompt = gen.tokenizer.encode(
            gen.chat_prompt([{"role": "user", "content": item.prompt}]), add_special_tokens=False
        )
        expected = oracle(gen, prompt, constraint, 160, sampling)
        for strategy in ("greedy", "jacobi", "lookahead", "speculative", "auto"):
            result = gen.generate(prompt, 160, strategy=strategy, constraint=constraint, **sampling_options(sampling))
            assert result.ids == expected, (item.id, strategy)
            if result.stats.finish_reason == "eos":
                jsonschema.validate(json.loads(result.text), item.schema)


def test_response_format_and_constraint_are_one_request(loaded):
    gen = loaded("llama")
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    by_dict = gen.generate(
        "hi", 24, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    )
    by_object = gen.generate("hi", 24, constraint=Constraint.json_schema(schema))
    assert by_dict.ids == by_object.ids
    assert gen.generate("hi", 24, response_format={"type": "text"}).ids == gen.generate("hi", 24).ids
    assert gen.generate("hi", 24, response_format={"type": "json_object"}).text.startswith("{")


def test_bad_constraints_fail_before_any_work(loaded, monkeypatch):
    gen = loaded("llama")

    def no_work(*args, **kwargs):
        raise AssertionError("a context was opened for a request that should have been refused")

    monkeypatch.setattr(gen.backend, "context", no_work)
    for options, says in [
        (
            dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}),
            "response_format.json_schema.schema",
        ),
        (dict(response_format={"type": "xml"}), "response_format"),
        (dict(response_format={"type": "json_object"}, constraint=Constraint.json_object()), "not both"),
        (dict(constraint={"type": "object"}), "constraint must be"),
    ]:
        with pytest.raises(InputError, match=says):
            gen.generate("hi", 8, **options)
    with pytest.raises(InputError, match="regex"):
        Constraint.regex("(")


def test_a_grammar_that_cannot_finish_ends_with_length(loaded):
    gen = loaded("llama")
    result = gen.generate("hi", 6, strategy="auto", constraint=Constraint.json_schema(SCHEMA))
    assert result.stats.finish_reason == "length" and len(result.ids) == 6
    assert result.stats.constraint["complete"] is False


@pytest.mark.parametrize("family", list(FAMILIES))
def test_constrained_and_free_rows_share_passes_and_equal_their_solo_runs(loaded, family):
    gen = loaded(family)
    prompts = [
        gen.tokenizer.encode(text, add_special_tokens=False)
        for text in (
            "hello there, a record:",
            "one two three one two three one two",
            "the cat sat on the mat",
            " ".join(str(i) for i in range(40)),
        )
    ]
    requests = [
        GenerationParams(max_new_tokens=32, strategy="lookahead", constraint=CONSTRAINTS[0]),
        GenerationParams(max_new_tokens=32, strategy="lookahead"),
        GenerationParams(max_new_tokens=32, strategy="jacobi", constraint=CONSTRAINTS[2], sampling=SEEDED),
        GenerationParams(max_new_tokens=32, strategy="greedy", sampling=SEEDED),
    ]
    mixed = []  # decoding passes whose rows were constrained and free
    batched = _batched(
        gen, prompts, requests, lambda record: mixed.append(record.rows) if record.kind == "decode" else None
    )
    assert max(mixed) >= 3  # constrained and free rows were in one pass
    for prompt, params, result in zip(prompts, requests, batched):
        assert result.ids == gen.generate(prompt, params=params).ids, params
        if params.constraint is not None:
            assert result.ids == oracle(
                gen, prompt, params.constraint, 32, None if params.sampling.greedy else params.sampling
            )


def test_a_batch_widens_for_a_constrained_rows_forced_run(loaded):
    """A constrained row whose grammar forces its whole answer (one choice: 14 tokens) beside a free greedy row (a
    window of 1): the batch's pass widens to hold the run (runtime.pass_budget's Bid.sure) and the row commits it in
    that pass; both rows equal their solo runs. A budget that ignored the run's value would decode both at width 1."""
    gen = loaded("llama")
    choice = Constraint.choice(["the quick brown fox jumps over the lazy dog"])
    prompts = [gen.tokenizer.encode(text, add_special_tokens=False) for text in ("a pick:", "the cat sat on the mat")]
    requests = [
        GenerationParams(max_new_tokens=32, strategy="lookahead", constraint=choice),
        GenerationParams(max_new_tokens=32, strategy="greedy"),
    ]
    widths = []  # decoding passes of both rows
    results = _batched(
        gen, prompts, requests, lambda r: widths.append(r.window) if r.kind == "decode" and r.rows == 2 else None
    )
    run = len(gen.grammars().matcher(choice).forced())
    assert run > 8 and widths[0] == run  # the first token came from the prefill: the other run - 1 and the EOS
    assert results[0].stats.target_passes <= 2  # the run in one pass (and its EOS, committed without a pass)
    for prompt, q, result in zip(prompts, requests, results):
        assert result.ids == gen.generate(prompt, params=q).ids


def _batched(gen, prompts, requests, observer):
    """Each prompt with its params as one row of one batcher, stepped until every row finishes; `observer`
    sees every pass's record. -> each row's result."""
    batcher = gen._batcher(len(prompts))
    batcher.stats.observers.append(observer)
    try:
        runs = [gen._on_batcher(batcher, gen._request(p, None, False, params)) for p, params in zip(prompts, requests)]
        while any(not row.finished for row, _ in runs):
            batcher.step()
        return [_drained(pieces) for _, pieces in runs]
    finally:
        batcher.close()


def _drained(pieces):
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            return done.value


@pytest.mark.parametrize("sampling", [None, SEEDED], ids=["greedy", "seeded"])
def test_constrained_speculative_rows_on_the_draft_slots_equal_the_oracle(loaded, sampling):
    """Drafts seated on the batcher's draft slots are asked for chains past a grammar's forced run (the run
    joins their first batched pass): every row still equals one-token constrained decoding. (A random-weight
    draft's chain past a run is cut by the grammar, so whether it helps is measured on SmolLM2 instead.)"""
    gen = loaded("llama", FAMILIES["llama"])
    prompts = [
        gen.tokenizer.encode(text, add_special_tokens=False)
        for text in ("hello there, a record:", "the cat sat on the mat", "one two three one two")
    ]
    params = [
        GenerationParams(
            max_new_tokens=40,
            strategy="speculative",
            constraint=c,
            config={"draft.length": 3},
            sampling=sampling or SamplingParams(),
        )
        for c in (CONSTRAINTS[0], CONSTRAINTS[2], CONSTRAINTS[0])
    ]
    batcher = gen._batcher(3)
    assert batcher.drafts is not None  # the in-place draft: its rows share one draft context
    try:
        runs = [gen._on_batcher(batcher, gen._request(p, None, False, q)) for p, q in zip(prompts, params)]
        while any(not row.finished for row, _ in runs):
            batcher.step()
        results = [_drained(pieces) for _, pieces in runs]
        assert all(row.proposer.stats["draft_passes"] > 0 for row, _ in runs)  # the draft slots ran
    finally:
        batcher.close()
    for prompt, q, result in zip(prompts, params, results):
        assert result.ids == oracle(gen, prompt, q.constraint, 40, sampling)
    assert all(results[i].stats.constraint["forced_sent"] > 0 for i in (0, 2))  # the JSON rows sent forced runs
