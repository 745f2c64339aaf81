"""Python's cyclic garbage collector in the serving process: start-up's objects frozen out of its scans (a full
pass holds the GIL; docs/reliability.md, "Overload"), and every collection's pause measured. Process-wide: only
`mmproc serve` freezes, once its model is loaded."""

from __future__ import annotations

import bisect
import gc
import itertools
import logging
import math
import time
from collections.abc import Iterator, Sequence
from types import TracebackType

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

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
    """Each collection's pause by generation, as the histogram `mmproc_gc_pause_seconds`, while installed.

    The callback takes no lock (it runs in any thread, GIL held: it could wait on its own thread); collections
    never overlap, so it alone writes the lists."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self._bounds = [*buckets, math.inf]
        self._counts = [[0] * len(self._bounds) for _ in GENERATIONS]  # per generation, per bucket (not cumulative)
        self._sums = [0.0] * len(GENERATIONS)
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause, generation = time.perf_counter() - self._started, info["generation"]
        self._counts[generation][bisect.bisect_left(self._bounds, pause)] += 1
        self._sums[generation] += pause

    def describe(self) -> list:
        return []  # nothing to read before the first collection

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "mmproc_gc_pause_seconds",
            "Pauses of Python's garbage collector, by generation (every thread waits).",
            labels=["generation"],
        )
        for generation, counts, total in zip(GENERATIONS, self._counts, self._sums, strict=True):
            cumulative = itertools.accumulate(counts)
            buckets = [(floatToGoString(bound), n) for bound, n in zip(self._bounds, cumulative, strict=True)]
            family.add_metric([generation], buckets, sum_value=total)
        yield family

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        gc.callbacks.remove(self)
