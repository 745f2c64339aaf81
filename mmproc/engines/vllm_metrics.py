"""The connector's counters in vLLM's per-connector metrics (vLLM 0.32.0 and 0.33.0 ship the same hooks): the engine
core reports counts since its last report (`get_ec_connector_stats`), vLLM's API process adds them to a Prometheus
counter `vllm:mmproc_ec_items_total{outcome=...}` on its /metrics and to its periodic "EC Transfer metrics" log line.

outcome: lookups (items looked up and ready), loaded (items sent to the worker to fetch), fallback (items vLLM encoded itself),
and one per `mmproc.engines.vllm_lookups.Failure` (a failed request, by why).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from vllm.distributed.ec_transfer.ec_connector.metrics import ECConnectorPromMetrics, ECConnectorStats


@dataclass
class MmprocStats(ECConnectorStats):
    """data: {outcome: count} since the last report."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: ECConnectorStats) -> ECConnectorStats:
        merged = Counter(self.data)
        merged.update(other.data)
        self.data = dict(merged)
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


def stats_since(counts: Counter[str], reported: Counter[str]) -> MmprocStats | None:
    """The counts added since `reported` (which then catches up), or None when nothing changed."""
    delta = {key: n - reported[key] for key, n in counts.items() if n != reported[key]}
    reported.update(delta)
    return MmprocStats(data=delta) if delta else None


class MmprocPromMetrics(ECConnectorPromMetrics):
    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._items = self._counter_cls(
            name="vllm:mmproc_ec_items",
            documentation="Multimodal items through the mmproc EC connector, by outcome (failures by reason)",
            labelnames=[*labelnames, "outcome"],
        )

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        labels = self.per_engine_labelvalues[engine_idx]
        for outcome, count in transfer_stats_data.items():
            if count:
                self._items.labels(*labels, outcome).inc(count)
