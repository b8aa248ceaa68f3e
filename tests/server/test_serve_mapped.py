"""`jacobi-rt serve --mapped`: the server process loads a mapped session (runtime/backends/ort_session.py),
says so, and answers with the tokens of the artifact's own session. A real `jacobi-rt serve` process on a
loopback port, real HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
from loopback import free_port

PROMPT, TOKENS = "The quick brown fox", 24


def _serve(folder, cache, *flags) -> tuple[subprocess.Popen, str]:
    """`jacobi-rt serve FOLDER` with JACOBI_RT_CACHE=cache, once it answers /health: (process, url)."""
    port = free_port()
    env = {**os.environ, "JACOBI_RT_CACHE": str(cache)}
    command = [sys.executable, "-m", "jacobi_rt", "serve", str(folder), "--port", str(port), "--threads", "1", *flags]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise AssertionError(f"the server did not start: {process.stderr.read()[-2000:]}")


def _stop(process: subprocess.Popen) -> str:
    """Stop the server (SIGTERM, as Ctrl-C) and return its stderr."""
    process.terminate()
    _, err = process.communicate(timeout=60)
    return err


def _greedy(url: str) -> str:
    body = {"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "jacobi": {"strategy": "auto"}}
    response = httpx.post(url + "/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    return response.json()["choices"][0]["text"]


def test_serve_mapped_maps_an_entry_and_answers_the_artifacts_tokens(artifact, generator, tmp_path):
    folder = artifact("llama")
    expected = generator("llama").generate(PROMPT, TOKENS, strategy="greedy").text  # the artifact's session
    process, url = _serve(folder, tmp_path, "--mapped")
    try:
        text = _greedy(url)
    finally:
        err = _stop(process)
    [entry] = [p for p in (tmp_path / "sessions").iterdir() if not p.name.startswith(".")]
    assert f"mapped session: {entry}" in err
    assert text == expected


def test_serve_without_mapped_makes_no_entry(artifact, tmp_path):
    process, url = _serve(artifact("llama"), tmp_path)
    try:
        assert _greedy(url)
    finally:
        err = _stop(process)
    assert not (tmp_path / "sessions").exists()
    assert "mapped session" not in err


def test_serve_mapped_with_the_cache_off_says_it_loads_the_artifacts_graph(artifact):
    process, url = _serve(artifact("llama"), "off", "--mapped")
    try:
        assert _greedy(url)
    finally:
        err = _stop(process)
    assert "mapped session: none (JACOBI_RT_CACHE is off" in err
