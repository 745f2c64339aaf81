"""Prometheus metrics of one Service, in its own CollectorRegistry (never the global default registry, so
that several servers in one process — tests — never collide). Served as `GET /metrics` on the HTTP address.

Every family is defined at start, so each is scrapeable with zero values before traffic; the list with
meanings: docs/deploy.md, "Metric families".
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import torch
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

import mmproc
from mmproc.errors import Reason
from mmproc.runner import BatchStats
from mmproc.transport.serialized.pinned_messages import PinnedMessages
from mmproc.v1 import encoder_pb2 as pb
from service.observe.gc_pauses import GcPauses
from service.observe.logs import dropped_log_records
from service.observe.thread_cpu import CpuByRole

# tier -> (hits, misses, coalesced, inserts, evictions, bytes, capacity bytes, entries); invalid replays; bypassed
CacheSnapshot = tuple[dict[str, tuple[int, ...]], int, int]
_CACHE_COUNTERS = ("hits", "misses", "coalesced", "inserts", "evictions")

STAGES = ("decode", "preprocess", "queue", "forward", "transport")
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
IMAGE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PATCH_BUCKETS = (256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)


class DecodeCounts(Protocol):
    """What the decode pool counts (service/pipeline/decode/pool.py), read at scrape time."""

    crashes: int
    quarantine_crashes: int
    retired: int
    quarantined: int


class _NoDecodePool:
    crashes = quarantine_crashes = retired = quarantined = 0


class _DecodeCollector:
    """The decode pool's own counters as Prometheus counters (the pool counts; nothing is copied per event)."""

    def __init__(self) -> None:
        self.pool: Callable[[], DecodeCounts] = _NoDecodePool

    def collect(self) -> Iterable[CounterMetricFamily]:
        pool = self.pool()
        crashes = CounterMetricFamily(
            "mmproc_decode_worker_crashes",
            "Decode workers that died (crash, signal, memory or time cap).",
            labels=["pool"],
        )
        crashes.add_metric(["shared"], pool.crashes)
        crashes.add_metric(["quarantine"], pool.quarantine_crashes)
        yield crashes
        yield CounterMetricFamily(
            "mmproc_decode_worker_retirements", "Decode workers replaced after an image ran out of its CPU-time budget.",
            value=pool.retired,
        )  # fmt: skip
        yield CounterMetricFamily(
            "mmproc_decode_quarantined_images", "Images retried alone after a decode worker crash or timeout.",
            value=pool.quarantined,
        )  # fmt: skip


class _PinnedRepliesCollector:
    def __init__(self) -> None:
        self.pinned: PinnedMessages | None = None

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        pinned = self.pinned
        yield GaugeMetricFamily(
            "mmproc_reply_pinned_bytes", "Page-locked reply messages the GPU writes serialized replies into "
            "(bounded by pinned_reply_mb): part of the server's resident memory.",
            value=0 if pinned is None else pinned.registered_bytes,
        )  # fmt: skip
        yield CounterMetricFamily(
            "mmproc_reply_pinned_misses", "Serialized replies from a GPU staged and copied instead: no idle "
            "page-locked message and no room for one.",
            value=0 if pinned is None else pinned.misses,
        )  # fmt: skip


class _LogDropsCollector:
    def collect(self) -> Iterable[CounterMetricFamily]:
        yield CounterMetricFamily(
            "mmproc_log_records_dropped", "Log records dropped, not waited for: the log's reader had fallen "
            "behind and the writer's queue was full (service/observe/log_writer.py).",
            value=dropped_log_records(),
        )  # fmt: skip


class Metrics:
    """Every metric family of one Service. Attributes are prometheus_client objects: `metrics.ipc_leases.set(3)`."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)

        self.requests = Counter(
            "mmproc_requests", "Finished requests (refusals included) by front end, gRPC method or HTTP route, and "
            "gRPC code.", ["front_end", "method", "code"], registry=r,
        )  # fmt: skip
        self.request_seconds = Histogram(
            "mmproc_request_duration_seconds", "Request latency seen by the server.", ["front_end", "method"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.rejections = Counter("mmproc_rejections", "Refused requests by reason.", ["reason"], registry=r)
        for reason in Reason:  # every client-error reason scrapeable at 0 before its first refusal
            self.rejections.labels(reason.value)
        self.loop_lag = Histogram(
            "mmproc_event_loop_lag_seconds", "How late the event loop ran a due timer (every request waits as long).",
            buckets=LOOP_LAG_BUCKETS, registry=r,
        )  # fmt: skip
        self.gc_pause = GcPauses(LOOP_LAG_BUCKETS)  # observes while installed (`with`: only `mmproc serve` does)
        r.register(self.gc_pause)
        self.images = Counter("mmproc_images_encoded", "Images run through the encoder.", registry=r)
        self.tokens = Counter("mmproc_tokens_encoded", "Embedding tokens produced.", registry=r)
        self.stage_seconds = Histogram(
            "mmproc_stage_duration_seconds", "Time spent per pipeline stage.", ["stage"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        for stage in STAGES:  # present with zero samples from the start
            self.stage_seconds.labels(stage)
        self.batch_images = Histogram(
            "mmproc_batch_images", "Images per packed forward.", buckets=IMAGE_BUCKETS, registry=r
        )
        self.batch_patches = Histogram(
            "mmproc_batch_patches", "Patches per packed forward.", buckets=PATCH_BUCKETS, registry=r
        )
        self.queue_images = Gauge("mmproc_queue_images", "Images waiting for the encoder.", registry=r)
        self.inflight_requests = Gauge("mmproc_inflight_requests", "Requests admitted, not finished.", registry=r)
        self.ready = Gauge("mmproc_ready", "1 while the server reports SERVING.", registry=r)
        self.dropped_images = Counter(
            "mmproc_dropped_images", "Images of expired or cancelled requests dropped unencoded or undelivered.",
            ["stage"], registry=r,
        )  # fmt: skip
        for stage in ("decode", "batching", "queue", "late", "delivery"):
            self.dropped_images.labels(stage)
        self.pending_bytes = Gauge("mmproc_pending_bytes", "Decoded pixels waiting for the encoder.", registry=r)
        self.reply_bytes_in_flight = Gauge(
            "mmproc_reply_bytes_in_flight",
            "Serialized reply bytes staged or being sent (bounded by max_reply_mb).",
            registry=r,
        )
        self.estimated_wait = Gauge(
            "mmproc_estimated_wait_seconds", "Estimated encoder work ahead of a request arriving now.", registry=r
        )
        self.forward_cost = Gauge(
            "mmproc_forward_cost_seconds",
            "The admission's fitted cost of a forward (overload.py BatchCost): fixed, per_patch, per_image.",
            ["part"],
            registry=r,
        )
        self.estimate_overrun = Gauge(
            "mmproc_estimate_overrun_seconds",
            "How much longer admitted requests took than the admission's model said (weighted mean); every "
            "admission estimate adds it when positive.",
            registry=r,
        )
        self.decode_paths = Counter(
            "mmproc_decoded_images", "Images by where they were decoded: gpu, fallback (to the CPU after the GPU "
            "failed them) or cpu (not a JPEG the GPU takes, or no GPU decoder).", ["path"], registry=r,
        )  # fmt: skip
        for path in ("gpu", "fallback", "cpu"):
            self.decode_paths.labels(path)
        self.decode_workers_rss = Gauge(
            "mmproc_decode_workers_resident_bytes", "Resident memory of the decode worker processes.", registry=r
        )
        self.pinned_host_bytes = Gauge(
            "mmproc_pinned_host_bytes",
            "Page-locked host memory held by torch's pinned allocator (reply staging buffers, in use and cached "
            "for reuse): part of the server's resident memory.",
            registry=r,
        )
        self.pinned_host_bytes.set_function(_pinned_host_bytes)

        # IPC transport: defined here, updated once the IPC transport starts (service/app/transports.py).
        self.ipc_pool_bytes = Gauge("mmproc_ipc_pool_bytes_in_use", "IPC pool bytes leased out.", registry=r)
        self.ipc_pool_capacity_bytes = Gauge("mmproc_ipc_pool_capacity_bytes", "IPC pool size.", registry=r)
        self.ipc_leases = Gauge("mmproc_ipc_leases", "IPC leases outstanding.", registry=r)
        self.ipc_fallbacks = Counter(
            "mmproc_ipc_fallbacks", "Requests that asked for IPC and got a serialized reply.", registry=r
        )
        self._decode = _DecodeCollector()
        r.register(self._decode)
        self._pinned = _PinnedRepliesCollector()
        r.register(self._pinned)
        self.build_info = Info("mmproc_build", "The server's version; the model it serves once loaded.", registry=r)
        self.build_info.info({"version": mmproc.__version__})
        self.ipc_sessions_opened = Counter(
            "mmproc_ipc_sessions_opened",
            "IPC consumer sessions opened; each consumer process opens the pool handle once per session "
            "(its own handle-cache counters are in EncoderClient.ipc_stats).",
            registry=r,
        )
        self._cache_collector: _CacheCollector | None = None  # registered with the first pipeline's cache
        self._cpu = CpuByRole()  # mmproc_cpu_seconds_total{role}, read from /proc at scrape time
        r.register(self._cpu)
        r.register(_LogDropsCollector())

    # -- helpers for the pipeline and the front ends ---------------------------------------------------

    def stage(self, name: str) -> Histogram:
        return self.stage_seconds.labels(name)

    @contextlib.contextmanager
    def time_stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.stage_seconds.labels(name).observe(time.perf_counter() - started)

    def observe_request(self, method: str, code: str, seconds: float) -> None:
        """method: a gRPC method name, or "http:" and the HTTP route (front_end="http", method="/v1/encode")."""
        labels = ("http", method.removeprefix("http:")) if method.startswith("http:") else ("grpc", method)
        self.requests.labels(*labels, code).inc()
        self.request_seconds.labels(*labels).observe(seconds)

    def observe_batch(self, stats: BatchStats) -> None:
        """Called on the runner thread after every forward."""
        self.images.inc(stats.num_images)
        self.tokens.inc(stats.num_tokens)
        self.batch_images.observe(stats.num_images)
        self.batch_patches.observe(stats.num_patches)
        self.stage_seconds.labels("queue").observe(stats.queue_wait_s)
        self.stage_seconds.labels("forward").observe(stats.forward_s)

    def track(self, *, queue_images: Callable[[], float], inflight_requests: Callable[[], float]) -> None:
        """Gauges read at scrape time from the pipeline that owns the numbers."""
        self.queue_images.set_function(queue_images)
        self.inflight_requests.set_function(inflight_requests)

    def track_decode(self, pool: Callable[[], DecodeCounts]) -> None:
        """Decode counters read at scrape time from `pool()`, the pipeline's current decode pool."""
        self._decode.pool = pool

    def track_pinned_replies(self, pinned: PinnedMessages | None) -> None:
        """The page-locked reply messages' size and misses, read at scrape time (None: none, both 0)."""
        self._pinned.pinned = pinned

    def describe(self, info: pb.ServerInfo) -> None:
        """mmproc_build_info's labels from the ServerInfo published once the model is loaded."""
        self.build_info.info(
            {
                "version": mmproc.__version__,
                "model": info.model_name,
                "family": info.family,
                "layout": info.family,  # deprecated alias of family (existing dashboards group by it)
                "dtype": pb.DType.Name(info.dtype).removeprefix("DTYPE_").lower(),
                "quantization": info.quantization or "none",
                "device": info.device,
                "transport": info.transport_names[0] if info.transport_names else "serialized",
            }
        )

    def track_overload(
        self,
        *,
        pending_bytes: Callable[[], float],
        estimated_wait: Callable[[], float],
        estimate_overrun: Callable[[], float],
        worker_pids: Callable[[], list],
        forward_cost: dict[str, Callable[[], float]],
    ) -> None:
        """Overload gauges, read at scrape time (service/pipeline/overload.py, the decode pool's workers).
        forward_cost: the fitted forward cost's parts by name."""
        self.pending_bytes.set_function(pending_bytes)
        self.estimated_wait.set_function(estimated_wait)
        for part, read in forward_cost.items():
            self.forward_cost.labels(part).set_function(read)
        self.estimate_overrun.set_function(estimate_overrun)
        self.decode_workers_rss.set_function(lambda: sum(_resident_bytes(pid) for pid in worker_pids()))

    def track_cpu(self, worker_pids: Callable[[], list[int]]) -> None:
        """The decode worker processes whose CPU time is reported as role decode_workers, read at scrape time."""
        self._cpu.worker_pids = worker_pids

    def track_ipc(self, stats: Callable[[], object], capacity: int) -> None:
        """IPC pool gauges, read at scrape time from the pool's lease table (`stats()` -> LeaseStats)."""
        self.ipc_pool_capacity_bytes.set(capacity)
        self.ipc_pool_bytes.set_function(lambda: stats().bytes_in_use)
        self.ipc_leases.set_function(lambda: stats().leases_active)

    def track_cache(self, snapshot: Callable[[], CacheSnapshot]) -> None:
        """Embedding cache families, read from the cache at scrape time (it keeps its own counts); a later pipeline
        on the same Metrics replaces the earlier one's source."""
        collector = self._cache_collector
        if collector is None:
            collector = self._cache_collector = _CacheCollector(snapshot)
            self.registry.register(collector)
        collector.snapshot = snapshot

    def render(self) -> tuple[bytes, str]:
        """(body, content type) of the text exposition format."""
        return generate_latest(_WithoutCreated(self.registry)), CONTENT_TYPE_LATEST


class _WithoutCreated:
    """The registry less each counter's and histogram's `_created` series (a second series per family that no
    dashboard reads); per registry, not prometheus_client's process-wide switch."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            family.samples = [s for s in family.samples if s.name != f"{family.name}_created"]
            yield family


class _CacheCollector:
    def __init__(self, snapshot: Callable[[], CacheSnapshot]) -> None:
        self.snapshot = snapshot

    def describe(self) -> list:
        return []  # collected lazily: nothing to read before the pipeline exists

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        tiers, invalid, bypassed = self.snapshot()
        for i, name in enumerate(_CACHE_COUNTERS):
            family = CounterMetricFamily(f"mmproc_cache_{name}", f"Embedding cache {name} by tier.", labels=["tier"])
            for tier, values in tiers.items():
                family.add_metric([tier], values[i])
            yield family
        for i, (name, doc) in enumerate(
            (("bytes", "Bytes the cache holds."), ("capacity_bytes", "Bytes bound."), ("entries", "Images kept.")), 5
        ):
            family = GaugeMetricFamily(f"mmproc_cache_{name}", f"Embedding cache: {doc}", labels=["tier"])
            for tier, values in tiers.items():
                family.add_metric([tier], values[i])
            yield family
        yield CounterMetricFamily(
            "mmproc_cache_invalid_replays", "Invalid images refused from memory, not decoded again.", value=invalid
        )
        yield CounterMetricFamily(
            "mmproc_cache_bypassed", "Images of requests that bypassed the cache.", value=bypassed
        )


def _pinned_host_bytes() -> float:
    """Bytes of the pinned blocks torch's host allocator owns (0 before CUDA is initialized: none yet)."""
    if not torch.cuda.is_initialized():
        return 0.0
    return float(torch.cuda.host_memory_stats().get("allocated_bytes.current", 0))


def _resident_bytes(pid: int) -> int:
    """RSS of a process from /proc (0 when it is gone or /proc is absent)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
