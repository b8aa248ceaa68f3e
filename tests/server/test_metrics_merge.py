"""merge_expositions over two real replicas' /metrics texts: every sample labelled by its replica, the
families kept whole, and no `*_created` sample (the replicas' own texts leave them out)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from jacobi_rt.server.metrics import Metrics
from jacobi_rt.server.metrics_merge import merge_expositions


def _replica(tokens: int) -> bytes:
    metrics = Metrics("m", running=lambda: 1, waiting=lambda: 0, slots=4, queue_size=8)
    metrics.generation_tokens.labels("m").inc(tokens)
    metrics.first_token.labels("m").observe(0.2)
    return metrics.render()


def test_two_replicas_merge_into_one_labelled_exposition_without_created_samples():
    merged = merge_expositions({"a": _replica(5), "b": _replica(7)}).decode()
    assert "_created" not in merged
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    tokens = {s.labels["replica"]: s.value for s in families["vllm:generation_tokens"].samples}
    assert tokens == {"a": 5.0, "b": 7.0}
    buckets = [s for s in families["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert sorted(s.labels["replica"] for s in buckets) == ["a", "b"]
