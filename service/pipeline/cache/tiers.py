"""The cache's tiers: host (CPU tensors) and pool (IPC results lent as new leases on the same slice; docs/cache.md)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import torch

from mmproc.errors import StaleSessionError
from mmproc.transport.cuda_ipc.destination import PoolSlice
from mmproc.transport.cuda_ipc.pool import IpcPool
from mmproc.transport.leases.records import Lease, UnknownSessionError
from mmproc.wire.results import EncodedImage
from mmproc.wire.transports import Via
from service.pipeline.cache.store import CacheConfig, CacheStore, Entry


class CacheTiers:
    def __init__(self, config: CacheConfig, hidden: int, dtype: torch.dtype) -> None:
        self.config = config
        self._hidden, self._dtype = hidden, dtype
        self._pool: IpcPool | None = None
        self.host = CacheStore("host", config.host_bytes, config.policy, on_evict=lambda entry: None)
        self.pool_store: CacheStore | None = None
        self._stream: torch.cuda.Stream | None = None

    def attach_pool(self, pool: IpcPool) -> None:
        """Keep IPC results in `pool` itself (at most pool_bytes of it), giving space back under pressure."""
        self._pool = pool  # IPC requests now take the pool tier, even one that keeps nothing (cache_ipc_mb = 0)
        if self.config.pool_bytes <= 0:
            return
        table = pool.leases
        store = CacheStore("pool", self.config.pool_bytes, self.config.policy, lambda e: table.drop_hold(e.hold))
        self.pool_store = store
        # Before a request waits for pool space: drop entries no lease reads (their slices are then free).
        table.set_pressure_relief(
            lambda nbytes: store.relieve(lambda e: table.leased(e.hold), lambda: table.fits(nbytes))
        )
        self._stream = torch.cuda.Stream(pool.device)  # ready words of hits: never queued behind a forward

    def stores(self) -> list[CacheStore]:
        return [self.host] + ([self.pool_store] if self.pool_store is not None else [])

    def store_for(self, via: Via) -> CacheStore | None:
        """The pool's tier for a request via the pool's transport, else the host's."""
        return self.pool_store if self._pool is not None and via.session is not None else self.host

    async def keep(self, store: CacheStore, key: str, result: EncodedImage) -> Entry | None:
        """Put `result` into `store`; returns the entry for followers (kept or not), None if it cannot be one."""
        if store.tier == "pool":
            pool, handle = self._pool, result.handle
            assert pool is not None
            hold = pool.leases.hold(handle.lease) if isinstance(handle, PoolSlice) else None
            if hold is None:  # replied serialized (pool full): nothing in the pool to keep
                return None
            entry = Entry(replace(result, key="", cache=""), hold.slice, hold.slice.nbytes, hold)
        else:
            embedding = result.embedding
            if embedding.device.type != "cpu":  # one D2H off the loop, ordered like the serialized reply's staging
                embedding = await asyncio.get_running_loop().run_in_executor(None, embedding.to, "cpu")
            elif embedding.untyped_storage().nbytes() != embedding.nbytes:
                embedding = embedding.clone()  # a view of the batch's buffer: own the rows, so bytes = memory held
            kept = replace(result, embedding=embedding, handle=None, key="", cache="")
            entry = Entry(kept, key, embedding.nbytes)
        store.put(key, entry)
        return entry

    async def serve(
        self, entry: Entry, i: int, session: str | None, readers: int, deadline: float | None, leases: list[Lease]
    ) -> EncodedImage | None:
        """The cached image as image `i`: the host tensor, or a new lease on the pool slice (None: the entry was
        evicted meanwhile, or no word slot came free in time)."""
        if entry.hold is None:
            return replace(entry.result, index=i)
        pool = self._pool
        assert pool is not None and session is not None
        table = pool.leases
        try:
            lease = table.share(session, entry.hold, deadline=None, readers=readers)
            if lease is None and deadline is not None:  # out of word slots: wait (off the loop) like a miss would
                now = time.monotonic()
                until = now + (deadline - now) / 2
                lease = await asyncio.get_running_loop().run_in_executor(
                    None, lambda: table.share(session, entry.hold, deadline=until, readers=readers)
                )
        except UnknownSessionError:
            raise StaleSessionError(f"IPC session {session} is unknown or closed; open a new one") from None
        if lease is None:
            return None
        leases.append(lease)
        with torch.cuda.stream(self._stream):  # the data has been in place since its request synchronized
            pool.mark_ready(lease)
        original = entry.result.handle
        assert isinstance(original, PoolSlice)
        row_bytes = entry.result.embedding.shape[1] * entry.result.embedding.element_size()
        row = (original.descriptor.offset - pool.identity.data_offset - entry.hold.slice.offset) // row_bytes
        descriptor = pool.descriptor(lease, row, entry.result.num_tokens, row_bytes)
        return replace(entry.result, index=i, handle=PoolSlice(descriptor, lease, pool.identity))

    async def without_leases(self, results: list[EncodedImage], leases: list[Lease]) -> list[EncodedImage]:
        """A reply is all IPC or all serialized: when the misses fell back, copy the hits out of the pool."""
        pool = self._pool
        assert pool is not None

        def copy_out() -> list[EncodedImage]:
            copied = [replace(r, embedding=r.embedding.clone(), handle=None) if r.handle else r for r in results]
            torch.cuda.current_stream(pool.device).synchronize()  # copied before the leases may be reused
            return copied

        copied = await asyncio.get_running_loop().run_in_executor(None, copy_out)
        self.abandon(leases)
        return copied

    def abandon(self, leases: list[Lease]) -> None:
        """Give back every lease taken for a request (its reply will not carry them)."""
        pool = self._pool
        assert pool is not None
        for lease in leases:
            pool.leases.abandon(lease)
        leases.clear()

    def absent(self, i: int) -> EncodedImage:
        """A header-only "miss" for an image asked by mm_hash alone with `lookup_only`."""
        empty = torch.empty((0, self._hidden), dtype=self._dtype)
        return EncodedImage(i, (0, 0), 0, empty, cache="miss")
