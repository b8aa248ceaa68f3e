"""/health, /v1/models and the Prometheus metrics."""

from __future__ import annotations

import re


def test_health(client):
    assert client.get("/health").json() == {"status": "ok", "model": "llama", "running": 0, "queued": 0}


def test_models_lists_the_artifact(client, generator):
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["llama"]
    card = body["data"][0]
    assert card["object"] == "model" and card["jacobi"]["max_context"] == generator("llama").manifest.max_context
    assert client.get("/v1/models/llama").json() == card


def test_metrics_count_requests_tokens_and_passes(start_server):
    import httpx

    server = start_server()
    with httpx.Client(base_url=server.url) as c:
        for strategy in ("greedy", "jacobi"):
            c.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 10, "jacobi": {"strategy": strategy}})
        c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 0})
        response = c.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    samples = {name: float(value) for name, value in
               (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))}
    assert samples['jacobi_rt_requests_total{code="200",endpoint="completions"}'] == 2
    assert samples['jacobi_rt_requests_total{code="400",endpoint="completions"}'] == 1
    assert samples['jacobi_rt_generations_total{outcome="finished"}'] == 2
    assert samples["jacobi_rt_target_passes_total"] <= 18  # greedy: 9 passes after the prefill's token
    assert samples["jacobi_rt_tokens_per_pass_count"] == 2
    assert samples['jacobi_rt_request_duration_seconds_count{endpoint="completions"}'] == 3
    assert samples['jacobi_rt_request_duration_seconds_bucket{endpoint="completions",le="+Inf"}'] == 3
    assert samples["jacobi_rt_workers"] == 1 and samples["jacobi_rt_queue_capacity"] == 32


def test_metrics_have_vllms_names(start_server):
    """Dashboards built for vLLM read these unchanged: vLLM's names, its model_name label."""
    import httpx

    server = start_server()
    with httpx.Client(base_url=server.url) as c:
        c.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 10})
        c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        text = c.get("/metrics").text
    samples = {name: float(value) for name, value in
               (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))}
    model = '{model_name="llama"}'
    assert samples["vllm:generation_tokens_total" + model] == 13
    assert samples["vllm:prompt_tokens_total" + model] > 2
    assert samples["vllm:num_requests_running" + model] == 0 and samples["vllm:num_requests_waiting" + model] == 0
    assert samples['vllm:request_success_total{finished_reason="length",model_name="llama"}'] == 2
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                      "vllm:request_queue_time_seconds", "vllm:request_generation_tokens"):
        assert samples[histogram + "_count" + model] == 2, histogram
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    for line in text.splitlines():  # the exposition format: comments, or `name{labels} value`
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or \
            re.fullmatch(r'(vllm:|jacobi_rt_)[\w:]+(\{(\w+="[^"]*",?)+\})? [0-9.e+-]+', line), line
