"""The byte budget of serialized replies in flight. A reply takes its bytes before its embeddings are staged to host
memory and gives them back once its front end is done sending it (or failed to). The main process keeps freed heap
for the next reply (service/app/host_memory.py), so the peak of reply bytes in flight becomes its RSS: this
bounds that peak. FIFO among waiters; a reply larger than the whole budget goes alone, so none starves.

Loop-affine and torch-free: every method runs on the event loop that serves the front ends (the config is built
with the settings, which load no torch)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from mmproc.errors import ConfigError, DeadlineExceededError
from mmproc.units import MiB

T = TypeVar("T")


@dataclass(frozen=True)
class ReplyBudgetConfig:
    """max_bytes: payload bytes of serialized replies staged or being sent at once (HTTP: the rendered body when
    larger). The process holds copies of each (staging, message, gRPC's own): about 2 MB of memory per MB in
    flight, docs/benchmarks/overload.md ("Reply bytes in flight")."""

    # 64 MiB: three 1024² Kimi K2.5 replies (19 MB each) sending at once, for ~+100 MB of main-process peak (measured
    # on the CPU), within issue 24's +200 MB; slow network consumers may want more.
    max_bytes: int = 64 * MiB
    # Page-locked messages that serialized replies from a GPU are written into (mmproc/transport/serialized/pinned_messages.py);
    # 0: none, every reply staged and copied.
    pinned_bytes: int = 0

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.pinned_bytes < 0:
            raise ConfigError(f"bad reply budget {self}")


class ReplyBudget:
    """`in_flight` bytes of at most `max_bytes` (one oversized reply may pass it, alone); `peak` is the most ever
    held. A waiter is granted in FIFO order as bytes come back, never by barging past an earlier one."""

    def __init__(self, config: ReplyBudgetConfig) -> None:
        self.max_bytes = config.max_bytes
        self.in_flight = 0
        self._peak = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def peak(self) -> int:
        return self._peak

    @property
    def waiting(self) -> int:
        """Replies queued for budget (including any leaving right now)."""
        return len(self._waiters)

    async def acquire(self, nbytes: int, deadline: float | None) -> ReplyHold:
        """`nbytes` of budget; waits (FIFO) for it until `deadline` (time.monotonic()), then DeadlineExceededError.
        A cancelled waiter leaves holding nothing."""
        if not self._waiters and self._fits(nbytes):
            self._take(nbytes)
            return ReplyHold(self, nbytes)
        loop = asyncio.get_running_loop()
        granted: asyncio.Future[None] = loop.create_future()
        waiter = (nbytes, granted)
        self._waiters.append(waiter)
        timer = None if deadline is None else loop.call_later(max(0.0, deadline - time.monotonic()), _expire, granted)
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled() and granted.exception() is None:
                self._give_back(nbytes)  # granted just before the cancellation reached this task
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
                self._wake()  # the head leaving may let the next one in
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return ReplyHold(self, nbytes)

    def _fits(self, nbytes: int) -> bool:
        return self.in_flight == 0 or self.in_flight + nbytes <= self.max_bytes

    def _take(self, nbytes: int) -> None:
        self.in_flight += nbytes
        self._peak = max(self._peak, self.in_flight)

    def _give_back(self, nbytes: int) -> None:
        self.in_flight -= nbytes
        self._wake()

    def _resize(self, old: int, new: int) -> None:
        self._take(new - old)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            nbytes, granted = self._waiters[0]
            if granted.done():  # expired or cancelled: its task removes it, or already did
                self._waiters.popleft()
                continue
            if not self._fits(nbytes):
                return
            self._waiters.popleft()
            self._take(nbytes)
            granted.set_result(None)


def _expire(granted: asyncio.Future[None]) -> None:
    if not granted.done():
        granted.set_exception(DeadlineExceededError("the reply waited for the reply byte budget past its deadline"))


class ReplyHold:
    """One reply's share of the budget, given back once by `release` (idempotent): by the front end when it is done
    sending, on every path. Staging run through `off_loop` delays that until its thread has finished."""

    def __init__(self, budget: ReplyBudget, nbytes: int) -> None:
        self.nbytes = nbytes
        self._budget = budget
        self._released = False
        self._staging: asyncio.Future | None = None

    async def off_loop(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` in the default executor. A cancelled caller leaves, but the thread still writes the reply's
        bytes: the budget comes back once it has finished, not before."""
        staging = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        staging.add_done_callback(_consume)
        self._staging = staging
        result = await asyncio.shield(staging)
        self._staging = None  # its result is the reply: ours no longer once handed over (a hold may outlive it)
        return result

    def resize(self, nbytes: int) -> None:
        """What the reply holds from now on (HTTP: its rendered body). Growth is taken at once, never waited for."""
        if not self._released:
            self._budget._resize(self.nbytes, nbytes)
            self.nbytes = nbytes

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        staging, self._staging = self._staging, None
        if staging is not None and not staging.done():
            staging.add_done_callback(lambda _: self._budget._give_back(self.nbytes))
        else:
            self._budget._give_back(self.nbytes)


def _consume(future: asyncio.Future) -> None:
    """Retrieve a staging thread's exception nobody awaits any more (its caller was cancelled)."""
    if not future.cancelled():
        future.exception()
