"""The load generator's own health: how late its event loop runs, and its CPU (a busy loop adds to the latency it
measures)."""

from __future__ import annotations

import asyncio
import time

from mmproc.bench.serve_stats import stats_ms


class LoopWatch:
    """Sleeps `period_s` over and over on the running loop and keeps how late each wake-up came; `stop()` gives
    that lag's statistics (ms) and the CPU the loop's thread used, as a share of one core."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self._lags: list[float] = []
        self._task: asyncio.Task | None = None
        self._cpu0 = self._wall0 = 0.0

    def start(self) -> None:
        self._cpu0, self._wall0 = time.thread_time(), time.perf_counter()  # the loop's thread: the caller's
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            due = time.perf_counter() + self.period_s
            await asyncio.sleep(self.period_s)
            self._lags.append(max(0.0, time.perf_counter() - due))

    def stop(self) -> dict:
        """{"lag_ms": stats (count, p50, p99, max, ...), "loop_cpu_share": CPU seconds / wall seconds}."""
        assert self._task is not None, "stop() before start()"
        self._task.cancel()
        cpu, wall = time.thread_time() - self._cpu0, time.perf_counter() - self._wall0
        return {"lag_ms": stats_ms(self._lags), "loop_cpu_share": cpu / wall if wall > 0 else 0.0}


def worst(watches: list[dict]) -> dict:
    """Across client processes: each statistic at its worst (the largest lag, the busiest loop)."""
    lags = [w["lag_ms"] for w in watches if w["lag_ms"]]
    return {
        "processes": len(watches),
        "lag_ms": {k: max(lag[k] for lag in lags) for k in ("p50", "p99", "max")} if lags else None,
        "loop_cpu_share": max((w["loop_cpu_share"] for w in watches), default=0.0),
    }
