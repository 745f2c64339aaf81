"""Best-fit slice allocator of the CUDA IPC pool (why best fit: docs/ipc.md). Not thread-safe: `LeaseTable`
calls it under its lock."""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

__all__ = ["Slice", "SliceAllocator"]


@dataclass(frozen=True)
class Slice:
    """`[offset, offset + nbytes)`; `nbytes` is `requested` rounded up to the alignment."""

    offset: int
    nbytes: int
    requested: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class SliceAllocator:
    """Aligned byte ranges in `[0, capacity)`, capacity rounded down to the alignment; at most `max_slices`
    live. Running out is not an error: `allocate` returns None and the caller decides."""

    def __init__(self, capacity: int, *, alignment: int = 256, max_slices: int = 4096) -> None:
        _check_positive_int("capacity", capacity)
        self._alignment = _check_positive_int("alignment", alignment)
        self._max_slices = _check_positive_int("max_slices", max_slices)
        self._capacity = capacity // alignment * alignment
        if self._capacity == 0:
            raise ValueError(f"capacity {capacity} is smaller than one aligned slice ({alignment} bytes)")
        # free ranges, three views in step: sorted (size, offset) for best fit, start/end maps for coalescing
        self._by_size: list[tuple[int, int]] = []
        self._size_at: dict[int, int] = {}
        self._start_at_end: dict[int, int] = {}
        self._live: dict[int, Slice] = {}  # offset -> live slice
        self._in_use = 0
        self._add_free(0, self._capacity)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def alignment(self) -> int:
        return self._alignment

    @property
    def max_slices(self) -> int:
        return self._max_slices

    @property
    def bytes_in_use(self) -> int:
        return self._in_use

    @property
    def bytes_free(self) -> int:
        return self._capacity - self._in_use

    @property
    def num_slices(self) -> int:
        return len(self._live)

    @property
    def largest_free(self) -> int:
        """The biggest request that can succeed now (if under `max_slices`)."""
        return self._by_size[-1][0] if self._by_size else 0

    def aligned_size(self, nbytes: int) -> int:
        """`nbytes` rounded up to the alignment."""
        _check_positive_int("nbytes", nbytes)
        return -(-nbytes // self._alignment) * self._alignment

    def free_ranges(self) -> list[tuple[int, int]]:
        """(offset, size) of every free range, by offset."""
        return sorted(self._size_at.items())

    def allocate(self, nbytes: int) -> Slice | None:
        """A slice of at least `nbytes`, or None when none fits; ValueError for a bad size."""
        size = self.aligned_size(nbytes)
        if len(self._live) >= self._max_slices:
            return None
        # smallest hole >= size; offset -1 sorts before every real offset
        i = bisect_left(self._by_size, (size, -1))
        if i == len(self._by_size):
            return None
        hole, offset = self._by_size[i]
        self._remove_free(offset, hole)
        if hole > size:
            self._add_free(offset + size, hole - size)
        s = Slice(offset=offset, nbytes=size, requested=nbytes)
        self._live[offset] = s
        self._in_use += size
        return s

    def free(self, s: Slice) -> None:
        """Give a slice back (coalescing); ValueError on a double free or a foreign slice."""
        if self._live.get(s.offset) != s:
            raise ValueError(f"{s} is not a live slice of this allocator (double free or foreign slice)")
        del self._live[s.offset]
        self._in_use -= s.nbytes
        start, size = s.offset, s.nbytes
        left_start = self._start_at_end.get(start)
        if left_start is not None:
            self._remove_free(left_start, start - left_start)
            size += start - left_start
            start = left_start
        right_size = self._size_at.get(s.end)
        if right_size is not None:
            self._remove_free(s.end, right_size)
            size += right_size
        self._add_free(start, size)

    def __repr__(self) -> str:
        return (
            f"SliceAllocator(capacity={self._capacity}, in_use={self._in_use}, slices={len(self._live)}, "
            f"free_ranges={len(self._size_at)}, largest_free={self.largest_free})"
        )

    def _add_free(self, offset: int, size: int) -> None:
        insort(self._by_size, (size, offset))
        self._size_at[offset] = size
        self._start_at_end[offset + size] = offset

    def _remove_free(self, offset: int, size: int) -> None:
        i = bisect_left(self._by_size, (size, offset))
        assert self._by_size[i] == (size, offset), "free list out of step"
        del self._by_size[i]
        del self._size_at[offset]
        del self._start_at_end[offset + size]
