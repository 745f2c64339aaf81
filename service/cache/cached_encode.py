"""The cached request path (docs/cache.md): look every image up by its key, lend hits, coalesce images already
being encoded by another request, encode the rest once through the engine's own path, keep what it made.

Per image, in request order: an invalid image seen within the TTL replays its error; a hit is served from its
tier (host: the CPU tensor; pool: a new lease on the cached slice, no copy); an image another request is encoding
waits for that request (coalesced); the rest are encoded in one sub-request (duplicates within the request once).
A follower whose leader failed for a reason not its own (another image invalid, a deadline, the queue) encodes
the image itself, in a second round. On any failure every lease taken for the request is abandoned.
Event loop only, except the pool tier's pressure relief (service/cache/embedding_cache.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from mmproc.errors import (
    DeadlineExceededError,
    InvalidMediaError,
    InvalidRequestError,
    Reason,
    StaleSessionError,
    UnknownKeyError,
)
from mmproc.transport.ipc_pool import IpcPool
from mmproc.transport.leases import Lease, UnknownSessionError
from service.cache.cache_key import MAX_MM_HASH_CHARS, CacheKeys
from service.cache.embedding_cache import CacheConfig, CacheStore, Entry, InvalidImages

if TYPE_CHECKING:  # the engine owns this object and passes itself in
    from service.pipeline.engine import EncodedImage, Engine

# What a leader hands its followers: the entry (or the unkept result) made, the image's own error, or None
# ("encode it yourself": the leader failed for a reason not this image's).
Outcome = Entry | InvalidMediaError | None


class EmbeddingCache:
    def __init__(self, engine: Engine, config: CacheConfig, keys: CacheKeys) -> None:
        self._engine = engine
        self.config = config
        self.keys = keys
        self.host = CacheStore("host", config.host_bytes, config.policy, on_evict=lambda entry: None)
        self.pool_store: CacheStore | None = None
        self.invalid = InvalidImages(config.invalid_ttl_s, config.max_invalid)
        self.bypassed = 0
        self._inflight: dict[tuple[str, str], asyncio.Future[Outcome]] = {}
        self._stream: torch.cuda.Stream | None = None

    def attach_pool(self, pool: IpcPool) -> None:
        """Keep IPC results in `pool` itself (at most pool_bytes of it), giving space back under pressure."""
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

    def snapshot(self) -> tuple[dict[str, tuple[int, ...]], int, int]:
        """Counts for /metrics (service/process/metrics.py: CacheSnapshot)."""
        tiers = {}
        for store in self.stores():
            s = store.stats
            tiers[store.tier] = (s.hits, s.misses, s.coalesced, s.inserts, s.evictions, store.nbytes, store.max_bytes,
                                 len(store))  # fmt: skip
        return tiers, self.invalid.replayed, self.bypassed

    # -- the request path ---------------------------------------------------------------------------

    async def encode(
        self,
        images: list[bytes],
        request_id: str,
        deadline: float | None,
        *,
        ipc_session: str | None,
        readers: int,
        mm_hashes: Sequence[str],
        lookup_only: bool,
    ) -> list[EncodedImage]:
        engine = self._engine
        engine.check_image_count(len(images))
        hashes = self._hashes(images, mm_hashes)
        present = [data for data in images if data]
        if present:
            engine.check_request(present)
        use_pool = ipc_session is not None and engine.pool is not None
        store = self.pool_store if use_pool else self.host
        if store is None or store.max_bytes <= 0:  # this tier keeps nothing (cache_ipc_mb = 0, say)
            if len(present) != len(images):
                raise InvalidRequestError(
                    "lookup by mm_hash needs the cache of this transport", reason=Reason.BAD_REQUEST
                )
            results = await engine._encode_uncached(
                images, request_id, deadline, ipc_session=ipc_session, readers=readers
            )
            return [replace(r, mm_hash=h) for r, h in zip(results, hashes)]
        keys = [self.keys.key(h) for h in hashes]
        out: list[EncodedImage | None] = [None] * len(images)
        leases: list[Lease] = []
        try:
            for round_ in range(2):
                todo = [i for i, r in enumerate(out) if r is None]
                if not todo:
                    break
                await self._round(todo, round_, images, keys, out, store, request_id, deadline, ipc_session, readers,
                                  leases, lookup_only)  # fmt: skip
            results = [replace(r, mm_hash=h) for r, h in zip(out, hashes)]  # type: ignore[arg-type]
            if use_pool and any(r.descriptor is None for r in results) and leases:
                results = await self._without_leases(results, leases)  # the misses fell back to serialized
            return results
        except BaseException:
            if use_pool:
                for lease in leases:
                    engine.pool.leases.abandon(lease)  # type: ignore[union-attr]
            raise

    async def _round(
        self,
        todo: list[int],
        round_: int,
        images: list[bytes],
        keys: list[str],
        out: list[EncodedImage | None],
        store: CacheStore,
        request_id: str,
        deadline: float | None,
        session: str | None,
        readers: int,
        leases: list[Lease],
        lookup_only: bool,
    ) -> None:
        waits: dict[int, asyncio.Future[Outcome]] = {}
        leaders: dict[str, list[int]] = {}  # key -> this request's images of it (encoded once)
        mine: dict[str, asyncio.Future[Outcome]] = {}  # the in-flight futures this request resolves
        loop = asyncio.get_running_loop()
        try:
            for i in sorted(todo, key=lambda i: not images[i]):  # bytes first: a bare mm_hash may join them
                key = keys[i]
                self.invalid.check(key, i)
                if key in leaders:  # the same image twice in this request
                    leaders[key].append(i)
                    continue
                entry = store.get(key)
                if entry is not None:
                    served = await self._serve(entry, i, session, readers, deadline, leases)
                    if served is not None:
                        store.stats.hits += 1
                        out[i] = replace(served, cache="hit")
                        continue
                future = self._inflight.get((store.tier, key))
                if future is not None and round_ == 0:
                    waits[i] = future
                    continue
                if not images[i]:  # asked by mm_hash alone, and not here
                    store.stats.misses += 1
                    if not lookup_only:
                        raise UnknownKeyError("no cached embedding for this mm_hash: send the image bytes", index=i)
                    out[i] = self._absent(i)
                    continue
                leaders[key] = [i]
                if future is None:  # registered at once: a request arriving during our awaits follows us
                    mine[key] = self._inflight[(store.tier, key)] = loop.create_future()
        except BaseException:
            self._settle(store, mine, {})
            raise
        misses = None
        if leaders:
            misses = asyncio.ensure_future(
                self._encode_misses(images, leaders, mine, store, request_id, deadline, session, readers, leases)
            )
        try:
            followed = await asyncio.gather(
                *(self._follow(i, f, session, readers, deadline, leases) for i, f in waits.items()),
                return_exceptions=True,
            )
            encoded = (await asyncio.gather(misses, return_exceptions=True))[0] if misses is not None else {}
        except BaseException:  # cancelled: so is the encode (it gives its own lease back; followers retry)
            if misses is not None:
                misses.cancel()
            raise
        failures = [r for r in followed if isinstance(r, BaseException)]
        if isinstance(encoded, BaseException):
            failures.insert(0, encoded)
        if failures:
            raise min(failures, key=lambda e: (not isinstance(e, InvalidMediaError), getattr(e, "index", 0)))
        for i, result in zip(waits, followed):
            if result is not None:
                store.stats.coalesced += 1
                out[i] = result
        for i, result in encoded.items():
            out[i] = result

    async def _encode_misses(
        self,
        images: list[bytes],
        leaders: dict[str, list[int]],
        mine: dict[str, asyncio.Future[Outcome]],
        store: CacheStore,
        request_id: str,
        deadline: float | None,
        session: str | None,
        readers: int,
        leases: list[Lease],
    ) -> dict[int, EncodedImage]:
        order = list(leaders)
        first = [leaders[key][0] for key in order]
        outcomes: dict[str, Outcome] = {}
        try:
            results = await self._engine._encode_uncached(
                [images[i] for i in first], request_id, deadline, ipc_session=session, readers=readers
            )
            if results[0].lease is not None:
                leases.append(results[0].lease)
            out = {}
            for key, result in zip(order, results):
                outcomes[key] = await self._keep(store, key, result)
                for j, i in enumerate(leaders[key]):
                    if j == 0:
                        store.stats.misses += 1
                    else:
                        store.stats.coalesced += 1
                    out[i] = replace(result, index=i, cache="miss" if j == 0 else "coalesced")
            return out
        except InvalidMediaError as exc:
            if 0 <= exc.index < len(order):  # that image's own fault: remembered, replayed to its followers
                key = order[exc.index]
                self.invalid.add(key, exc)
                outcomes[key] = exc
                raise exc.at_index(first[exc.index]) from None
            raise
        finally:
            self._settle(store, mine, outcomes)

    def _settle(
        self, store: CacheStore, mine: dict[str, asyncio.Future[Outcome]], outcomes: dict[str, Outcome]
    ) -> None:
        """Hand each follower its leader's outcome (None: encode it yourself) and end the in-flight entries."""
        for key, future in mine.items():
            del self._inflight[(store.tier, key)]
            if not future.done():
                future.set_result(outcomes.get(key))

    async def _follow(
        self,
        i: int,
        future: asyncio.Future[Outcome],
        session: str | None,
        readers: int,
        deadline: float | None,
        leases: list[Lease],
    ) -> EncodedImage | None:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            outcome = await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            raise DeadlineExceededError(
                f"image {i} was still being encoded by another request at the deadline"
            ) from None
        if isinstance(outcome, InvalidMediaError):
            raise outcome.at_index(i)
        if outcome is None:
            return None
        served = await self._serve(outcome, i, session, readers, deadline, leases)
        return None if served is None else replace(served, cache="coalesced")

    # -- entries ------------------------------------------------------------------------------------

    async def _keep(self, store: CacheStore, key: str, result: EncodedImage) -> Entry | None:
        """Put `result` into `store`; returns the entry for followers (kept or not), None if it cannot be one."""
        if store.tier == "pool":
            hold = self._engine.pool.leases.hold(result.lease) if result.lease is not None else None  # type: ignore
            if hold is None:  # replied serialized (pool full): nothing in the pool to keep
                return None
            entry = Entry(replace(result, lease=None, key="", cache=""), hold.slice, hold.slice.nbytes, hold)
        else:
            embedding = result.embedding
            if embedding.device.type != "cpu":  # one D2H off the loop, ordered like the serialized reply's staging
                embedding = await asyncio.get_running_loop().run_in_executor(None, embedding.to, "cpu")
            elif embedding.untyped_storage().nbytes() != embedding.nbytes:
                embedding = embedding.clone()  # a view of the batch's buffer: own the rows, so bytes = memory held
            kept = replace(result, embedding=embedding, descriptor=None, lease=None, key="", cache="")
            entry = Entry(kept, key, embedding.nbytes)
        store.put(key, entry)
        return entry

    async def _serve(
        self, entry: Entry, i: int, session: str | None, readers: int, deadline: float | None, leases: list[Lease]
    ) -> EncodedImage | None:
        """The cached image as image `i`: the host tensor, or a new lease on the pool slice (None: the entry was
        evicted meanwhile, or no word slot came free in time)."""
        if entry.hold is None:
            return replace(entry.result, index=i)
        engine = self._engine
        pool = engine.pool
        assert pool is not None and session is not None
        table = pool.leases
        try:
            lease = table.share(session, entry.hold, deadline=None, readers=readers)
            if lease is None and deadline is not None:  # out of word slots: wait (off the loop) like a miss would
                now = time.monotonic()
                until = now + (deadline - now) / 2
                lease = await asyncio.get_running_loop().run_in_executor(
                    engine._lease_waiters, lambda: table.share(session, entry.hold, deadline=until, readers=readers)
                )
        except UnknownSessionError:
            raise StaleSessionError(f"IPC session {session} is unknown or closed; open a new one") from None
        if lease is None:
            return None
        leases.append(lease)
        with torch.cuda.stream(self._stream):  # the data has been in place since its request synchronized
            pool.mark_ready(lease)
        original = entry.result.descriptor
        assert original is not None
        row_bytes = entry.result.embedding.shape[1] * entry.result.embedding.element_size()
        row = (original.offset - pool.identity.data_offset - entry.hold.slice.offset) // row_bytes
        descriptor = pool.descriptor(lease, row, entry.result.num_tokens, row_bytes)
        return replace(entry.result, index=i, descriptor=descriptor, lease=lease)

    async def _without_leases(self, results: list[EncodedImage], leases: list[Lease]) -> list[EncodedImage]:
        """A reply is all IPC or all serialized: when the misses fell back, copy the hits out of the pool (on the
        device) and give their leases back."""
        pool = self._engine.pool
        assert pool is not None

        def copy_out() -> list[EncodedImage]:
            copied = [
                replace(r, embedding=r.embedding.clone(), descriptor=None, lease=None) if r.descriptor else r
                for r in results
            ]
            torch.cuda.current_stream(pool.device).synchronize()  # copied before the leases may be reused
            return copied

        copied = await asyncio.get_running_loop().run_in_executor(self._engine._lease_waiters, copy_out)
        for lease in leases:
            pool.leases.abandon(lease)
        leases.clear()
        return copied

    def _absent(self, i: int) -> EncodedImage:
        from service.pipeline.engine import EncodedImage

        encoder = self._engine.encoder
        empty = torch.empty((0, encoder.output_dim), dtype=encoder.dtype)
        return EncodedImage(i, (0, 0), 0, empty, cache="miss")

    def _hashes(self, images: list[bytes], mm_hashes: Sequence[str]) -> list[str]:
        """Each image's mm_hash: of its bytes, or the client's for an image sent without bytes. A client's hash
        sent with the bytes must match them (a key that cannot lie)."""
        if mm_hashes and len(mm_hashes) != len(images):
            raise InvalidRequestError(f"{len(mm_hashes)} mm_hashes for {len(images)} images", reason=Reason.BAD_REQUEST)
        out = []
        for i, data in enumerate(images):
            given = mm_hashes[i] if mm_hashes else ""
            if len(given) > MAX_MM_HASH_CHARS or not given.isascii():
                raise InvalidRequestError(f"mm_hash must be ASCII, at most {MAX_MM_HASH_CHARS} characters",
                                        reason=Reason.BAD_REQUEST, index=i)  # fmt: skip
            if not data:
                if not given:
                    raise InvalidMediaError("image is empty and has no mm_hash", reason=Reason.EMPTY, index=i)
                out.append(given)
                continue
            computed = self.keys.mm_hash(data)
            if given and given != computed:
                raise InvalidRequestError(f"mm_hash {given!r} does not match the image bytes ({computed})",
                                        reason=Reason.BAD_REQUEST, index=i)  # fmt: skip
            out.append(computed)
        return out
