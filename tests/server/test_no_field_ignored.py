"""No field that changes the output is accepted and ignored (issue 37): each documented output-changing field,
sent with a value that must change the output, on /v1/chat/completions, /v1/completions and /v1/responses
(real HTTP, SmolLM2-135M), either changes what comes back against the same request without it, or is a 400
naming the field."""

from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("llguidance", reason="structured output needs llguidance: pip install '.[structured]'")

from jacobi_rt.server.run import BackgroundServer  # noqa: E402
from jacobi_rt.server.settings import ServerSettings  # noqa: E402

MODEL = "smollm2-135m"
QUESTION = "Write a list of fruits, one per line."
SAMPLED = {"temperature": 1.0, "seed": 3}  # the baseline of the fields that narrow sampling
LONG = {"length": 40}  # the greedy answer repeats itself only after 16 tokens: where the penalties act
# (field, value, the baseline's other fields): every value here must change the answer (16 tokens unless `length`)
CASES = [
    ("temperature", 1.0, {"seed": 3}),
    ("seed", 4, {"temperature": 1.0}),
    ("top_p", 0.05, SAMPLED),
    ("top_k", 1, SAMPLED),
    ("min_p", 0.9, SAMPLED),
    ("max_tokens", 3, {}),
    ("stop", "\n", {}),
    ("presence_penalty", 2.0, LONG),
    ("frequency_penalty", 2.0, LONG),
    ("repetition_penalty", 3.0, LONG),
    ("n", 2, SAMPLED),
    ("logprobs", True, {}),
    ("top_logprobs", 2, {"logprobs": True}),
    ("response_format", {"type": "json_object"}, {}),
    ("structured_outputs", {"choice": ["pear", "plum"]}, {}),
    ("logit_bias", {"28": -100}, {}),
]
RENAMED = {  # endpoint -> field -> (its name there, its value there); None: the endpoint refuses the field by name
    "/v1/completions": {"logprobs": ("logprobs", 2), "top_logprobs": None, "max_tokens": ("max_tokens", 3)},
    "/v1/responses": {
        "max_tokens": ("max_output_tokens", 3),
        "response_format": ("text", {"format": {"type": "json_object"}}),
    },
}
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


@pytest.fixture(scope="module")
def server(generator):
    with BackgroundServer(generator(MODEL), ServerSettings(model_id=MODEL)) as served:
        yield served


def _body(endpoint: str, fields: dict) -> dict:
    fields = dict(fields)
    length = fields.pop("length", 16)
    base = {"model": MODEL, **fields}
    if endpoint == "/v1/chat/completions":
        return {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": length, **base}
    if endpoint == "/v1/completions":
        return {"prompt": QUESTION + "\n", "max_tokens": length, **base}
    return {"input": QUESTION, "max_output_tokens": length, **base}


def _observable(endpoint: str, reply: dict) -> str:
    """What a client sees of the output: the choices (texts, calls, logprobs, finish reasons), not ids or timings."""
    if endpoint == "/v1/responses":
        return json.dumps([reply["status"], reply["output"]], sort_keys=True).replace(
            reply["output"][0].get("id", "-"), ""
        )
    return json.dumps(reply["choices"], sort_keys=True)


def _named(endpoint: str, field: str, value):
    renamed = RENAMED.get(endpoint, {})
    if field in renamed and renamed[field] is None:
        return field, value, True
    name, value = renamed.get(field, (field, value))
    return name, value, False


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("field, value, baseline", CASES, ids=[case[0] for case in CASES])
def test_an_output_changing_field_changes_the_output_or_is_refused_by_name(server, endpoint, field, value, baseline):
    name, value, refused = _named(endpoint, field, value)
    base = {k: v for k, v in baseline.items() if not (endpoint != "/v1/chat/completions" and k == "logprobs")}
    plain = httpx.post(server.url + endpoint, json=_body(endpoint, base), timeout=120)
    assert plain.status_code == 200, plain.text
    reply = httpx.post(server.url + endpoint, json=_body(endpoint, {**base, name: value}), timeout=120)
    if reply.status_code == 400:
        assert reply.json()["error"]["param"].split(".")[0] == name, reply.text
        return
    assert not refused, f"{name} on {endpoint} should be refused: {reply.text[:200]}"
    assert reply.status_code == 200, reply.text
    assert _observable(endpoint, reply.json()) != _observable(endpoint, plain.json()), (
        f"{name}={value!r} ignored on {endpoint}"
    )


@pytest.mark.parametrize("endpoint", ("/v1/chat/completions", "/v1/completions"))
def test_logit_bias_is_refused_on_both_endpoints(server, endpoint):
    reply = httpx.post(server.url + endpoint, json=_body(endpoint, {"logit_bias": {"19556": -100}}), timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "logit_bias", reply.text


def test_max_tokens_beside_a_different_max_completion_tokens_is_refused(server):
    body = _body("/v1/chat/completions", {"max_completion_tokens": 4})  # max_tokens 16 too: one would be ignored
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "max_tokens", reply.text
    same = httpx.post(server.url + "/v1/chat/completions", json={**body, "max_tokens": 4}, timeout=60)
    assert same.status_code == 200 and same.json()["usage"]["completion_tokens"] <= 4
