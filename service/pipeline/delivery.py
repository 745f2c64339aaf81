"""The delivery step: where a request's embeddings go, chosen once per request. Serialized: plain tensors that the
front ends turn into bytes, within the reply byte budget (service/pipeline/reply_budget.py); IPC: one pool lease that
the runner writes into and the reply describes. The IPC hand-off's protocol: docs/ipc.md."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from mmproc.errors import DeadlineExceededError, ResourceExhaustedError, StaleSessionError
from mmproc.transport.cuda_ipc.pool import IpcPool, SliceDescriptor
from mmproc.transport.leases.records import Lease, UnknownSessionError
from mmproc.transport.serialized.pinned_messages import PinnedMessages
from mmproc.types import PreprocessedImage
from service.observe.metrics import Metrics
from service.pipeline.encoded import EncodedImage
from service.pipeline.reply_budget import ReplyBudget, ReplyBudgetConfig, ReplyHold

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Serialized:
    """Plain tensors: the runner allocates each request's output, the front end serializes it."""

    lease: Lease | None = None

    def output(self) -> Callable[[int], torch.Tensor] | None:
        return None

    def on_written(self) -> Callable[[], None] | None:
        return None

    async def written(self) -> None:
        return None

    def abandon(self) -> None:
        return None

    def deliver(self, prepared: list[PreprocessedImage], embeddings: list[torch.Tensor]) -> list[EncodedImage]:
        return [
            EncodedImage(i, p.grid_hw, p.num_tokens, e, None, p.image_size)
            for i, (p, e) in enumerate(zip(prepared, embeddings))
        ]


class PoolLease(Serialized):
    """One lease for the whole request: the runner writes its rows there, marks the lease ready on its stream and
    records an event; the reply waits for that event, then carries one descriptor per image."""

    def __init__(self, delivery: Delivery, lease: Lease) -> None:
        self.lease = lease
        self._delivery = delivery
        self._written: list[torch.cuda.Event] = []

    def output(self) -> Callable[[int], torch.Tensor]:
        pool, lease, hidden, dtype = self._delivery.pool, self.lease, self._delivery.hidden, self._delivery.dtype
        assert pool is not None
        return lambda rows: pool.destination(lease, rows, hidden, dtype)

    def on_written(self) -> Callable[[], None]:
        pool, lease, written = self._delivery.pool, self.lease, self._written
        assert pool is not None

        def on_written() -> None:  # runner thread, right after the request's last forward was enqueued
            pool.mark_ready(lease)
            written.append(torch.cuda.Event(blocking=True))  # its waiter sleeps, not spins (a core each)
            written[0].record(torch.cuda.current_stream(pool.device))  # the runner thread's device may be another

        return on_written

    async def written(self) -> None:
        # Reply once the slice is written, so the consumer's wait on the ready word never stalls its stream on
        # our compute; the ready word stays the stream-ordered guarantee.
        if self._written:
            await self._delivery.off_loop(self._written[0].synchronize)

    def abandon(self) -> None:
        """The request failed: the runner's writes to the lease are stream-ordered before any later lease's."""
        assert self._delivery.pool is not None
        self._delivery.pool.leases.abandon(self.lease)

    def deliver(self, prepared: list[PreprocessedImage], embeddings: list[torch.Tensor]) -> list[EncodedImage]:
        descriptors = self._delivery.descriptors(self.lease, [p.num_tokens for p in prepared])
        return [
            EncodedImage(i, p.grid_hw, p.num_tokens, e, d, p.image_size, lease=self.lease)
            for i, (p, e, d) in enumerate(zip(prepared, embeddings, descriptors))
        ]


class Delivery:
    """The transport seam: `destination` picks a request's destination once. `pool` is None until an IPC pool is
    attached (service/app/ipc_setup.py); then IPC requests get a lease, or serialized when the pool stays full
    and `fallback` allows it."""

    def __init__(
        self, hidden: int, dtype: torch.dtype, metrics: Metrics, replies: ReplyBudgetConfig | None = None
    ) -> None:
        self.hidden = hidden
        self.dtype = dtype
        self._metrics = metrics
        replies = replies or ReplyBudgetConfig()
        self.replies = ReplyBudget(replies)
        metrics.reply_bytes_in_flight.set_function(lambda: self.replies.in_flight)
        self.pinned = PinnedMessages(replies.pinned_bytes) if replies.pinned_bytes else None
        metrics.track_pinned_replies(self.pinned)
        self.pool: IpcPool | None = None
        self.fallback = True
        self.fallbacks = 0
        self._waiters: ThreadPoolExecutor | None = None  # lease waits and CUDA syncs, off the event loop

    def attach(self, pool: IpcPool, *, fallback: bool) -> None:
        """Serve IPC requests from `pool`. fallback: when the pool stays full, reply serialized instead of
        RESOURCE_EXHAUSTED."""
        self.pool = pool
        self.fallback = fallback
        self._waiters = ThreadPoolExecutor(max_workers=8, thread_name_prefix="mmproc-lease")

    def close(self) -> None:
        if self.pinned is not None:
            self.pinned.close()
        if self.pool is not None:
            assert self._waiters is not None
            self._waiters.shutdown(wait=True, cancel_futures=True)
            self.pool.close()

    async def off_loop(self, fn: Callable[[], T]) -> T:
        """`fn` on the lease waiters (IPC attached only): blocking lease waits and stream syncs."""
        assert self._waiters is not None
        return await asyncio.get_running_loop().run_in_executor(self._waiters, fn)

    async def destination(
        self, session: str | None, rows: int, deadline: float | None, readers: int
    ) -> Serialized | PoolLease:
        """A lease of `rows` embedding rows for an IPC request (`session` set, a pool attached), else serialized."""
        lease = await self.lease(session, rows, deadline, readers) if session else None
        return Serialized() if lease is None else PoolLease(self, lease)

    async def lease(self, session: str, rows: int, deadline: float | None, readers: int) -> Lease | None:
        """A pool lease for `rows` rows, read by `readers` consumers, or None to reply serialized.

        Waits for space at most half of the time left before the deadline (the other half is for the work),
        off the event loop; then falls back (counted, logged once) or refuses, as configured.
        """
        if self.pool is None:
            return None
        pool = self.pool
        nbytes = rows * self.hidden * self.dtype.itemsize
        now = time.monotonic()
        wait_until = now + (deadline - now) / 2 if deadline is not None else now + 1.0
        try:
            lease = await self.off_loop(
                lambda: pool.leases.acquire(session, nbytes, deadline=wait_until, readers=readers)
            )
        except UnknownSessionError:
            raise StaleSessionError(f"IPC session {session} is unknown or closed; open a new one") from None
        if lease is not None:
            return lease
        if not self.fallback:
            raise ResourceExhaustedError(f"IPC pool full: no {nbytes}-byte slice freed in time")
        self.fallbacks += 1
        self._metrics.ipc_fallbacks.inc()
        if self.fallbacks == 1:
            logger.warning("IPC pool full past the wait: replying serialized (counted in ipc fallbacks; logged once)")
        return None

    async def reply_bytes(self, nbytes: int, deadline: float | None, images: int) -> ReplyHold:
        """Budget for a serialized reply of `nbytes`, taken before it is staged to host memory; the front end
        releases it once sent. Past the deadline: DeadlineExceededError. Expired or cancelled, its `images` count
        as dropped at delivery."""
        try:
            return await self.replies.acquire(nbytes, deadline)
        except (DeadlineExceededError, asyncio.CancelledError):
            self._metrics.dropped_images.labels("delivery").inc(images)  # as run_step.count_dropped (imports us)
            raise

    def descriptors(self, lease: Lease, rows: list[int]) -> list[SliceDescriptor]:
        """One descriptor per image of `rows` rows each, all in one lease (same ready word and reader ack words)."""
        assert self.pool is not None
        row_bytes = self.hidden * self.dtype.itemsize
        out, row = [], 0
        for n in rows:
            out.append(self.pool.descriptor(lease, row, n, row_bytes))
            row += n
        return out
