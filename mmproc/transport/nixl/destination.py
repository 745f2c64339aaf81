"""The NIXL transport's producer and destination: a request's rows go into one lease of the registered pool,
written by the runner there, and each image's handle names its range (mmproc/wire/nixl.py puts it in the reply)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mmproc.errors import StaleSessionError
from mmproc.transport.leases.records import Lease, UnknownSessionError
from mmproc.transport.nixl.config import NAME
from mmproc.transport.nixl.messages import Handle
from mmproc.transport.nixl.pool import NixlPool


@dataclass(frozen=True)
class PoolRange:
    """Where one result lies in the registered pool: what its reply describes."""

    handle: Handle
    transport: str = NAME


class NixlProducer:
    """The registered pool as a transport's producer (no `pool` attribute: that name is CUDA IPC's session's)."""

    transport = NAME

    def __init__(self, registered: NixlPool, hidden: int, dtype: torch.dtype) -> None:
        self.registered, self.hidden, self.dtype = registered, hidden, dtype
        config = registered.config
        self.status = (
            f"NIXL active: {config.pool_bytes >> 20} MiB {'GPU' if registered.memory.is_cuda else 'host'} pool "
            f"registered on UCX devices {config.net_devices or 'any'} ({config.ucx_tls or 'UCX picks transports'}); "
            "consumers on any node that reaches them"
        )

    async def destination(
        self, session: str, rows: int, deadline: float | None, readers: int
    ) -> NixlDestination | None:
        """A lease of the request's rows; None when no range came free in time (half the time left)."""
        if readers != 1:
            return None  # one reader per lease: tensor-parallel fan-out stays with IPC and serialized
        nbytes = rows * self.hidden * self.dtype.itemsize
        now = time.monotonic()
        wait_until = now + (deadline - now) / 2 if deadline is not None else now + 1.0
        table = self.registered.leases
        try:
            lease = await asyncio.to_thread(table.acquire, session, nbytes, deadline=wait_until)
        except UnknownSessionError:
            raise StaleSessionError(f"NIXL session {session} is unknown or closed; open a new one") from None
        if lease is None:
            return None
        self.registered.lent(lease)
        return NixlDestination(self, lease, rows)

    def close(self) -> None:
        self.registered.close()


class NixlDestination:
    def __init__(self, producer: NixlProducer, lease: Lease, rows: int) -> None:
        self._producer, self.lease = producer, lease
        p = producer
        self._rows = p.registered.region(lease, rows * p.hidden * p.dtype.itemsize).view(p.dtype).view(rows, p.hidden)
        self._written: list[torch.cuda.Event] = []

    def output(self) -> Callable[[int], torch.Tensor]:
        return lambda rows: self._rows[:rows]  # (rows, hidden) in the pool, on the encoder's device

    def on_written(self) -> Callable[[], None]:
        if not self._rows.is_cuda:
            return lambda: None  # host memory: written when the runner's ops return
        written = self._written

        def on_written() -> None:  # runner thread: the reply waits for the rows, the consumer never does
            written.append(torch.cuda.Event(blocking=True))
            written[0].record(torch.cuda.current_stream(self._rows.device))

        return on_written

    async def written(self) -> None:
        if self._written:
            await asyncio.to_thread(self._written[0].synchronize)

    def abandon(self) -> None:
        registered = self._producer.registered
        if registered.leases.abandon(self.lease):
            registered.forget([self.lease])

    def deliver(self, rows: list[int]) -> list[PoolRange]:
        """One handle per image of `rows[i]` rows, back to back in the lease."""
        p, out, offset = self._producer, [], self.lease.offset
        row_bytes = p.hidden * p.dtype.itemsize
        for n in rows:
            pool = p.registered
            out.append(PoolRange(Handle(pool.epoch, self.lease.lease_id, self.lease.generation, offset, n * row_bytes)))
            offset += n * row_bytes
        return out
