"""One-token constrained decoding (tests/constrained.py), the oracle for the engine's integration:
through a real onnxruntime context, every output follows its constraint."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("llguidance", reason="structured output needs llguidance: pip install '.[structured]'")

from constrained import constrained_decode  # noqa: E402

from jacobi_rt.runtime.constraints import Constraint  # noqa: E402
from jacobi_rt.runtime.grammar import grammar_tokenizer  # noqa: E402
from jacobi_rt.runtime.sampling import SamplingParams  # noqa: E402

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "count", "kind", "tags"],
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "count": {"type": "integer"},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
}


@pytest.fixture(scope="module")
def loaded(artifact):
    """name -> (backend, tokenizer, grammar bridge), onnxruntime at one thread."""
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend
    from jacobi_rt.runtime.manifest import load_manifest
    from jacobi_rt.runtime.tokenizer import Tokenizer

    opened = {}

    def get(name: str):
        if name not in opened:
            folder = artifact(name)
            manifest = load_manifest(folder, verify=False)
            tokenizer = Tokenizer(folder, manifest)
            bridge = grammar_tokenizer(tokenizer, manifest.architecture.vocab_size, manifest.tokens.eos_ids)
            opened[name] = (OrtBackend(folder, manifest, "cpu", 1), tokenizer, bridge)
        return opened[name]

    yield get
    for backend, _, _ in opened.values():
        backend.close()


def text_of(out, bridge) -> str:
    return bridge.text([t for t in out.ids if t not in bridge.eos_ids])


@pytest.mark.parametrize(
    "sampling", [None, SamplingParams(temperature=1.0, seed=7), SamplingParams(temperature=0.8, top_p=0.9, seed=8)]
)
def test_tiny_model_follows_choice_regex_and_schema(loaded, sampling):
    backend, tokenizer, bridge = loaded("llama")
    prompt = tokenizer.encode("hello there", add_special_tokens=False)
    choice = constrained_decode(
        backend, prompt, bridge.matcher(Constraint.choice(["north", "south", "east"])), 40, sampling
    )
    assert choice.finish_reason == "eos" and text_of(choice, bridge) in ("north", "south", "east")
    regex = constrained_decode(backend, prompt, bridge.matcher(Constraint.regex(r"[0-9]{3}-[a-z]{2}")), 40, sampling)
    assert regex.finish_reason == "eos" and re.fullmatch(r"[0-9]{3}-[a-z]{2}", text_of(regex, bridge))
    matcher = bridge.matcher(Constraint.json_schema(SCHEMA))
    out = constrained_decode(backend, prompt, matcher, 200, sampling)
    text = text_of(out, bridge)
    if out.finish_reason == "eos":
        jsonschema = pytest.importorskip("jsonschema")
        jsonschema.validate(json.loads(text), SCHEMA)
    else:  # a random model may never close the object: what it wrote is still a valid prefix
        assert bridge.matcher(Constraint.json_schema(SCHEMA)).cut(out.ids) == len(out.ids)


def test_the_oracle_is_a_function_of_the_seed(loaded):
    backend, tokenizer, bridge = loaded("llama")
    prompt = tokenizer.encode("a b c", add_special_tokens=False)
    constraint = Constraint.regex(r"[a-z ]{5,30}")
    runs = [
        constrained_decode(backend, prompt, bridge.matcher(constraint), 40, SamplingParams(temperature=1.0, seed=s)).ids
        for s in (3, 3, 4)
    ]
    assert runs[0] == runs[1] and runs[0] != runs[2]


@pytest.mark.slow
def test_smollm2_extraction_outputs_validate(loaded):
    """Every extraction prompt, constrained greedy and one seeded sample: each output parses and
    follows its schema (SmolLM2-135M, one token a pass; about two minutes on 2 cores)."""
    jsonschema = pytest.importorskip("jsonschema")
    from benchmarks.extraction import extraction_set

    backend, tokenizer, bridge = loaded("smollm2-135m")
    for i, item in enumerate(extraction_set()):
        prompt = tokenizer.encode(
            tokenizer.render_chat([{"role": "user", "content": item.prompt}]), add_special_tokens=False
        )
        runs = [None] + ([SamplingParams(temperature=0.7, top_p=0.95, seed=i)] if i % 4 == 0 else [])
        for sampling in runs:
            out = constrained_decode(
                backend, prompt, bridge.matcher(Constraint.json_schema(item.schema)), 320, sampling
            )
            assert out.finish_reason == "eos", (item.id, text_of(out, bridge))
            jsonschema.validate(json.loads(text_of(out, bridge)), item.schema)
