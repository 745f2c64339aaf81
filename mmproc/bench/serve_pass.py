"""What one measured pass of `bench serve` is made of: its client settings, payloads, progress line and result."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time

from mmproc.bench.serve_server import Scrape
from mmproc.bench.serve_stats import Sample

Payload = tuple[int, tuple[bytes, ...]]  # (request index, encoded images)


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    target: str
    transport: str
    handle_cache: bool
    device: str
    timeout: float
    consume: str  # "copy": clone the embeddings (what encode_images does) | "view": read them in place
    cache: bool = True  # False: every request sets cache_bypass (the server's embedding cache is not used)


class Progress:
    """`done/total` and rate on one stderr line, at most 10 redraws a second; silent when disabled."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self.done = 0
        self._lock = threading.Lock()
        self._start = self._drawn = time.perf_counter()

    def tick(self) -> None:
        with self._lock:
            self.done += 1
            now = time.perf_counter()
            if self.enabled and (now - self._drawn >= 0.1 or self.done == self.total):
                self._drawn = now
                filled = 30 * self.done // max(1, self.total)
                rate = self.done / max(1e-9, now - self._start)
                sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] "
                                 f"{self.done}/{self.total} {rate:.1f} req/s")  # fmt: skip
                sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


@dataclasses.dataclass
class Phase:
    """One measured pass of the workload with fresh clients (perf_counter t0; counts: dropped/late/not_sent)."""

    samples: list[Sample]
    wall_s: float
    t0: float
    counts: dict[str, int]
    ipc_stats: dict[str, int] | None
    stage_split: bool
    scrapes: list[Scrape] = dataclasses.field(default_factory=list)  # the server's metrics: before, after
