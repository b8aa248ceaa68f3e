"""Bad input never crashes or stalls the server: each gets OpenAI's error object and the right status."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

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
    (COMPLETIONS, {"prompt": "hi", "temperature": 0.7}, 400, "temperature", "unsupported_value"),
    (COMPLETIONS, {"prompt": "hi", "temperature": "hot"}, 400, "temperature", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "top_p": 0.5}, 400, "top_p", "unsupported_value"),
    (COMPLETIONS, {"prompt": "hi", "n": 2}, 400, "n", "unsupported_value"),
    (COMPLETIONS, {"prompt": "hi", "echo": True}, 400, "echo", "unsupported_value"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 3}, 400, "logprobs", "unsupported_value"),
    (COMPLETIONS, {"prompt": "hi", "seed": "x"}, 400, "seed", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "user": 3}, 400, "user", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "jacobi": {"strategy": "beam"}}, 400, "jacobi.strategy", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "jacobi": {"window": 0}}, 400, "jacobi.window", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "jacobi": {"strategy": "greedy", "window": 4}}, 400, "jacobi.window", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "jacobi": {"strategy": "speculative"}}, 400, "jacobi.strategy", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "jacobi": {"windoww": 4}}, 400, "jacobi.windoww", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "model": "gpt-4o"}, 404, "model", "model_not_found"),
    (COMPLETIONS, {"prompt": "hi", "model": 3}, 400, "model", "invalid_value"),
    (CHAT, {}, 400, "messages", "missing"),
    (CHAT, {"messages": []}, 400, "messages", "invalid_value"),
    (CHAT, {"messages": "Hi"}, 400, "messages", "invalid_value"),
    (CHAT, {"messages": [{"content": "Hi"}]}, 400, "messages.0.role", "missing"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content", "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages.0.content", "unsupported_value"),
    (CHAT, {"messages": [{"role": "user", "content": "word " * 400}]}, 400, "messages", "context_length_exceeded"),
    (CHAT, {"messages": HI, "max_tokens": 10**6}, 400, "max_tokens", "context_length_exceeded"),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools", "unsupported_value"),
    (CHAT, {"messages": HI, "logprobs": True}, 400, "logprobs", "unsupported_value"),
    (CHAT, {"messages": HI, "temperature": 1}, 400, "temperature", "unsupported_value"),
    (CHAT, {"messages": HI, "model": "other"}, 404, "model", "model_not_found"),
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


@pytest.mark.parametrize("path, body, status, param, code", BAD, ids=[f"{p[4:]}-{json.dumps(b)[:40]}" for p, b, *_ in BAD])
def test_bad_request(client, path, body, status, param, code):
    for streamed in (False, True):
        check_error(client.post(path, json={**body, "stream": True} if streamed and "stream" not in body else body),
                    status, param, code)


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
        check_error(c.post(COMPLETIONS, content=chunked), 413, code="body_too_large")  # chunked: counted as read
        assert c.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_unknown_route_and_wrong_method(client):
    check_error(client.get("/v1/nothing"), 404, code="not_found")
    check_error(client.get(COMPLETIONS), 405, code="method_not_allowed")
    check_error(client.get("/v1/models/gpt-4o"), 404, code="model_not_found")


def test_the_server_still_serves_after_bad_input(client):
    assert client.get("/health").json()["status"] == "ok"
    assert client.post(COMPLETIONS, json={"prompt": "The quick", "max_tokens": 3}).json()["usage"]["completion_tokens"] == 3


def test_a_stalled_client_does_not_stall_others(llama_server, client):
    """A client that promises a body and never sends it holds only its own connection."""
    with socket.create_connection((llama_server.host, llama_server.port)) as stalled:
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        assert client.post(COMPLETIONS, json={"prompt": "The quick", "max_tokens": 3}, timeout=10).status_code == 200


def test_api_key_required_when_set(start_server):
    server = start_server(api_key="s3cret")
    with httpx.Client(base_url=server.url) as c:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "s3cret"}, {"Authorization": "Basic s3cret"}):
            response = c.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2}, headers=headers)
            check_error(response, 401, code="invalid_api_key")
            assert response.headers["www-authenticate"] == "Bearer"
        check_error(c.get("/v1/models"), 401)
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200  # open for probes
        ok = c.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
