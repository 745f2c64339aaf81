"""The load phases of `bench serve --mode open`, driven from this process or from `--clients N` client processes.

Each process runs its own Poisson stream of rate / N (their sum is Poisson at the total rate), all from one instant."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import gc
import time
from collections.abc import Callable

from mmproc.bench.client_processes import ClientProcesses
from mmproc.bench.loop_watch import LoopWatch
from mmproc.bench.open_load import Load, Outcome, base_images, closed_loop, open_loop, unique_jpeg

STRIDE = 10**6  # image indices per process within a phase (phases start 10**8 apart): every image unique


@dataclasses.dataclass(frozen=True)
class OpenPhase:
    """What the open-loop phase and the recovery probe after it measured, pooled over the client processes."""

    load: list[Outcome]
    recovery: list[Outcome]
    t_stop: float  # perf_counter when the arrivals stopped (the last process's)
    generator: list[dict]  # each process's LoopWatch over its arrivals


class LocalPhases:
    """The phases on this process's event loop."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args
        self._load: Load | None = None
        self._base: list[bytes] = []

    async def start(self) -> None:
        self._load = Load(self._args)
        self._base = base_images(self._args)

    async def closed(self, first: int, seconds: float) -> list[Outcome]:
        assert self._load is not None
        return await closed_loop(self._load, self._base, first, seconds, self._args.concurrency)

    async def open_then_recover(self, first: int, rate: float, seconds: float, recovery_first: int) -> OpenPhase:
        """Open-loop arrivals at `rate` for `seconds`, then the closed-loop recovery probe at once."""
        assert self._load is not None
        images = _open_images(self._base, first, rate, seconds)
        return await _open_then_recover(
            self._load, self._base, images, self._args, rate, seconds, self._args.seed, recovery_first
        )

    async def close(self) -> None:
        if self._load is not None:
            await self._load.close()


class ProcessPhases:
    """The phases in `n` client processes (client_processes.py), each on its own event loop."""

    def __init__(self, args: argparse.Namespace, n: int) -> None:
        self._args, self._n = args, n
        self._processes: ClientProcesses | None = None

    async def start(self) -> None:
        options = {k: v for k, v in vars(self._args).items() if k not in ("json", "server_log", "func")}
        self._processes = ClientProcesses(self._n, functools.partial(_PhaseRunner, options))
        await asyncio.to_thread(self._processes.start)  # each opened its clients and made its images

    async def closed(self, first: int, seconds: float) -> list[Outcome]:
        parts = await self._run(("closed", first, seconds), seconds)
        return [o for part in parts for o in part]

    async def open_then_recover(self, first: int, rate: float, seconds: float, recovery_first: int) -> OpenPhase:
        command = ("open", first, rate / self._n, seconds, recovery_first)
        parts: list[OpenPhase] = await self._run(command, seconds + self._args.recovery_seconds)
        return OpenPhase(
            load=[o for p in parts for o in p.load],
            recovery=[o for p in parts for o in p.recovery],
            t_stop=max(p.t_stop for p in parts),
            generator=[w for p in parts for w in p.generator],
        )

    async def close(self) -> None:
        if self._processes is not None:
            await asyncio.to_thread(self._processes.close)

    async def _run(self, command: tuple, seconds: float) -> list:
        assert self._processes is not None
        wait = seconds + max(self._args.deadline_s, self._args.http_wait_s) + 60  # the last calls still in flight
        return await asyncio.to_thread(self._processes.run, [command] * self._n, wait)


class _PhaseRunner:
    """A client process's side of ProcessPhases: its clients and images live on one event loop across commands."""

    def __init__(self, options: dict, index: int) -> None:
        self._args, self._index = argparse.Namespace(**options), index
        self._loop = asyncio.new_event_loop()
        self._load = self._loop.run_until_complete(self._open())
        self._base = base_images(self._args)

    async def _open(self) -> Load:
        return Load(self._args)

    def __call__(self, kind: str, *params: float, start: Callable[[], None]) -> object:
        return self._loop.run_until_complete(self._phase(kind, params, start))

    async def _phase(self, kind: str, params: tuple, start: Callable[[], None]) -> object:
        args, offset = self._args, self._index * STRIDE
        if kind == "closed":
            first, seconds = params
            await asyncio.to_thread(start)
            return await closed_loop(self._load, self._base, first + offset, seconds, args.concurrency)
        first, rate, seconds, recovery_first = params
        images = _open_images(self._base, first + offset, rate, seconds)
        await asyncio.to_thread(start)
        return await _open_then_recover(  # an independent Poisson stream per process
            self._load, self._base, images, args, rate, seconds, args.seed + self._index, recovery_first + offset
        )

    def close(self) -> None:
        self._loop.run_until_complete(self._load.close())
        self._loop.close()


def _open_images(base: list[bytes], first: int, rate: float, seconds: float) -> list[bytes]:
    """The open phase's images, made before its start; then this process's objects are frozen out of the garbage
    collector's scans until the load is over (`_open_then_recover`): a full pass over them (~0.1 s with torch
    loaded) would stall this client's loop in the middle of the load and add to the latencies it measures."""
    arrivals = int(rate * seconds * 1.2) + 100  # Poisson: room for more than the mean
    images = [unique_jpeg(base[i % len(base)], first + i) for i in range(arrivals)]
    gc.collect()
    gc.freeze()
    return images


async def _open_then_recover(
    load: Load, base: list[bytes], images: list[bytes], args: argparse.Namespace, rate: float, seconds: float,
    seed: int, recovery_first: int,
) -> OpenPhase:  # fmt: skip
    try:
        watch = LoopWatch()
        watch.start()
        tasks = await open_loop(load, images, rate, seconds, seed, args.batch_fraction)
        t_stop = time.perf_counter()
        generator = watch.stop()
        recovery = await closed_loop(load, base, recovery_first, args.recovery_seconds, args.concurrency)
        return OpenPhase(list(await asyncio.gather(*tasks)), recovery, t_stop, [generator])
    finally:
        gc.unfreeze()  # frozen for the load only (`_open_images`): a process that goes on collects as before
