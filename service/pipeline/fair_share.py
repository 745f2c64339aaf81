"""`FairShare`: the decode pool's worker slots, handed out round robin across requests."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator


class FairShare:
    """`slots` permits handed out round robin across keys (requests): when slots are short, each waiting key
    gets one in turn, whatever the number of waiters it queued. Acquired on an event loop; `release` may be
    called from any thread (a slot is given back when its image leaves the worker)."""

    def __init__(self, slots: int) -> None:
        self._lock = threading.Lock()
        self._free = slots
        self._waiting: OrderedDict[object, deque[asyncio.Future]] = OrderedDict()

    @contextlib.asynccontextmanager
    async def slot(self, key: object) -> AsyncIterator[None]:
        await self.acquire(key)
        try:
            yield
        finally:
            self.release()

    @property
    def free(self) -> int:
        """Slots not handed out."""
        return self._free

    @property
    def waiting(self) -> int:
        """Keys (requests) with a waiter queued for a slot."""
        return len(self._waiting)

    async def acquire(self, key: object) -> None:
        with self._lock:
            if self._free > 0 and not self._waiting:
                self._free -= 1
                return
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(key, deque()).append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted just before the cancel: pass the slot on
                self.release()
            else:
                self._forget(key, waiter)  # a grant still on its way sees the cancel and passes the slot on
            raise

    def release(self) -> None:
        with self._lock:
            while self._waiting:
                key, queue = next(iter(self._waiting.items()))
                waiter = queue.popleft()
                if queue:
                    self._waiting.move_to_end(key)  # this key has had its turn
                else:
                    del self._waiting[key]
                if waiter.done():
                    continue
                try:
                    waiter.get_loop().call_soon_threadsafe(self._grant, waiter)
                except RuntimeError:  # its event loop is closed
                    continue
                return
            self._free += 1

    def _grant(self, waiter: asyncio.Future) -> None:
        if waiter.done():  # cancelled while the grant was on its way
            self.release()
        else:
            waiter.set_result(None)

    def _forget(self, key: object, waiter: asyncio.Future) -> None:
        with self._lock:
            queue = self._waiting.get(key)
            if queue is not None and waiter in queue:
                queue.remove(waiter)
                if not queue:
                    del self._waiting[key]
