"""The producer side of the CUDA IPC transport: a request's rows in one lease of the pool (docs/ipc.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import torch

from mmproc.errors import StaleSessionError
from mmproc.transport.cuda_ipc.pool import IpcPool, PoolIdentity, SliceDescriptor
from mmproc.transport.leases.records import Lease, UnknownSessionError

T = TypeVar("T")
NAME = "ipc"


@dataclass(frozen=True)
class PoolSlice:
    """Where one result lies in the pool."""

    descriptor: SliceDescriptor
    lease: Lease
    pool: PoolIdentity
    transport: str = NAME


class IpcProducer:
    """The pool as a transport's producer: leases for requests, waited for off the event loop."""

    transport = NAME

    def __init__(self, pool: IpcPool, hidden: int, dtype: torch.dtype) -> None:
        self.pool, self.hidden, self.dtype = pool, hidden, dtype
        identity = pool.identity
        self.status = (
            f"IPC active: {pool.config.pool_bytes >> 20} MiB pool {identity.pool_id} on {identity.device_uuid}; "
            "consumers on this node and PID namespace"
        )
        self._waiters = ThreadPoolExecutor(max_workers=8, thread_name_prefix="mmproc-lease")  # waits and syncs

    async def off_loop(self, fn: Callable[[], T]) -> T:
        """`fn` on the lease waiters: blocking lease waits and stream syncs."""
        return await asyncio.get_running_loop().run_in_executor(self._waiters, fn)

    async def destination(
        self, session: str, rows: int, deadline: float | None, readers: int
    ) -> PoolDestination | None:
        lease = await self.lease(session, rows, deadline, readers)
        return None if lease is None else PoolDestination(self, lease)

    async def lease(self, session: str, rows: int, deadline: float | None, readers: int) -> Lease | None:
        """None when no slice came free within half the time left (the other half is for the work)."""
        pool, nbytes = self.pool, rows * self.hidden * self.dtype.itemsize
        now = time.monotonic()
        wait_until = now + (deadline - now) / 2 if deadline is not None else now + 1.0
        try:
            return await self.off_loop(
                lambda: pool.leases.acquire(session, nbytes, deadline=wait_until, readers=readers)
            )
        except UnknownSessionError:
            raise StaleSessionError(f"IPC session {session} is unknown or closed; open a new one") from None

    def slices(self, lease: Lease, rows: list[int]) -> list[PoolSlice]:
        """One handle per image, all in one lease."""
        row_bytes = self.hidden * self.dtype.itemsize
        out, row = [], 0
        for n in rows:
            out.append(PoolSlice(self.pool.descriptor(lease, row, n, row_bytes), lease, self.pool.identity))
            row += n
        return out

    def close(self) -> None:
        self._waiters.shutdown(wait=True, cancel_futures=True)
        self.pool.close()


class PoolDestination:
    """One lease per request: the runner writes and marks it ready; the reply waits for its event."""

    def __init__(self, producer: IpcProducer, lease: Lease) -> None:
        self.lease = lease
        self._producer = producer
        self._written: list[torch.cuda.Event] = []

    def output(self) -> Callable[[int], torch.Tensor]:
        p, lease = self._producer, self.lease
        return lambda rows: p.pool.destination(lease, rows, p.hidden, p.dtype)

    def on_written(self) -> Callable[[], None]:
        pool, lease, written = self._producer.pool, self.lease, self._written

        def on_written() -> None:  # runner thread, right after the request's last forward was enqueued
            pool.mark_ready(lease)
            written.append(torch.cuda.Event(blocking=True))  # its waiter sleeps, not spins (a core each)
            written[0].record(torch.cuda.current_stream(pool.device))  # the runner thread's device may be another

        return on_written

    async def written(self) -> None:
        # so the consumer's stream never stalls on our compute; the ready word stays the guarantee
        if self._written:
            await self._producer.off_loop(self._written[0].synchronize)

    def abandon(self) -> None:
        """The request failed: the runner's writes to the lease are stream-ordered before any later lease's."""
        self._producer.pool.leases.abandon(self.lease)

    def deliver(self, rows: list[int]) -> list[PoolSlice]:
        return self._producer.slices(self.lease, rows)
