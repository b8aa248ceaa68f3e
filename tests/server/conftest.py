"""Servers for the HTTP tests: the real app under uvicorn on an ephemeral loopback port, in a thread,
over a real Generator (no mocks)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra: pip install '.[serve]' from the checkout")
pytest.importorskip("uvicorn", reason="the server needs the serve extra: pip install '.[serve]' from the checkout")
httpx = pytest.importorskip("httpx", reason="the server tests need httpx (the dev extra)")

from jacobi_rt.server.run import BackgroundServer  # noqa: E402
from jacobi_rt.server.settings import ServerSettings  # noqa: E402


@pytest.fixture(scope="session")
def graph() -> str:
    """The server tests run on the default graph only (the runtime tests cover both variants)."""
    return "inplace"


@pytest.fixture
def start_server(generator):
    """start_server(family="llama", **settings) -> a started BackgroundServer, stopped after the test."""
    started: list[BackgroundServer] = []

    def start(family: str = "llama", **settings) -> BackgroundServer:
        server = BackgroundServer(generator(family), ServerSettings(model_id=family, **settings)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def llama_server(generator):
    """One shared server over the tiny llama artifact (model id "llama")."""
    with BackgroundServer(generator("llama"), ServerSettings(model_id="llama", workers=4, queue_size=32)) as server:
        yield server


@pytest.fixture
def client(llama_server):
    with httpx.Client(base_url=llama_server.url, timeout=60) as c:
        yield c
