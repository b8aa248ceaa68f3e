"""Bad input never crashes or stalls the server: each gets OpenAI's error object and the right status."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from sse_client import read_events
from templated import with_template

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
HI = [{"role": "user", "content": "Hi"}]

BAD = [
    # (path, body, status, param, code)
    (COMPLETIONS, {}, 400, "prompt", "missing"),
    (COMPLETIONS, {"prompt": 5}, 400, "prompt", "invalid_value"),
    (COMPLETIONS, {"prompt": {"text": "hi"}}, 400, "prompt", "invalid_value"),
    (COMPLETIONS, {"prompt": ["a", "b"]}, 400, "prompt", "unsupported_value"),
    (COMPLETIONS, {"prompt": ""}, 400, "prompt", "invalid_value"),
    (COMPLETIONS, {"prompt": [1, 2, 384]}, 400, "prompt", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 2.5}, 400, "max_tokens", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 10**6}, 400, "max_tokens", "context_length_exceeded"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 10**30}, 400, "max_tokens", "context_length_exceeded"),
    (COMPLETIONS, {"prompt": "word " * 400, "max_tokens": 1}, 400, "prompt", "context_length_exceeded"),
    (COMPLETIONS, {"prompt": "hi", "stop": 5}, 400, "stop", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "stream": "yes"}, 400, "stream", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "temperature": -0.5}, 400, "temperature", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "temperature": "hot"}, 400, "temperature", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "top_p": 0}, 400, "top_p", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "top_p": 1.5}, 400, "top_p", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "top_k": -1}, 400, "top_k", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "min_p": 2}, 400, "min_p", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "repetition_penalty": 0}, 400, "repetition_penalty", "invalid_value"),
    (
        COMPLETIONS,
        {"prompt": "0", "max_tokens": 3, "temperature": 1.0, "seed": 0, "repetition_penalty": 5e-324, "min_p": 1},
        400,
        "repetition_penalty",
        "invalid_value",
    ),  # was a 500 (schemathesis): logits / p overflowed
    (COMPLETIONS, {"prompt": "hi", "frequency_penalty": 3}, 400, "frequency_penalty", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "seed": 1.5}, 400, "seed", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "n": 0}, 400, "n", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "n": 17}, 400, "n", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"5": 1}}, 400, "logit_bias", "unsupported_value"),
    (
        CHAT,
        {"messages": HI, "logit_bias": {"19556": -100}},
        400,
        "logit_bias",
        "unsupported_value",
    ),  # one rule for both
    (COMPLETIONS, {"prompt": "hi", "echo": True}, 400, "echo", "unsupported_value"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 6}, 400, "logprobs", "invalid_value"),  # OpenAI's limit: 5
    (COMPLETIONS, {"prompt": "hi", "seed": "x"}, 400, "seed", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "user": 3}, 400, "user", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "jacobi": {"strategy": "beam"}}, 400, "jacobi.strategy", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "jacobi": {"window": 0}}, 400, "jacobi.window", "invalid_value"),
    (
        COMPLETIONS,
        {"prompt": "hi", "jacobi": {"strategy": "greedy", "window": 4}},
        400,
        "jacobi.window",
        "invalid_value",
    ),
    (COMPLETIONS, {"prompt": "hi", "jacobi": {"strategy": "speculative"}}, 400, "jacobi.strategy", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "jacobi": {"windoww": 4}}, 400, "jacobi.windoww", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "jacobi": {"lookahead": {"branches": 0}}}, 400, "jacobi.lookahead", "invalid_value"),
    (
        COMPLETIONS,
        {"prompt": "hi", "jacobi": {"lookahead.decay": "fast"}},
        400,
        "jacobi.lookahead.decay",
        "invalid_value",
    ),
    (
        COMPLETIONS,
        {"prompt": "hi", "jacobi": {"costs": {"pass_costs": [[0, 1]]}}},
        400,
        "jacobi.costs",
        "invalid_value",
    ),
    (
        COMPLETIONS,
        {"prompt": "hi", "jacobi": {"batch.prefill_chunk": 8}},
        400,
        "jacobi.batch.prefill_chunk",
        "invalid_value",
    ),
    (
        COMPLETIONS,
        {"prompt": "hi", "jacobi": {"draft": {"length": 6}, "draft.max_length": 4}},
        400,
        "jacobi",
        "invalid_value",
    ),
    (COMPLETIONS, {"prompt": "hi", "model": "gpt-4o"}, 404, "model", "model_not_found"),
    (COMPLETIONS, {"prompt": "hi", "model": 3}, 400, "model", "invalid_value"),
    (CHAT, {}, 400, "messages", "missing"),
    (CHAT, {"messages": []}, 400, "messages", "invalid_value"),
    (CHAT, {"messages": "Hi"}, 400, "messages", "invalid_value"),
    (CHAT, {"messages": [{"content": "Hi"}]}, 400, "messages.0.role", "missing"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content", "invalid_value"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "messages.0.content.0.type",
        "unsupported_value",
    ),
    (CHAT, {"messages": [{"role": "user", "content": "word " * 400}]}, 400, "messages", "context_length_exceeded"),
    (CHAT, {"messages": HI, "max_tokens": 10**6}, 400, "max_tokens", "context_length_exceeded"),
    # "auto" by the generic protocol (this template renders no tools) constrains the output, so nothing else may
    (
        CHAT,
        {
            "messages": HI,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "response_format": {"type": "json_object"},
        },
        400,
        "tool_choice",
        "invalid_value",
    ),
    (CHAT, {"messages": HI, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", "invalid_value"),  # limit: 20
    (CHAT, {"messages": HI, "top_logprobs": 2}, 400, "top_logprobs", "invalid_value"),  # needs logprobs: true
    (CHAT, {"messages": HI, "logprobs": 3}, 400, "logprobs", "invalid_value"),  # chat's is a boolean
    (CHAT, {"messages": HI, "model": "other"}, 404, "model", "model_not_found"),
    # stop strings are capped: a long one holds back every piece (issue 14)
    (COMPLETIONS, {"prompt": "hi", "stop": "x" * 257}, 400, "stop", "invalid_value"),
    (CHAT, {"messages": HI, "stop": ["\n", "x" * 200_000]}, 400, "stop", "invalid_value"),
    # fields that would change the output are refused by name, declared or not
    (COMPLETIONS, {"prompt": "hi", "best_of": 3}, 400, "best_of", "unsupported_value"),
    (COMPLETIONS, {"prompt": "hi", "grammar": 'root ::= "a"'}, 400, "grammar", "unsupported_value"),
    (COMPLETIONS, {"prompt": "hi", "some_new_knob": 1}, 400, "some_new_knob", "unsupported_value"),
    (CHAT, {"messages": HI, "guided_json": {"type": "object"}}, 400, "guided_json", "unsupported_value"),
    (CHAT, {"messages": HI, "functions": [{"name": "f"}]}, 400, "functions", "unsupported_value"),
    (CHAT, {"messages": HI, "response_format": {"type": "xml"}}, 400, "response_format.type", "invalid_value"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": "Hi", "name": "bob"}]},
        400,
        "messages.0.name",
        "unsupported_value",
    ),
    # refused as OpenAI refuses them (issue 25)
    (COMPLETIONS, {"prompt": "hi", "temperature": 5e-324}, 400, "temperature", "invalid_value"),  # logits / T overflows
    (COMPLETIONS, {"prompt": "hi", "temperature": 1e-310}, 400, "temperature", "invalid_value"),
    (
        COMPLETIONS,
        {"prompt": "hi", "stream": False, "stream_options": {"include_usage": True}},
        400,
        "stream_options",
        "invalid_value",
    ),
    (CHAT, {"messages": HI, "stream": False, "stream_options": {}}, 400, "stream_options", "invalid_value"),
    (CHAT, {"messages": [{"role": "bogus", "content": "Hi"}]}, 400, "messages.0.role", "invalid_value"),
    (CHAT, {"messages": [{"role": "tool", "content": "42"}]}, 400, "messages.0.tool_call_id", "missing"),
    (
        CHAT,
        {"messages": [{"role": "tool", "content": "42", "tool_call_id": "call_1"}]},
        400,
        "messages.0.tool_call_id",
        "invalid_value",
    ),  # answers no earlier call
    (CHAT, {"messages": [{"role": "function", "content": "42"}]}, 400, "messages.0.name", "missing"),
    (CHAT, {"messages": [{"role": "user"}]}, 400, "messages.0.content", "missing"),
    (CHAT, {"messages": [{"role": "user", "content": None}]}, 400, "messages.0.content", "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": []}]}, 400, "messages.0.content", "invalid_value"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        400,
        "messages.0.content.0.text",
        "missing",
    ),
]


def check_error(response: httpx.Response, status: int, param=None, code=None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == ("invalid_request_error" if status < 429 else error["type"])
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


@pytest.mark.parametrize(
    "path, body, status, param, code", BAD, ids=[f"{p[4:]}-{json.dumps(b)[:40]}" for p, b, *_ in BAD]
)
def test_bad_request(client, path, body, status, param, code):
    for streamed in (False, True):
        check_error(
            client.post(path, json={**body, "stream": True} if streamed and "stream" not in body else body),
            status,
            param,
            code,
        )


def test_the_batch_server_refuses_the_same_bodies(artifact):
    """--max-batch parses and checks requests as the default server does (BAD above runs on the default one)."""
    from jacobi_rt.runtime import Generator
    from jacobi_rt.server.run import BackgroundServer
    from jacobi_rt.server.settings import ServerSettings

    generator = Generator.load(artifact("llama"), graph="inplace", threads=1)
    with (
        BackgroundServer(generator, ServerSettings(model_id="llama", max_batch=4)) as server,
        httpx.Client(base_url=server.url, timeout=60) as c,
    ):
        for path, body, status, param, code in BAD:
            check_error(c.post(path, json=body), status, param, code)


def test_fields_that_cannot_change_the_output_are_ignored(client):
    ignored = {
        "metadata": {"app": "x"},
        "store": False,
        "service_tier": "auto",
        "tool_choice": "none",
        "parallel_tool_calls": False,
    }
    echoed = {"role": "assistant", "content": "Hello", "refusal": None, "annotations": [], "tool_calls": []}
    messages = [
        {"role": "system", "content": "Be brief"},
        {"role": "developer", "content": "Be kind"},
        {"role": "user", "content": "Hi"},
        echoed,
        {"role": "user", "content": ""},
    ]
    assert client.post(CHAT, json={"messages": messages, "max_tokens": 2, **ignored}).status_code == 200
    assert client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2, **ignored}).status_code == 200
    streamed = {"stream": True, "stream_options": {"include_usage": False, "include_obfuscation": True}}
    assert client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2, **ignored, **streamed}).status_code == 200


def test_refusals_say_what_is_wrong(client):
    """Each message names the mistake, not what tripped over it (issue 25's misleading 400s)."""
    no_text = client.post(CHAT, json={"messages": [{"role": "user", "content": [{"type": "text", "txt": "Hi"}]}]})
    assert "a text part needs its text" in check_error(no_text, 400)["message"]
    huge_id = client.post(COMPLETIONS, json={"prompt": [5, 2**70]})
    assert f"token id {2**70} is outside this model's vocabulary" in check_error(huge_id, 400, "prompt")["message"]
    long_seed = client.post(
        COMPLETIONS,
        content=b'{"prompt": "hi", "seed": ' + b"9" * 5000 + b"}",
        headers={"content-type": "application/json"},
    )
    message = check_error(long_seed, 400)["message"]
    assert "5000 digits" in message and "sys." not in message
    tools = [{"type": "function", "function": {"name": "f", "description": "a long description " * 20}}]
    message = check_error(
        client.post(CHAT, json={"messages": HI, "tools": tools, "response_format": {"type": "json_object"}}),
        400,
        "tool_choice",
    )["message"]
    assert "description" not in message and len(message) < 160  # what to send instead, not the tools echoed


@pytest.mark.parametrize(
    "path, body, param",
    [
        (COMPLETIONS, {"prompt": "hi \ud800 there"}, "prompt"),
        (CHAT, {"messages": [{"role": "user", "content": "\udfff"}]}, "messages"),
        (CHAT, {"messages": HI, "stop": ["\ud83d"]}, "stop"),
    ],
)
def test_a_lone_surrogate_is_a_400(client, path, body, param):
    """Valid JSON ("\\ud800"), but not text: no tokenizer can encode it."""
    for streamed in (False, True):
        content = json.dumps({**body, "stream": streamed})  # ASCII: the surrogate travels as its escape
        error = check_error(
            client.post(path, content=content, headers={"content-type": "application/json"}), 400, param
        )
        assert "surrogate" in error["message"]
    paired = json.dumps({"prompt": "\U0001f600", "max_tokens": 2})  # an emoji: a valid surrogate pair
    assert client.post(COMPLETIONS, content=paired, headers={"content-type": "application/json"}).status_code == 200


@pytest.mark.parametrize(
    "content",
    [
        b"[" * 100_000,
        b'{"prompt": ' + b"[" * 500 + b"]" * 500 + b"}",
        b'{"prompt": "hi", "jacobi": ' + b'{"a": ' * 200 + b"1" + b"}" * 201,
    ],
)
def test_deeply_nested_json_is_a_400(client, content):
    error = check_error(client.post(COMPLETIONS, content=content, headers={"content-type": "application/json"}), 400)
    assert "nests" in error["message"]


def test_a_body_that_is_not_json_is_a_415(client):
    for headers in ({"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"}, {}):
        response = client.post(COMPLETIONS, content=json.dumps({"prompt": "hi", "max_tokens": 2}), headers=headers)
        check_error(response, 415, code="unsupported_media_type")
    ok = client.post(
        COMPLETIONS,
        content=json.dumps({"prompt": "hi", "max_tokens": 2}),
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 200


def test_an_error_inside_the_chat_template_is_a_400(start_server, artifact, tmp_path):
    from jacobi_rt.runtime import Generator
    from jacobi_rt.server.run import BackgroundServer
    from jacobi_rt.server.settings import ServerSettings

    template = "{% for m in messages %}{{ m['role'] + 1 }}{% endfor %}"  # str + int: a TypeError inside jinja
    folder = with_template(artifact("llama"), tmp_path / "llama", template)
    with BackgroundServer(Generator.load(folder), ServerSettings(model_id="llama")) as server:
        response = httpx.post(server.url + CHAT, json={"messages": HI})
    error = check_error(response, 400, "messages", "invalid_value")
    assert "chat template" in error["message"]


def test_an_internal_error_sends_only_a_request_id_and_logs_the_details(artifact, caplog):
    from jacobi_rt.runtime import BackendError, Generator
    from jacobi_rt.server.run import BackgroundServer
    from jacobi_rt.server.settings import ServerSettings

    generator = Generator.load(artifact("llama"))

    def failing_forward(*args, **kwargs):
        raise BackendError("node /model/layers.0/attn/MatMul failed reading /srv/secret/model.onnx")

    with BackgroundServer(generator, ServerSettings(model_id="llama")) as server, caplog.at_level("ERROR"):
        generator.batcher.ctx.forward = failing_forward  # a backend that fails mid-request, as a broken GPU would
        whole = httpx.post(server.url + COMPLETIONS, json={"prompt": "hi", "max_tokens": 2})
        with httpx.stream("POST", server.url + COMPLETIONS, json={"prompt": "hi", "stream": True}) as response:
            events, done = read_events(response)
    error = check_error(whole, 500, code="internal_error")
    streamed = events[-1]["error"]
    for message in (error["message"], streamed["message"]):
        assert "secret" not in message and "MatMul" not in message and "request id req-" in message
    request_id = whole.headers["x-request-id"]
    assert request_id in error["message"]
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged and "secret" in str(logged[0].exc_info[1])


@pytest.mark.parametrize("content", [b"{bad json", b"", b"\xff\xfe", b"[1, 2]", b"null", b'"text"'])
def test_body_that_is_not_a_json_object(client, content):
    error = check_error(client.post(COMPLETIONS, content=content, headers={"content-type": "application/json"}), 400)
    assert "JSON" in error["message"]


def test_body_over_the_limit(start_server):
    server = start_server(max_body_bytes=4096)
    big = {"prompt": "x" * 10_000}
    with httpx.Client(base_url=server.url) as c:
        check_error(c.post(COMPLETIONS, json=big), 413, code="body_too_large")  # declared by Content-Length
        chunked = (json.dumps(big)[i : i + 1000].encode() for i in range(0, 11_000, 1000))
        check_error(
            c.post(COMPLETIONS, content=chunked, headers={"content-type": "application/json"}),
            413,
            code="body_too_large",
        )  # chunked: counted as read
        assert c.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_unknown_route_and_wrong_method(client):
    check_error(client.get("/v1/nothing"), 404, code="not_found")
    check_error(client.get(COMPLETIONS), 405, code="method_not_allowed")
    check_error(client.get("/v1/models/gpt-4o"), 404, code="model_not_found")


def test_the_server_still_serves_after_bad_input(client):
    assert client.get("/health").json()["status"] == "ok"
    assert (
        client.post(COMPLETIONS, json={"prompt": "The quick", "max_tokens": 3}).json()["usage"]["completion_tokens"]
        == 3
    )


def test_a_client_that_leaves_mid_body_is_a_499_with_one_log_line(each_mode, caplog, capfd):
    """Half a body, then the connection closes: counted as a client disconnect, logged once, no traceback."""
    server = each_mode()
    capfd.readouterr()
    with httpx.Client(base_url=server.url, timeout=10) as c:
        for _ in range(3):
            with socket.create_connection((server.host, server.port)) as leaving:
                leaving.sendall(
                    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b'Content-Length: 1000\r\n\r\n{"prompt": "The qu'
                )
        limit = time.monotonic() + 10
        while 'endpoint="completions"} 3.0' not in c.get("/metrics").text:
            assert time.monotonic() < limit, c.get("/metrics").text
            time.sleep(0.02)
        counted = [line for line in c.get("/metrics").text.splitlines() if line.startswith("jacobi_rt_requests_total{")]
        assert c.post(COMPLETIONS, json={"prompt": "The quick", "max_tokens": 3}).status_code == 200
    assert [line for line in counted if "completions" in line] == [
        'jacobi_rt_requests_total{code="499",endpoint="completions"} 3.0'
    ]
    records = [r for r in caplog.records if r.name.startswith("jacobi_rt")]
    assert [r.levelname for r in records] == [
        "WARNING"
    ] * 3 and "left before sending its whole request body" in records[0].getMessage()
    err = capfd.readouterr().err
    assert "Exception in ASGI application" not in err and "Traceback" not in err, err


def test_a_stalled_client_does_not_stall_others(llama_server, client):
    """A client that promises a body and never sends it holds only its own connection."""
    with socket.create_connection((llama_server.host, llama_server.port)) as stalled:
        stalled.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
        )
        assert client.post(COMPLETIONS, json={"prompt": "The quick", "max_tokens": 3}, timeout=10).status_code == 200


def test_a_stalled_client_holds_no_place_in_the_pool(start_server):
    """A place is taken once the body has arrived: slow senders cannot fill the pool (then 429 for everyone)."""
    server = start_server(max_batch=1, queue_size=0)
    with socket.create_connection((server.host, server.port)) as stalled, httpx.Client(base_url=server.url) as c:
        stalled.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        time.sleep(0.2)
        assert c.post(COMPLETIONS, json={"prompt": "The quick", "max_tokens": 3}, timeout=10).status_code == 200
        assert c.get("/health").json()["queued"] == 0


def test_api_key_required_when_set(start_server):
    server = start_server(api_key="s3cret")
    with httpx.Client(base_url=server.url) as c:
        for headers in (
            {},
            {"Authorization": "Bearer nope"},
            {"Authorization": "s3cret"},
            {"Authorization": "Basic s3cret"},
        ):
            response = c.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2}, headers=headers)
            check_error(response, 401, code="invalid_api_key")
            assert response.headers["www-authenticate"] == "Bearer"
        check_error(c.get("/v1/models"), 401)
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200  # open for probes
        ok = c.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
