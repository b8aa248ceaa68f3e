"""Browser pages cannot drive a keyless local server: the Host check (DNS rebinding) and closed /docs."""

from __future__ import annotations

import httpx
import pytest

from jacobi_rt.server.hosts import host_allowed, host_name

BODY = {"prompt": "hi", "max_tokens": 2}


def test_a_foreign_host_header_is_refused(client, llama_server):
    """A page on evil.example whose name re-resolved to 127.0.0.1 sends Host: evil.example."""
    port = llama_server.port
    for host in (f"evil.example:{port}", "evil.example", f"localhost.evil.example:{port}", f"10.1.2.3:{port}"):
        response = client.post("/v1/completions", json=BODY, headers={"host": host})
        assert response.status_code == 403, host
        assert (
            response.json()["error"]["code"] == "host_not_allowed"
            and "--allow-host" in response.json()["error"]["message"]
        )
    assert client.get("/health", headers={"host": "evil.example"}).status_code == 403
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", "127.0.0.1"):
        assert client.post("/v1/completions", json=BODY, headers={"host": host}).status_code == 200, host


def test_allow_host_names_more_hosts(start_server):
    server = start_server(allowed_hosts=("llm.internal",))
    with httpx.Client(base_url=server.url) as c:
        assert c.post("/v1/completions", json=BODY, headers={"host": f"llm.internal:{server.port}"}).status_code == 200
        assert c.post("/v1/completions", json=BODY, headers={"host": "evil.example"}).status_code == 403
    anything = start_server(allowed_hosts=("*",))
    with httpx.Client(base_url=anything.url) as c:
        assert c.post("/v1/completions", json=BODY, headers={"host": "evil.example"}).status_code == 200


@pytest.mark.parametrize(
    "header, local, allowed, ok",
    [
        ("127.0.0.1:8000", "127.0.0.1", (), True),
        ("localhost:8000", "127.0.0.1", (), True),
        ("localhost:8000", "192.168.1.5", (), False),  # a wildcard bind reached on the LAN address: localhost is not it
        ("192.168.1.5:8000", "192.168.1.5", (), True),
        ("[::1]:8000", "::1", (), True),
        ("[::1]:8000", "127.0.0.1", (), False),
        ("evil.example", "127.0.0.1", (), False),
        ("llm.internal:80", "10.0.0.2", ("llm.internal",), True),
        (None, "127.0.0.1", (), True),  # HTTP/1.0 without Host: not a browser
    ],
)
def test_host_rule(header, local, allowed, ok):
    assert host_allowed(header, local, allowed) is ok


def test_host_name_strips_the_port_and_brackets():
    assert [host_name(h) for h in ("Example.COM:80", "[::1]:8000", "::1", "a.b")] == [
        "example.com",
        "::1",
        "::1",
        "a.b",
    ]


def test_docs_are_closed_unless_asked_for(client, start_server):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert client.get(path).status_code == 404, path
    server = start_server(docs=True)
    with httpx.Client(base_url=server.url) as c:
        assert c.get("/docs").status_code == 200 and c.get("/openapi.json").json()["info"]["title"] == "jacobi-rt"
