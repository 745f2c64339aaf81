"""The load phases of `bench serve --mode open`, driven from this process or from `--clients N` client processes.

One Python process cannot take in replies fast enough to overload a GPU server with small images (at 448² on the
H200 the server answered calls the client had already given up on: docs/benchmarks/overload.md). With N processes
each one runs `--concurrency` closed-loop clients and its own Poisson stream of rate / N (a sum of independent
Poisson streams is the Poisson stream of the total rate); all start at one instant of the system's monotonic
clock, which `time.perf_counter` reads in every process, so their outcomes pool into one timeline.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time

from mmproc.bench.serve_open import Load, Outcome, base_images, closed_loop, open_loop, unique_jpeg

START_MARGIN_S = 0.5  # every process has its command before the common start
STRIDE = 10**6  # image indices per process within a phase (phases start 10**8 apart): every image unique


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

    async def open_then_recover(self, first: int, rate: float, seconds: float, recovery_first: int
                                ) -> tuple[list, list, float]:  # fmt: skip
        """Open-loop arrivals at `rate` for `seconds`, then the closed-loop recovery probe at once; returns
        (load outcomes, recovery outcomes, perf_counter when the arrivals stopped)."""
        assert self._load is not None
        images = _open_images(self._base, first, rate, seconds)
        return await _open_then_recover(
            self._load, self._base, images, self._args, rate, seconds, self._args.seed, recovery_first
        )

    async def close(self) -> None:
        if self._load is not None:
            await self._load.close()


class ProcessPhases:
    """The phases in `n` spawned client processes (safe beside CUDA), each on its own event loop."""

    def __init__(self, args: argparse.Namespace, n: int) -> None:
        self._args, self._n = args, n
        self._pipes: list = []
        self._procs: list = []

    async def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        options = {k: v for k, v in vars(self._args).items() if k not in ("json", "server_log", "func")}
        for index in range(self._n):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_client_process, args=(theirs, options, index), daemon=True)
            proc.start()
            self._pipes.append(mine)
            self._procs.append(proc)
        await self._gather(None)  # "ready": each opened its clients and made its images

    async def closed(self, first: int, seconds: float) -> list[Outcome]:
        at = time.perf_counter() + START_MARGIN_S
        return [o for part in await self._gather(("closed", first, seconds, at)) for o in part]

    async def open_then_recover(self, first: int, rate: float, seconds: float, recovery_first: int
                                ) -> tuple[list, list, float]:  # fmt: skip
        at = time.perf_counter() + START_MARGIN_S + 1.0  # the images are made before the start
        parts = await self._gather(("open", first, rate / self._n, seconds, recovery_first, at))
        return [o for p in parts for o in p[0]], [o for p in parts for o in p[1]], max(p[2] for p in parts)

    async def close(self) -> None:
        for pipe in self._pipes:
            pipe.send(("stop",))
        for proc in self._procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()

    async def _gather(self, command: tuple | None) -> list:
        if command is not None:
            for pipe in self._pipes:
                pipe.send(command)
        loop = asyncio.get_running_loop()
        replies = await asyncio.gather(*(loop.run_in_executor(None, pipe.recv) for pipe in self._pipes))
        failed = [r for r in replies if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        return replies


def _client_process(pipe, options: dict, index: int) -> None:
    asyncio.run(_serve_commands(pipe, argparse.Namespace(**options), index))


async def _serve_commands(pipe, args: argparse.Namespace, index: int) -> None:
    load, base = Load(args), base_images(args)
    loop = asyncio.get_running_loop()
    try:
        pipe.send("ready")
        while (command := await loop.run_in_executor(None, pipe.recv))[0] != "stop":
            try:
                *params, at = command[1:]
                if command[0] == "closed":
                    first, seconds = params
                    await asyncio.sleep(max(0.0, at - time.perf_counter()))
                    reply = await closed_loop(load, base, first + index * STRIDE, seconds, args.concurrency)
                else:
                    first, rate, seconds, recovery_first = params
                    images = _open_images(base, first + index * STRIDE, rate, seconds)
                    await asyncio.sleep(max(0.0, at - time.perf_counter()))
                    reply = await _open_then_recover(  # an independent Poisson stream per process
                        load, base, images, args, rate, seconds, args.seed + index, recovery_first + index * STRIDE
                    )
            except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
                reply = exc
            pipe.send(reply)
    finally:
        await load.close()


def _open_images(base: list[bytes], first: int, rate: float, seconds: float) -> list[bytes]:
    arrivals = int(rate * seconds * 1.2) + 100  # Poisson: room for more than the mean
    return [unique_jpeg(base[i % len(base)], first + i) for i in range(arrivals)]


async def _open_then_recover(
    load: Load, base: list[bytes], images: list[bytes], args: argparse.Namespace, rate: float, seconds: float,
    seed: int, recovery_first: int,
) -> tuple[list[Outcome], list[Outcome], float]:  # fmt: skip
    tasks = await open_loop(load, images, rate, seconds, seed)
    t_stop = time.perf_counter()
    recovery = await closed_loop(load, base, recovery_first, args.recovery_seconds, args.concurrency)
    return list(await asyncio.gather(*tasks)), recovery, t_stop
