"""Slice allocator of the CUDA IPC pool: byte ranges of one fixed region, host-side bookkeeping only.

Best fit over a free list sorted by (size, offset), ties to the lowest offset; freed ranges coalesce at once.
Why best fit, and the pool's layout: docs/ipc.md. Not thread-safe: `LeaseTable` calls it under its lock.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

__all__ = ["Slice", "SliceAllocator"]


@dataclass(frozen=True)
class Slice:
    """One allocated byte range: `[offset, offset + nbytes)`; `nbytes` is `requested` rounded up to the
    alignment. Frozen, so that it can be handed around and compared when freed."""

    offset: int
    nbytes: int
    requested: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


def _check_positive_int(name: str, value: object) -> int:
    # bool is an int subclass; True bytes is a bug, not a size.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class SliceAllocator:
    """Best-fit allocator of aligned byte ranges in `[0, capacity)`.

    `capacity` is rounded down to a multiple of `alignment` (the tail that cannot hold an aligned slice is
    never handed out; `capacity` reports the usable size). `max_slices` bounds the number of live slices
    and hence the free-list length. Running out is not an error: `allocate` returns None and the caller
    decides (wait, fall back to the serialized transport, or refuse with RESOURCE_EXHAUSTED).
    """

    def __init__(self, capacity: int, *, alignment: int = 256, max_slices: int = 4096) -> None:
        _check_positive_int("capacity", capacity)
        self._alignment = _check_positive_int("alignment", alignment)
        self._max_slices = _check_positive_int("max_slices", max_slices)
        self._capacity = capacity // alignment * alignment
        if self._capacity == 0:
            raise ValueError(f"capacity {capacity} is smaller than one aligned slice ({alignment} bytes)")
        # Free ranges, three views kept in step: sorted (size, offset) for best fit, and start -> size /
        # end -> start for O(1) neighbour lookup when coalescing.
        self._by_size: list[tuple[int, int]] = []
        self._size_at: dict[int, int] = {}
        self._start_at_end: dict[int, int] = {}
        self._live: dict[int, Slice] = {}  # offset -> live slice
        self._in_use = 0
        self._add_free(0, self._capacity)

    # -- public API ----------------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Usable bytes (the constructor's capacity rounded down to the alignment)."""
        return self._capacity

    @property
    def alignment(self) -> int:
        return self._alignment

    @property
    def max_slices(self) -> int:
        return self._max_slices

    @property
    def bytes_in_use(self) -> int:
        """Sum of live slices' aligned sizes."""
        return self._in_use

    @property
    def bytes_free(self) -> int:
        return self._capacity - self._in_use

    @property
    def num_slices(self) -> int:
        return len(self._live)

    @property
    def largest_free(self) -> int:
        """Size of the largest free range: the biggest request that can succeed right now (if a slice is
        left under `max_slices`)."""
        return self._by_size[-1][0] if self._by_size else 0

    def aligned_size(self, nbytes: int) -> int:
        """`nbytes` rounded up to the alignment: what a slice of that request occupies."""
        _check_positive_int("nbytes", nbytes)
        return -(-nbytes // self._alignment) * self._alignment

    def free_ranges(self) -> list[tuple[int, int]]:
        """(offset, size) of every free range, by offset. For tests and debugging."""
        return sorted(self._size_at.items())

    def allocate(self, nbytes: int) -> Slice | None:
        """A slice of at least `nbytes` bytes, or None when no free range fits or `max_slices` are live.

        Raises ValueError for a size that is not a positive int (a caller bug, not a full pool).
        """
        size = self.aligned_size(nbytes)
        if len(self._live) >= self._max_slices:
            return None
        # Smallest hole with size >= `size`; offset -1 sorts before every real offset of that size.
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
        """Give a slice back; it coalesces with free neighbours. Raises ValueError on a double free or a
        slice this allocator did not hand out (freeing either would corrupt the free list)."""
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

    # -- free-list maintenance -----------------------------------------------------------------------------

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
