"""/health, /v1/models and the Prometheus metrics."""

from __future__ import annotations

import re
import time


def test_health(client):
    assert client.get("/health").json() == {"status": "ok", "model": "llama", "running": 0, "queued": 0}


def test_models_lists_the_artifact(client, generator):
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["llama"]
    card = body["data"][0]
    assert card["object"] == "model" and card["jacobi"]["max_context"] == generator("llama").manifest.max_context
    assert client.get("/v1/models/llama").json() == card


def test_metrics_count_requests_tokens_and_passes(start_server, generator):
    import httpx

    server = start_server()
    with httpx.Client(base_url=server.url) as c:
        for strategy in ("greedy", "jacobi"):
            c.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 10, "jacobi": {"strategy": strategy}})
        c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 0})
        response = c.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    samples = {
        name: float(value)
        for name, value in (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    }
    assert samples['jacobi_rt_requests_total{code="200",endpoint="completions"}'] == 2
    assert samples['jacobi_rt_requests_total{code="400",endpoint="completions"}'] == 1
    assert samples['jacobi_rt_generations_total{outcome="finished"}'] == 2
    assert samples["jacobi_rt_target_passes_total"] <= 18  # greedy: 9 passes after the prefill's token
    assert samples["jacobi_rt_tokens_per_pass_count"] == 2
    assert samples['jacobi_rt_request_duration_seconds_count{endpoint="completions"}'] == 3
    assert samples['jacobi_rt_request_duration_seconds_bucket{endpoint="completions",le="+Inf"}'] == 3
    assert (
        samples["jacobi_rt_slots"] == generator("llama").default_slots() and samples["jacobi_rt_queue_capacity"] == 32
    )


def test_metrics_have_vllms_names(start_server):
    """Dashboards built for vLLM read these unchanged: vLLM's names, its model_name label."""
    import httpx

    server = start_server()
    with httpx.Client(base_url=server.url) as c:
        c.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 10})
        c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        text = c.get("/metrics").text
    samples = {
        name: float(value)
        for name, value in (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    }
    model = '{model_name="llama"}'
    assert samples["vllm:generation_tokens_total" + model] == 13
    assert samples["vllm:prompt_tokens_total" + model] > 2
    assert samples["vllm:num_requests_running" + model] == 0 and samples["vllm:num_requests_waiting" + model] == 0
    assert samples['vllm:request_success_total{finished_reason="length",model_name="llama"}'] == 2
    for histogram in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_generation_tokens",
    ):
        assert samples[histogram + "_count" + model] == 2, histogram
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    for line in text.splitlines():  # the exposition format: comments, or `name{labels} value`
        assert (
            line.startswith("# HELP ")
            or line.startswith("# TYPE ")
            or re.fullmatch(r'(vllm:|jacobi_rt_)[\w:]+(\{(\w+="[^"]*",?)+\})? [0-9.e+-]+', line)
        ), line


def samples_of(text: str) -> dict[str, float]:
    return {
        name: float(value)
        for name, value in (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    }


def test_metrics_count_every_choice(each_mode):
    """n=2: the metrics' generated tokens are usage's completion tokens (each choice is a generation)."""
    import httpx

    server = each_mode()
    with httpx.Client(base_url=server.url, timeout=60) as c:
        reply = c.post(
            "/v1/completions", json={"prompt": "The quick", "max_tokens": 7, "temperature": 1.0, "seed": 3, "n": 2}
        )
        samples = samples_of(c.get("/metrics").text)
    usage = reply.json()["usage"]
    assert usage["completion_tokens"] == 14
    assert samples['vllm:generation_tokens_total{model_name="llama"}'] == 14
    assert samples['vllm:request_generation_tokens_count{model_name="llama"}'] == 2
    assert samples['jacobi_rt_generations_total{outcome="finished"}'] == 1  # one request


def test_metrics_have_no_created_families_and_the_engines_pass_histograms(each_mode):
    import httpx

    server = each_mode()
    with httpx.Client(base_url=server.url, timeout=60) as c:
        c.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 3})
        text = c.get("/metrics").text
    assert "_created" not in text
    counts = {
        name: float(text.split(f"\n{name} ", 1)[1].split()[0])
        for name in ("jacobi_rt_batch_rows_count", "jacobi_rt_batch_tokens_count")
    }
    assert (
        counts["jacobi_rt_batch_rows_count"] == counts["jacobi_rt_batch_tokens_count"] >= 2
    )  # a prefill and a decoding pass at least


def test_health_in_batch_mode_counts_a_cancelled_row_until_its_pass_ends(artifact):
    """The client leaves, its worker lets go at once; the batcher's pass still runs its row, and /health says so."""
    import threading

    import httpx

    from jacobi_rt.runtime import Generator
    from jacobi_rt.server.run import BackgroundServer
    from jacobi_rt.server.settings import ServerSettings

    gen = Generator.load(artifact("llama"), graph="inplace", threads=1)
    with (
        BackgroundServer(gen, ServerSettings(model_id="llama", max_batch=4)) as server,
        httpx.Client(base_url=server.url, timeout=60) as c,
    ):
        first_piece_out, held, passes_go_on = threading.Event(), threading.Event(), threading.Event()

        def hold(record) -> None:  # 20 ms a pass; once the first piece has reached the client, the batcher waits
            if first_piece_out.is_set():
                held.set()
                passes_go_on.wait(20)
            time.sleep(0.02)

        gen.batcher.stats.observers.append(hold)
        with c.stream(
            "POST",
            "/v1/completions",
            json={"prompt": "The quick", "max_tokens": 200, "stream": True, "jacobi": {"strategy": "greedy"}},
        ) as response:
            next(response.iter_lines())
            first_piece_out.set()
            assert held.wait(20)
        limit = time.monotonic() + 20
        while 'jacobi_rt_generations_total{outcome="cancelled"} 1.0' not in c.get("/metrics").text:
            assert time.monotonic() < limit
            time.sleep(0.02)
        health = c.get("/health").json()
        running = gen.batcher.running
        passes_go_on.set()
    assert running == 1 and health["running"] == 1, health
