"""Eviction policies of the embedding cache, over keys and sizes only. `victim(skip)` removes and returns the next
key to evict, never one `skip(key)` holds back, or None.

- `lru`: least recently used first.
- `s3fifo` (Yang et al., "FIFO queues are all you need for cache eviction", SOSP 2023): a small FIFO (10% of the
  bytes), a main FIFO with hit counters capped at 3, a ghost FIFO of keys; one-hit wonders never push out re-sent
  images (docs/cache.md)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

POLICIES = ("s3fifo", "lru")


def _never(key: Hashable) -> bool:
    return False


class LruPolicy:
    def __init__(self, max_bytes: int) -> None:
        self._order: OrderedDict[Hashable, int] = OrderedDict()  # least recent first

    def __contains__(self, key: Hashable) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)

    def insert(self, key: Hashable, nbytes: int) -> None:
        self._order[key] = nbytes

    def hit(self, key: Hashable) -> None:
        self._order.move_to_end(key)

    def remove(self, key: Hashable) -> None:
        self._order.pop(key, None)

    def victim(self, skip: Callable[[Hashable], bool] = _never) -> Hashable | None:
        for key in self._order:
            if not skip(key):
                del self._order[key]
                return key
        return None


class S3FifoPolicy:
    SMALL_SHARE = 0.1
    MAX_FREQ = 3

    def __init__(self, max_bytes: int, *, max_ghosts: int = 65_536) -> None:
        self._small_target = max(1, int(max_bytes * self.SMALL_SHARE))
        self._small: OrderedDict[Hashable, int] = OrderedDict()  # oldest first
        self._main: OrderedDict[Hashable, int] = OrderedDict()
        self._size: dict[Hashable, int] = {}
        self._freq: dict[Hashable, int] = {}
        self._small_bytes = 0
        self._ghost: OrderedDict[Hashable, None] = OrderedDict()
        self._max_ghosts = max_ghosts

    def __contains__(self, key: Hashable) -> bool:
        return key in self._size

    def __len__(self) -> int:
        return len(self._size)

    def insert(self, key: Hashable, nbytes: int) -> None:
        self._size[key] = nbytes
        self._freq[key] = 0
        if self._ghost.pop(key, False) is None:  # seen and evicted recently: it is worth keeping
            self._main[key] = nbytes
        else:
            self._small[key] = nbytes
            self._small_bytes += nbytes

    def hit(self, key: Hashable) -> None:
        self._freq[key] = min(self.MAX_FREQ, self._freq[key] + 1)

    def remove(self, key: Hashable) -> None:
        nbytes = self._size.pop(key, None)
        if nbytes is None:
            return
        del self._freq[key]
        if self._small.pop(key, None) is not None:
            self._small_bytes -= nbytes
        else:
            self._main.pop(key, None)

    def victim(self, skip: Callable[[Hashable], bool] = _never) -> Hashable | None:
        # Each key is looked at a bounded number of times: moved small -> main once, its counter lowered at most
        # MAX_FREQ times, skipped at most once per queue.
        budget = (self.MAX_FREQ + 3) * len(self._size) + 2
        skipped_small: list[tuple[Hashable, int]] = []
        skipped_main: list[tuple[Hashable, int]] = []
        found = None
        while budget > 0 and (self._small or self._main):
            budget -= 1
            if self._small and (self._small_bytes > self._small_target or not self._main):
                key, nbytes = self._small.popitem(last=False)
                self._small_bytes -= nbytes
                if self._freq[key] > 0:
                    self._freq[key] = 0
                    self._main[key] = nbytes
                elif skip(key):
                    skipped_small.append((key, nbytes))
                else:
                    self._ghost[key] = None
                    while len(self._ghost) > self._max_ghosts:
                        self._ghost.popitem(last=False)
                    found = key
                    break
            else:
                key, nbytes = self._main.popitem(last=False)
                if self._freq[key] > 0:
                    self._freq[key] -= 1
                    self._main[key] = nbytes
                elif skip(key):
                    skipped_main.append((key, nbytes))
                else:
                    found = key
                    break
        for key, nbytes in reversed(skipped_small):  # back at the old end, in their order
            self._small[key] = nbytes
            self._small.move_to_end(key, last=False)
            self._small_bytes += nbytes
        for key, nbytes in reversed(skipped_main):
            self._main[key] = nbytes
            self._main.move_to_end(key, last=False)
        if found is not None:
            del self._size[found], self._freq[found]
        return found


def make_policy(name: str, max_bytes: int) -> LruPolicy | S3FifoPolicy:
    if name == "lru":
        return LruPolicy(max_bytes)
    if name == "s3fifo":
        return S3FifoPolicy(max_bytes)
    raise ValueError(f"cache policy must be one of {POLICIES}, got {name!r}")
