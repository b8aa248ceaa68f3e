"""merge_expositions: several replicas' /metrics texts as one Prometheus exposition, each sample
labelled with the replica it came from (`replica="..."`).

Families keep their names, help and type (vLLM's names stay vLLM's names), so one scrape covers every
replica and the cluster-wide figure is an aggregation over the label, e.g.
`sum without (replica) (rate(vllm:generation_tokens_total[1m]))` or
`histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket[5m])))`.
The replicas' texts carry no `*_created` samples (server/metrics.py leaves them out), so none are merged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

LABEL = "replica"


class _Families:
    """A collector that yields families already built (generate_latest needs a registry of collectors)."""

    def __init__(self, families: Iterable[Metric]):
        self.families = list(families)

    def collect(self) -> list[Metric]:
        return self.families


def merge_expositions(texts: Mapping[str, bytes | str], label: str = LABEL) -> bytes:
    """{replica id: exposition text} -> one exposition text (samples of a family grouped together)."""
    families: dict[str, Metric] = {}
    for replica, text in sorted(texts.items()):
        if isinstance(text, bytes):
            text = text.decode()
        for family in text_string_to_metric_families(text):
            merged = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type, family.unit)
            )
            merged.samples += [
                Sample(s.name, {**s.labels, label: replica}, s.value, s.timestamp, s.exemplar) for s in family.samples
            ]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families.values()))
    return generate_latest(registry)
