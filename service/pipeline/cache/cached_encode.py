"""The cached request path (docs/cache.md): lend hits, coalesce images in flight, encode the rest once, keep it.
On any failure every lease taken for the request is abandoned. Event loop only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from mmproc.errors import (
    DeadlineExceededError,
    InvalidMediaError,
    InvalidRequestError,
    Reason,
    UnknownKeyError,
)
from mmproc.transport.leases.records import Lease
from mmproc.wire.results import EncodedImage
from mmproc.wire.transports import Via
from service.pipeline.admission import Admission
from service.pipeline.cache.keys import MAX_MM_HASH_CHARS, CacheKeys
from service.pipeline.cache.store import CacheConfig, CacheStore, Entry, InvalidImages
from service.pipeline.cache.tiers import CacheTiers
from service.pipeline.delivery import Delivery

# What a leader hands its followers: the entry (or the unkept result) made, the image's own error, or None
# ("encode it yourself": the leader failed for a reason not this image's).
Outcome = Entry | InvalidMediaError | None


@dataclass
class _Call:
    """One request through the cache: what it asked for, where its entries live, what it has so far."""

    images: list[bytes]
    keys: list[str]
    store: CacheStore
    request_id: str
    deadline: float | None
    via: Via
    readers: int
    lookup_only: bool
    out: list[EncodedImage | None]
    leases: list[Lease] = field(default_factory=list)  # every lease taken for it: abandoned if it fails


class EncodeSteps(Protocol):
    """The pipeline's steps after the cache."""

    def __call__(
        self, images: list[bytes], request_id: str, deadline: float | None, *, via: Via, readers: int
    ) -> Awaitable[list[EncodedImage]]: ...


class EmbeddingCache:
    """The cache step of the pipeline: `encode` serves what it can and hands the rest to `steps`."""

    def __init__(
        self, config: CacheConfig, keys: CacheKeys, admission: Admission, delivery: Delivery, steps: EncodeSteps
    ) -> None:
        self.config = config
        self.keys = keys
        self.tiers = CacheTiers(config, delivery.hidden, delivery.dtype)
        self.invalid = InvalidImages(config.invalid_ttl_s, config.max_invalid)
        self.bypassed = 0
        self._admission = admission
        self._steps = steps
        self._inflight: dict[tuple[str, str], asyncio.Future[Outcome]] = {}

    @property
    def host(self) -> CacheStore:
        return self.tiers.host

    @property
    def pool_store(self) -> CacheStore | None:
        return self.tiers.pool_store

    def attach_pool(self, pool: object) -> None:  # an IpcPool
        self.tiers.attach_pool(pool)

    def stores(self) -> list[CacheStore]:
        return self.tiers.stores()

    def snapshot(self) -> tuple[dict[str, tuple[int, ...]], int, int]:
        """Counts for /metrics."""
        tiers = {}
        for store in self.stores():
            s = store.stats
            tiers[store.tier] = (s.hits, s.misses, s.coalesced, s.inserts, s.evictions, store.nbytes, store.max_bytes,
                                 len(store))  # fmt: skip
        return tiers, self.invalid.replayed, self.bypassed

    async def encode(
        self,
        images: list[bytes],
        request_id: str,
        deadline: float | None,
        *,
        via: Via,
        readers: int,
        mm_hashes: Sequence[str],
        lookup_only: bool,
    ) -> list[EncodedImage]:
        self._admission.check_image_count(len(images))
        hashes = self._hashes(images, mm_hashes)
        present = [data for data in images if data]
        if present:
            self._admission.check_request(present)
        store = self.tiers.store_for(via)
        if store is None or store.max_bytes <= 0:  # this tier keeps nothing (cache_ipc_mb = 0, say)
            if len(present) != len(images):
                raise InvalidRequestError(
                    "lookup by mm_hash needs the cache of this transport", reason=Reason.BAD_REQUEST
                )
            results = await self._steps(images, request_id, deadline, via=via, readers=readers)
            return [replace(r, mm_hash=h) for r, h in zip(results, hashes)]
        use_pool = store.tier == "pool"
        keys = [self.keys.key(h) for h in hashes]
        call = _Call(images, keys, store, request_id, deadline, via, readers, lookup_only, [None] * len(images))
        try:
            for round_ in range(2):
                todo = [i for i, r in enumerate(call.out) if r is None]
                if not todo:
                    break
                await self._round(call, todo, round_)
            results = [replace(r, mm_hash=h) for r, h in zip(call.out, hashes)]  # type: ignore[arg-type]
            if use_pool and any(r.handle is None for r in results) and call.leases:
                results = await self.tiers.without_leases(results, call.leases)  # the misses fell back to serialized
            return results
        except BaseException:
            if use_pool:
                self.tiers.abandon(call.leases)
            raise

    async def _round(self, call: _Call, todo: list[int], round_: int) -> None:
        images, keys, out, store = call.images, call.keys, call.out, call.store
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
                    served = await self.tiers.serve(
                        entry, i, call.via.session, call.readers, call.deadline, call.leases
                    )
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
                    if not call.lookup_only:
                        raise UnknownKeyError("no cached embedding for this mm_hash: send the image bytes", index=i)
                    out[i] = self.tiers.absent(i)
                    continue
                leaders[key] = [i]
                if future is None:  # registered at once: a request arriving during our awaits follows us
                    mine[key] = self._inflight[(store.tier, key)] = loop.create_future()
        except BaseException:
            self._settle(store, mine, {})
            raise
        misses = None
        if leaders:
            misses = asyncio.ensure_future(self._encode_misses(call, leaders, mine))
        try:
            followed = await asyncio.gather(
                *(self._follow(call, i, f) for i, f in waits.items()),
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
        self, call: _Call, leaders: dict[str, list[int]], mine: dict[str, asyncio.Future[Outcome]]
    ) -> dict[int, EncodedImage]:
        store = call.store
        order = list(leaders)
        first = [leaders[key][0] for key in order]
        outcomes: dict[str, Outcome] = {}
        try:
            results = await self._steps(
                [call.images[i] for i in first], call.request_id, call.deadline, via=call.via,
                readers=call.readers,
            )  # fmt: skip
            lease = getattr(results[0].handle, "lease", None)  # one lease holds the request's slices
            if lease is not None:
                call.leases.append(lease)
            out = {}
            for key, result in zip(order, results):
                outcomes[key] = await self.tiers.keep(store, key, result)
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

    async def _follow(self, call: _Call, i: int, future: asyncio.Future[Outcome]) -> EncodedImage | None:
        timeout = None if call.deadline is None else max(0.0, call.deadline - time.monotonic())
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
        served = await self.tiers.serve(outcome, i, call.via.session, call.readers, call.deadline, call.leases)
        return None if served is None else replace(served, cache="coalesced")

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
