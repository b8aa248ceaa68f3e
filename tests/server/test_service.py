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
        c.post("/v1/completions", json={"prompt": "hi", "temperature": 2})
        response = c.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert samples['jacobi_rt_requests_total{endpoint="completions",code="200"}'] == "2"
    assert samples['jacobi_rt_requests_total{endpoint="completions",code="400"}'] == "1"
    assert samples["jacobi_rt_completion_tokens_total"] == "20"
    assert samples['jacobi_rt_generations_total{outcome="finished"}'] == "2"
    assert int(samples["jacobi_rt_target_passes_total"]) <= 18  # greedy: 9 passes after the prefill's token
    assert samples["jacobi_rt_tokens_per_pass_count"] == "2"
    assert samples['jacobi_rt_request_duration_seconds_count{endpoint="completions"}'] == "3"
    assert samples['jacobi_rt_request_duration_seconds_bucket{endpoint="completions",le="+Inf"}'] == "3"
    assert samples["jacobi_rt_time_to_first_token_seconds_count"] == "2"
    for line in text.splitlines():  # the exposition format: comments, or `name{labels} value`
        assert line.startswith("# HELP jacobi_rt_") or line.startswith("# TYPE jacobi_rt_") or \
            re.fullmatch(r'jacobi_rt_\w+(\{(\w+="[^"]*",?)+\})? [0-9.e+-]+', line), line
