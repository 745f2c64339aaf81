"""Client-side retries and target rotation, on typed errors (the policy: docs/deploy.md, "Client behaviour")."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from mmproc.errors import MmprocError, ResourceExhaustedError, UnavailableError

T = TypeVar("T")

MIN_ATTEMPT_S = 0.005  # no attempt starts with less time left


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5  # including the first
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    retry_resource_exhausted: bool = False

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not 0 <= self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError("backoff must satisfy 0 <= initial_backoff_s <= max_backoff_s")

    def retryable(self, err: BaseException) -> bool:
        if isinstance(err, UnavailableError):
            return True
        return self.retry_resource_exhausted and isinstance(err, ResourceExhaustedError)

    def backoff(self, retry: int, rng: random.Random | None = None) -> float:
        """Full jitter: uniform in [0, min(max, initial * multiplier**retry)]."""
        cap = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier**retry)
        return (rng or random).uniform(0.0, cap)


NO_RETRY = RetryPolicy(max_attempts=1)


def _next_pause(policy: RetryPolicy, err: MmprocError, attempt: int, deadline: float, now: float) -> float | None:
    """Seconds to wait before the next attempt, or None to give up and raise `err`."""
    if attempt + 1 >= policy.max_attempts or not policy.retryable(err):
        return None
    pause = policy.backoff(attempt)
    if now + pause + MIN_ATTEMPT_S >= deadline:
        return None
    return pause


def call_with_retry(
    attempt: Callable[[float], T], policy: RetryPolicy, timeout: float, *, clock: Callable[[], float] = time.monotonic
) -> T:
    """Run `attempt(seconds_left)` until it returns or fails for good; `timeout` is shared by all attempts."""
    deadline = clock() + timeout
    for n in range(policy.max_attempts):
        try:
            return attempt(deadline - clock())
        except MmprocError as err:
            pause = _next_pause(policy, err, n, deadline, clock())
            if pause is None:
                raise
            time.sleep(pause)
    raise AssertionError("unreachable")


async def acall_with_retry(
    attempt: Callable[[float], Awaitable[T]],
    policy: RetryPolicy,
    timeout: float,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`call_with_retry` for coroutines; waits with asyncio.sleep."""
    deadline = clock() + timeout
    for n in range(policy.max_attempts):
        try:
            return await attempt(deadline - clock())
        except MmprocError as err:
            pause = _next_pause(policy, err, n, deadline, clock())
            if pause is None:
                raise
            await asyncio.sleep(pause)
    raise AssertionError("unreachable")


class Rotation(Generic[T]):
    """Round-robin over targets; one that failed sits out `cooldown_s` (unless all do)."""

    def __init__(
        self, items: Sequence[T], *, cooldown_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not items:
            raise ValueError("at least one target is needed")
        self._items = list(items)
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._resting_until = [0.0] * len(items)
        self._turn = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def pick(self) -> tuple[int, T]:
        with self._lock:
            now = self._clock()
            count = len(self._items)
            for step in range(count):
                index = (self._turn + step) % count
                if self._resting_until[index] <= now:
                    break
            else:
                index = self._turn % count
            self._turn = index + 1
            return index, self._items[index]

    def failed(self, index: int) -> None:
        with self._lock:
            self._resting_until[index] = self._clock() + self._cooldown_s
