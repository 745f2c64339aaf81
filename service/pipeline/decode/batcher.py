"""`Batcher`: one thread that runs queued jobs in batches — whatever waits when it is free, up to a bound, in
one call. For a device resource that batches well and must not be used by two threads at once (the GPU JPEG
decoder, service/pipeline/decode/gpu.py): under load, requests share one device round trip instead of queueing
one by one behind it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from mmproc.errors import UnavailableError
from service.pipeline.wait_clock import WaitClock

J = TypeVar("J")
R = TypeVar("R")


@dataclass
class _Queued(Generic[J]):
    job: J
    size: int
    future: asyncio.Future
    token: int = 0  # its place in the wait clock


class Batcher(Generic[J, R]):
    """`run(jobs) -> results` (same order) on one thread, in batches of at most `max_size` (a job bigger than that
    runs alone). `waits` is the queue's sojourn time. An exception from `run` goes to every job of its batch."""

    def __init__(self, run: Callable[[list[J]], Sequence[R]], max_size: int, name: str) -> None:
        self._run = run
        self._max_size = max_size
        self.waits = WaitClock()
        self._queue: deque[_Queued[J]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    async def submit(self, job: J, size: int = 1) -> R:
        """`job`'s result once its batch has run; cancelling the caller skips the job if it has not started."""
        queued = _Queued(job, size, asyncio.get_running_loop().create_future())
        with self._cond:
            if self._closed:
                raise UnavailableError("the GPU decoder is shutting down")
            queued.token = self.waits.enter()
            self._queue.append(queued)
            self._cond.notify()
        try:
            return await queued.future
        finally:
            self.waits.leave(queued.token)

    def close(self) -> None:
        """Run what is queued, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _take(self) -> list[_Queued[J]] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            batch = [self._queue.popleft()]
            size = batch[0].size
            while self._queue and size + self._queue[0].size <= self._max_size:
                size += self._queue[0].size
                batch.append(self._queue.popleft())
        for queued in batch:
            self.waits.leave(queued.token)
        return [q for q in batch if not q.future.done()]  # a cancelled caller's job is not run

    def _serve(self) -> None:
        while (batch := self._take()) is not None:
            if not batch:
                continue
            try:
                results = self._run([q.job for q in batch])
            except BaseException as exc:  # noqa: BLE001 - handed to each caller, which maps it
                for queued in batch:
                    _settle(queued.future, exception=exc)
                continue
            for queued, result in zip(batch, results, strict=True):
                _settle(queued.future, result=result)


def _settle(future: asyncio.Future, *, result: object = None, exception: BaseException | None = None) -> None:
    def settle() -> None:
        if future.done():  # the caller was cancelled meanwhile
            return
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # its event loop is closed: nobody waits
        future.get_loop().call_soon_threadsafe(settle)
