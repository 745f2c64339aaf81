"""Python's cyclic garbage collector in the serving process: start-up's objects frozen out of its scans, and every
collection's pause measured.

A collection holds the GIL from start to end, so every thread stops for it: the event loop answers nobody, refusals
included. A full one walks every tracked object, and a server with torch, gRPC and FastAPI loaded has ~200k of them
before any request (0.1 s a pass on a CPU host, docs/reliability.md "Overload"). Under load the requests' own
objects survive long enough (queued, decoded, waiting for a forward) to trigger full passes every few seconds.
Freezing what start-up made (modules, the model's Python objects, the warm-up's leftovers) leaves each full pass
only the objects made since. The price: a frozen object that later ends up in an unreachable cycle is never freed;
what start-up makes lives as long as the server anyway. Process-wide: only `mmproc serve` does it, once its model
is loaded.
"""

from __future__ import annotations

import gc
import logging
import time
from types import TracebackType

from prometheus_client import Histogram

logger = logging.getLogger(__name__)

GENERATIONS = ("0", "1", "2")


def freeze_start_up_objects() -> int:
    """Collect once, then move every object alive now to the generation the collector never scans; their
    reference counts still free them. Returns how many objects were frozen."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info(
        "garbage collector: %d start-up objects frozen out of its scans (%.0f ms)",
        frozen,
        (time.perf_counter() - started) * 1e3,
    )
    return frozen


class GcPauses:
    """Observes each collection's duration, by generation, into `histogram` while installed (a `with` block).
    gc.callbacks run with the GIL held and collections never nest, so one start time is enough."""

    def __init__(self, histogram: Histogram) -> None:
        self._by_generation = [histogram.labels(g) for g in GENERATIONS]  # bound once: no label lookup per pass
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._by_generation[info["generation"]].observe(time.perf_counter() - self._started)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        gc.callbacks.remove(self)
