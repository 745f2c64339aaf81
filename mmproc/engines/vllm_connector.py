"""`MmprocECConnector`: the encoder-cache ("EC") connector vLLM loads (`ec_role=ec_consumer`); mmproc is the producer.

Scheduler side: each request's items are looked up in mmproc off the scheduler thread (mmproc.engines.vllm_lookups);
a missing key, a request without uuids, mmproc's rows != vLLM's placeholders or an unreachable mmproc fail just that
request, at once (`take_unavailable_requests`), unless `fallback_to_vllm` lets vLLM encode it itself. Worker side:
the step's keys are fetched into vLLM's encoder cache (mmproc.engines.vllm_fetch). Written against vLLM 0.32.0's
`ECConnectorBase`, the same file in 0.33.0. The flow: docs/engines.md.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase,
    ECConnectorMetadata,
    ECConnectorRole,
    ECConnectorWorkerMetadata,
)

from mmproc.client import EncoderClient
from mmproc.engines.vllm_fetch import fetch_rows
from mmproc.engines.vllm_lookups import ConnectorConfig, Lookups, Verdict
from mmproc.engines.vllm_metrics import MmprocPromMetrics, MmprocStats, stats_since

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import ECConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)


@dataclass
class MmprocLoadMetadata(ECConnectorMetadata):
    """Scheduler -> worker, per step: encoder-cache keys to fetch and the rows vLLM expects for each."""

    loads: dict[str, int] = field(default_factory=dict)


@dataclass
class MmprocWorkerMetadata(ECConnectorWorkerMetadata):
    """Worker -> scheduler: keys whose fetch failed, with why."""

    failed: dict[str, str] = field(default_factory=dict)

    def aggregate(self, other: ECConnectorWorkerMetadata) -> ECConnectorWorkerMetadata:
        assert isinstance(other, MmprocWorkerMetadata)
        return MmprocWorkerMetadata({**self.failed, **other.failed})


class MmprocECConnector(ECConnectorBase):
    """Consumer-side EC connector whose "cache" is mmproc's key store (the flow: docs/engines.md)."""

    def __init__(self, vllm_config: VllmConfig, role: ECConnectorRole) -> None:
        super().__init__(vllm_config=vllm_config, role=role)
        if self.is_producer:
            raise ValueError("MmprocECConnector is a consumer: use ec_role ec_consumer (mmproc is the producer)")
        transfer = vllm_config.ec_transfer_config
        self.config = ConnectorConfig.from_extra(dict(transfer.ec_connector_extra_config or {}))
        model = vllm_config.model_config
        self._hidden = model.get_hidden_size()
        self._dtype = model.dtype
        self._counts: Counter[str] = Counter()
        self._reported: Counter[str] = Counter()
        self._logged_at = time.monotonic()
        if role == ECConnectorRole.SCHEDULER:
            self._client = EncoderClient(self.config.target, transport="serialized", token=self.config.token)
            self._pool = ThreadPoolExecutor(self.config.lookup_threads, thread_name_prefix="mmproc-lookup")
            self._lookups = Lookups(self.config, self._client, self._pool)
            self._counts = self._lookups.counts
            self._loads: dict[str, int] = {}
        else:
            self._device = _worker_device()
            transport = self.config.transport if self._device.type == "cuda" else "serialized"
            self._client = EncoderClient(
                self.config.target, device=self._device, transport=transport, token=self.config.token
            )
            self._worker_failed: dict[str, str] = {}

    # -- scheduler side -----------------------------------------------------------------------------

    def ensure_cache_available(self, request: Request, num_computed_tokens: int) -> bool:
        """True once every item of `request` is held by mmproc with vLLM's row count (or left to vLLM's encoder by
        the fallback); False while a lookup is in flight (the request waits a step) or after a failure (the
        scheduler then fails it through `take_unavailable_requests`)."""
        items = [(f.identifier, request.get_num_encoder_embeds(i)) for i, f in enumerate(request.mm_features)]
        return self._lookups.check(request.request_id, items) is Verdict.READY

    def has_cache_item(self, identifier: str) -> bool:
        return self._lookups.held(identifier)

    def update_state_after_alloc(self, request: Request, index: int) -> None:
        identifier = request.mm_features[index].identifier
        if self._lookups.held(identifier):
            self._loads[identifier] = request.get_num_encoder_embeds(index)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> ECConnectorMetadata:
        meta, self._loads = MmprocLoadMetadata(self._loads), {}
        self._counts["loaded"] += len(meta.loads)  # counted here: vLLM's CPU runner takes no worker-side stats
        self._log_counts()
        return meta

    def update_connector_output(self, connector_output: ECConnectorOutput) -> None:
        meta = connector_output.ec_connector_worker_meta
        if isinstance(meta, MmprocWorkerMetadata):
            for identifier, reason in meta.failed.items():
                self._lookups.fetch_failed(identifier, reason)

    def take_unavailable_requests(self) -> set[str]:
        return set(self._lookups.take_failed())

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        self._lookups.finished(request.request_id, [f.identifier for f in request.mm_features])
        return False, None

    # -- metrics (both sides) -----------------------------------------------------------------------

    def get_ec_connector_stats(self) -> MmprocStats | None:
        return stats_since(self._counts, self._reported)

    @classmethod
    def build_ec_connector_stats(cls, data: dict[str, Any] | None = None) -> MmprocStats | None:
        return MmprocStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> MmprocPromMetrics:
        return MmprocPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def _log_counts(self) -> None:
        """A counters line at most every `stats_log_interval_s`, for deployments that do not scrape /metrics."""
        interval = self.config.stats_log_interval_s
        now = time.monotonic()
        if interval > 0 and now - self._logged_at >= interval and self._counts:
            self._logged_at = now
            logger.info("mmproc connector (since start): %s", dict(sorted(self._counts.items())))

    # -- worker side --------------------------------------------------------------------------------

    def start_load_caches(self, encoder_cache: dict[str, torch.Tensor], **kwargs: Any) -> None:
        """Fetch this step's keys from mmproc into `encoder_cache` ((rows, hidden) in the model's dtype). A failed
        fetch leaves zero rows for this step (so the batch runs) and reports the key, whose requests then fail."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, MmprocLoadMetadata)
        wanted = {key: rows for key, rows in meta.loads.items() if key not in encoder_cache}
        if not wanted:
            return
        tensors, failed = fetch_rows(self._client, wanted, self._hidden, self.config.fetch_timeout_s)
        self._worker_failed.update(failed)
        for key, rows in wanted.items():
            tensor = tensors.get(key)
            if tensor is None:
                logger.error("mmproc fetch of key %r failed: %s", key, failed[key])
                tensor = torch.zeros(rows, self._hidden, dtype=self._dtype, device=self._device)
            encoder_cache[key] = tensor.to(device=self._device, dtype=self._dtype)

    def save_caches(self, encoder_cache: dict[str, torch.Tensor], mm_hash: str, **kwargs: Any) -> None:
        return  # consumer only: mmproc produces

    def build_connector_worker_meta(self) -> ECConnectorWorkerMetadata | None:
        if not self._worker_failed:
            return None
        meta, self._worker_failed = MmprocWorkerMetadata(self._worker_failed), {}
        return meta

    def shutdown(self) -> None:
        if self.role == ECConnectorRole.SCHEDULER:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()


def _worker_device() -> torch.device:
    from vllm.platforms import current_platform

    if current_platform.is_cuda_alike():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(current_platform.device_type)
