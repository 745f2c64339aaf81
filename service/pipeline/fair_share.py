"""`FairShare`: the decode pool's worker slots, handed out round robin across requests, with a lane kept for light
work: heavy items (an image whose own decode budget is long, a video) hold at most `slots - 1` slots together, so a
small request arriving while heavy ones fill the queue waits for one light item at most, never for a heavy one."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator


class FairShare:
    """`slots` permits handed out round robin across keys (requests): when slots are short, each waiting key
    gets one in turn, whatever the number of waiters it queued; a heavy waiter only while fewer than `slots - 1`
    heavy ones hold a slot (with one slot, no lane). Acquired on an event loop; `release` may be called from any
    thread (a slot is given back when its item leaves the worker)."""

    def __init__(self, slots: int) -> None:
        self._lock = threading.Lock()
        self._free = slots
        self._heavy = 0  # slots held by heavy items
        self._heavy_max = max(1, slots - 1)
        self._waiting: OrderedDict[object, deque[tuple[asyncio.Future, bool]]] = OrderedDict()

    @contextlib.asynccontextmanager
    async def slot(self, key: object, heavy: bool = False) -> AsyncIterator[None]:
        await self.acquire(key, heavy)
        try:
            yield
        finally:
            self.release(heavy)

    @property
    def free(self) -> int:
        """Slots not handed out."""
        return self._free

    @property
    def waiting(self) -> int:
        """Keys (requests) with a waiter queued for a slot."""
        return len(self._waiting)

    def _fits(self, heavy: bool) -> bool:
        return not heavy or self._heavy < self._heavy_max

    async def acquire(self, key: object, heavy: bool = False) -> None:
        with self._lock:
            if self._free > 0 and not self._waiting and self._fits(heavy):
                self._free -= 1
                self._heavy += heavy
                return
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(key, deque()).append((waiter, heavy))
            self._hand_out()  # a slot left free because the waiters before were heavy: this one may fit
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted just before the cancel: pass the slot on
                self.release(heavy)
            else:
                self._forget(key, waiter)  # a grant still on its way sees the cancel and passes the slot on
            raise

    def release(self, heavy: bool = False) -> None:
        with self._lock:
            self._heavy -= heavy
            self._free += 1
            self._hand_out()

    def _hand_out(self) -> None:
        """(under the lock) Free slots to the waiters that may take one, keys in turn: each key's first waiter
        that fits (a request's heavy image waits while its light one goes)."""
        while self._free > 0:
            chosen = self._next_fit()
            if chosen is None:
                return  # nobody waiting fits: the slots stay free for whoever comes
            key, queue, (waiter, heavy) = chosen
            queue.remove((waiter, heavy))
            if queue:
                self._waiting.move_to_end(key)  # this key has had its turn
            else:
                del self._waiting[key]
            try:
                waiter.get_loop().call_soon_threadsafe(self._grant, waiter, heavy)
            except RuntimeError:  # its event loop is closed
                continue
            self._free -= 1
            self._heavy += heavy

    def _next_fit(self) -> tuple[object, deque, tuple[asyncio.Future, bool]] | None:
        """(under the lock) The first key in turn with a live waiter that fits, that key's queue and the waiter;
        cancelled waiters and empty keys are dropped on the way."""
        for key in list(self._waiting):
            queue = self._waiting[key]
            for entry in [e for e in queue if e[0].done()]:
                queue.remove(entry)
            if not queue:
                del self._waiting[key]
                continue
            found = next((entry for entry in queue if self._fits(entry[1])), None)
            if found is not None:
                return key, queue, found
        return None

    def _grant(self, waiter: asyncio.Future, heavy: bool) -> None:
        if waiter.done():  # cancelled while the grant was on its way
            self.release(heavy)
        else:
            waiter.set_result(None)

    def _forget(self, key: object, waiter: asyncio.Future) -> None:
        with self._lock:
            queue = self._waiting.get(key)
            if queue is None:
                return
            for entry in [e for e in queue if e[0] is waiter]:
                queue.remove(entry)
            if not queue:
                del self._waiting[key]
            self._hand_out()  # a heavy waiter that left may have blocked a light one behind it
