"""Servers for the HTTP tests: the real app under uvicorn on an ephemeral loopback port, in a thread,
over a real Generator (no mocks)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra: pip install '.[serve]' from the checkout")
pytest.importorskip("uvicorn", reason="the server needs the serve extra: pip install '.[serve]' from the checkout")
httpx = pytest.importorskip("httpx", reason="the server tests need httpx (the dev extra)")

from jacobi_rt.runtime import Generator  # noqa: E402
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
    with BackgroundServer(generator("llama"), ServerSettings(model_id="llama", queue_size=32)) as server:
        yield server


@pytest.fixture
def client(llama_server):
    with httpx.Client(base_url=llama_server.url, timeout=60) as c:
        yield c


@pytest.fixture(params=[None, 4], ids=["default", "max-batch-4"])
def each_mode(request, artifact):
    """each_mode(**settings) -> a started server over the tiny llama, once as `jacobi-rt serve` runs by
    default and once with --max-batch 4; each on a Generator of its own (a batch engine is not shared)."""
    started: list[BackgroundServer] = []

    def start(**settings) -> BackgroundServer:
        gen = Generator.load(artifact("llama"), graph="inplace", threads=1)
        server = BackgroundServer(gen, ServerSettings(model_id="llama", max_batch=request.param, **settings)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def gen(generator):
    """The tiny llama's shared Generator (the one `llama_server` serves)."""
    return generator("llama")


@pytest.fixture
def api(llama_server):
    """The official `openai` client on the shared llama server."""
    import openai

    with openai.OpenAI(base_url=llama_server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c
