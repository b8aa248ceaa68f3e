"""The server checks requests against the backend's limits (an engine built with a smaller context or
windows than the manifest), /v1/models reports them, and the `jacobi` field's jacobi_tail reaches the draft."""

from __future__ import annotations

import httpx
import pytest
from profiled_backend import ProfiledBackend, engine_profiles

from jacobi_rt.engines.profiles import Limits
from jacobi_rt.runtime import Generator
from jacobi_rt.runtime.backends.onnxrt import OrtBackend
from jacobi_rt.runtime.manifest import load_manifest
from jacobi_rt.runtime.tokenizer import Tokenizer
from jacobi_rt.server.run import BackgroundServer
from jacobi_rt.server.settings import ServerSettings


@pytest.fixture(scope="module")
def small_engine_server(artifact):
    """The tiny llama as an engine built with --max-context 48 --decode-window 4 --prefill-window 8."""
    folder = artifact("llama")
    cpu = OrtBackend(folder, load_manifest(folder), device="cpu", threads=1)
    backend = ProfiledBackend(
        cpu, engine_profiles(cpu.manifest, Limits(max_context=48, decode_window=4, prefill_window=8))
    )
    with BackgroundServer(
        Generator(backend, Tokenizer(folder, cpu.manifest)), ServerSettings(model_id="llama")
    ) as server:
        yield server


def test_models_report_the_engine_limits(small_engine_server):
    with httpx.Client(base_url=small_engine_server.url, timeout=60) as c:
        card = c.get("/v1/models").json()["data"][0]
    assert card["jacobi"]["max_context"] == 48 and card["jacobi"]["max_window"] == 8


def test_requests_are_checked_against_the_engine_context_and_run_inside_it(small_engine_server):
    with httpx.Client(base_url=small_engine_server.url, timeout=60) as c:
        over = c.post("/v1/completions", json={"prompt": list(range(3, 33)), "max_tokens": 20})
        fits = c.post(
            "/v1/completions",
            json={"prompt": list(range(3, 23)), "max_tokens": 20, "jacobi": {"strategy": "lookahead"}},
        )
    assert over.status_code == 400 and "context holds 48 tokens" in over.json()["error"]["message"]
    assert fits.status_code == 200, fits.text
    assert fits.json()["usage"]["completion_tokens"] == 20


@pytest.fixture(scope="module")
def draft_server(artifact):
    generator = Generator.load(artifact("llama"), draft=artifact("llama-draft1"), threads=1)
    with BackgroundServer(generator, ServerSettings(model_id="llama")) as server:
        yield server


def test_jacobi_tail_reaches_the_draft(draft_server):
    body = {"prompt": "The quick brown fox", "max_tokens": 12}
    with httpx.Client(base_url=draft_server.url, timeout=60) as c:
        greedy = c.post("/v1/completions", json={**body, "jacobi": {"strategy": "greedy"}}).json()
        for tail in (True, False):
            reply = c.post("/v1/completions", json={**body, "jacobi": {"strategy": "speculative", "jacobi_tail": tail}})
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["text"] == greedy["choices"][0]["text"]
        wrong = c.post("/v1/completions", json={**body, "jacobi": {"strategy": "lookahead", "jacobi_tail": True}})
        not_bool = c.post("/v1/completions", json={**body, "jacobi": {"strategy": "speculative", "jacobi_tail": "yes"}})
    assert wrong.status_code == 400 and "jacobi_tail" in wrong.json()["error"]["message"]
    assert not_bool.status_code == 400
