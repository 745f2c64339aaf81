"""The byte budget of serialized replies in flight, from before staging until sent: their peak becomes the main
process's RSS. FIFO; a reply larger than the budget goes alone. Loop-affine and torch-free."""

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
    larger); the memory it costs: docs/benchmarks/overload.md ("Reply bytes in flight").
    pinned_bytes: page-locked reply messages for GPU replies; 0: every reply staged and copied."""

    max_bytes: int = 64 * MiB
    pinned_bytes: int = 0

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.pinned_bytes < 0:
            raise ConfigError(f"bad reply budget {self}")


class ReplyBudget:
    """`in_flight` bytes of at most `max_bytes` (one oversized reply may pass it, alone); waiters granted FIFO."""

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
        """`nbytes` of budget, waited for (FIFO) until `deadline`, then DeadlineExceededError."""
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
    """One reply's share, given back by `release` (idempotent) once sent, on every path; after `off_loop`'s thread."""

    def __init__(self, budget: ReplyBudget, nbytes: int) -> None:
        self.nbytes = nbytes
        self._budget = budget
        self._released = False
        self._staging: asyncio.Future | None = None

    async def off_loop(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` in the default executor; the budget comes back once the thread has finished, even if cancelled."""
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
