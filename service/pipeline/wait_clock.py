"""`WaitClock`: how long the oldest waiter of one queue has waited — the queue's sojourn time, which overload
control compares with its target (service/pipeline/overload.py). Queues that hold no timestamps of their own
(the decode pool's worker slots, the GPU decoder's thread) keep one beside them."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class WaitClock:
    """Entry times of the waiters now in one queue, oldest first. Any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entered: dict[int, float] = {}  # token -> time.monotonic(), in entry order
        self._tokens = itertools.count()

    def enter(self) -> int:
        with self._lock:
            token = next(self._tokens)
            self._entered[token] = time.monotonic()
        return token

    def leave(self, token: int) -> None:
        with self._lock:
            self._entered.pop(token, None)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        token = self.enter()
        try:
            yield
        finally:
            self.leave(token)

    def oldest_s(self) -> float:
        """Seconds the oldest waiter has waited; 0 with none."""
        with self._lock:
            oldest = next(iter(self._entered.values()), None)
        return 0.0 if oldest is None else time.monotonic() - oldest
