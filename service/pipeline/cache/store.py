"""The stores of the embedding cache (docs/cache.md): a byte-bounded map per tier, and the memory of invalid
images. Thread-safe: lease-waiter threads relieve the pool tier, taking its lock before the lease table's."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mmproc.errors import InvalidMediaError
from mmproc.transport.leases.records import Hold
from service.pipeline.cache.policy import make_policy

if TYPE_CHECKING:  # service.pipeline.requests owns the cache
    from mmproc.wire.results import EncodedImage

TIERS = ("host", "pool")


@dataclass(frozen=True)
class CacheConfig:
    host_bytes: int = 1 << 30  # 0 with pool_bytes 0: no cache at all
    pool_bytes: int = 0
    policy: str = "s3fifo"
    hash: str = "xxh3"
    invalid_ttl_s: float = 30.0
    max_invalid: int = 4096

    @property
    def enabled(self) -> bool:
        return self.host_bytes > 0 or self.pool_bytes > 0


@dataclass(frozen=True)
class Entry:
    """One cached image: an owned CPU tensor (host) or a pool slice view valid while `hold` is; `charge_*`: what its
    bytes count as (pool: its slice, once)."""

    result: EncodedImage
    charge_key: Hashable
    charge_bytes: int
    hold: Hold | None = None


@dataclass
class TierStats:
    hits: int = 0
    misses: int = 0
    coalesced: int = 0
    inserts: int = 0
    evictions: int = 0


class CacheStore:
    """One tier: key -> Entry within `max_bytes`. `on_evict(entry)` runs for every entry that leaves (pool: drops
    its hold), under this store's lock."""

    def __init__(self, tier: str, max_bytes: int, policy: str, on_evict: Callable[[Entry], None]) -> None:
        self.tier = tier
        self.max_bytes = max_bytes
        self._policy = make_policy(policy, max_bytes)
        self._entries: dict[str, Entry] = {}
        self._charges: dict[Hashable, list[int]] = {}  # charge key -> [bytes, entries]
        self._bytes = 0
        self._on_evict = on_evict
        self._lock = threading.Lock()
        self.stats = TierStats()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Entry]:
        """A snapshot of the entries held, without touching the policy (a `get` counts as a hit)."""
        with self._lock:
            return list(self._entries.values())

    def get(self, key: str) -> Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._policy.hit(key)
            return entry

    def put(self, key: str, entry: Entry) -> bool:
        """Keep `entry` under `key`, evicting by the policy until it fits; False (nothing kept, `on_evict` run for
        it) when it cannot fit even in an empty store."""
        with self._lock:
            if key in self._entries:
                self._on_evict(entry)  # a concurrent miss of the same image (bypassing coalescing) got here first
                return False
            new_charge = 0 if entry.charge_key in self._charges else entry.charge_bytes
            while self._bytes + new_charge > self.max_bytes:
                victim = self._policy.victim(lambda k: self._entries[k].charge_key == entry.charge_key)
                if victim is None:
                    self._on_evict(entry)
                    return False
                self._drop_locked(victim)
            self._entries[key] = entry
            self._policy.insert(key, entry.charge_bytes)
            charge = self._charges.setdefault(entry.charge_key, [entry.charge_bytes, 0])
            if charge[1] == 0:
                self._bytes += entry.charge_bytes
            charge[1] += 1
            self.stats.inserts += 1
            return True

    def relieve(self, busy: Callable[[Entry], bool], done: Callable[[], bool]) -> bool:
        """Evict entries for which `busy` is false (policy order) until `done()`; True if any went."""
        evicted = False
        with self._lock:
            while not done():
                victim = self._policy.victim(lambda k: busy(self._entries[k]))
                if victim is None:
                    break
                self._drop_locked(victim)
                evicted = True
        return evicted

    def clear(self) -> None:
        with self._lock:
            for key in list(self._entries):
                self._policy.remove(key)
                self._drop_locked(key)

    def _drop_locked(self, key: str) -> None:
        entry = self._entries.pop(key)
        charge = self._charges[entry.charge_key]
        charge[1] -= 1
        if charge[1] == 0:
            del self._charges[entry.charge_key]
            self._bytes -= charge[0]
        self.stats.evictions += 1
        self._on_evict(entry)


class InvalidImages:
    """Images found invalid, their error replayed for `ttl_s` so a retry loop cannot make the server decode a
    hostile file again and again. Event loop only."""

    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self._ttl_s = ttl_s
        self._max = max_entries
        self._errors: OrderedDict[str, tuple[float, InvalidMediaError]] = OrderedDict()
        self.replayed = 0

    def __len__(self) -> int:
        return len(self._errors)

    def add(self, key: str, error: InvalidMediaError, now: float | None = None) -> None:
        if self._ttl_s <= 0 or self._max <= 0:
            return
        now = time.monotonic() if now is None else now
        self._errors.pop(key, None)
        self._errors[key] = (now + self._ttl_s, error)
        while len(self._errors) > self._max:
            self._errors.popitem(last=False)

    def check(self, key: str, index: int, now: float | None = None) -> None:
        """Raise the error remembered for `key`, naming image `index`; nothing when none (or it expired)."""
        found = self._errors.get(key)
        if found is None:
            return
        now = time.monotonic() if now is None else now
        if found[0] <= now:
            del self._errors[key]
            return
        self.replayed += 1
        raise found[1].at_index(index)
