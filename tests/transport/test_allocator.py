"""SliceAllocator: alignment, best fit, coalescing and the "None only when nothing fits" contract, checked
against a brute-force model of the pool's occupancy."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mmproc.transport.leases.allocator import Slice, SliceAllocator

A = 256  # default alignment


def test_constructor_validates_and_rounds_capacity_down() -> None:
    alloc = SliceAllocator(10 * A + 17)
    assert alloc.capacity == 10 * A
    assert alloc.free_ranges() == [(0, 10 * A)]
    assert (alloc.bytes_free, alloc.bytes_in_use, alloc.num_slices, alloc.largest_free) == (10 * A, 0, 0, 10 * A)
    for bad in [0, -1, A - 1]:
        with pytest.raises(ValueError):
            SliceAllocator(bad)
    with pytest.raises(ValueError):
        SliceAllocator(4 * A, alignment=0)
    with pytest.raises(ValueError):
        SliceAllocator(4 * A, max_slices=0)


@pytest.mark.parametrize("nbytes", [0, -1, -A, 1.5, True, "1"])
def test_bad_sizes_raise_value_error(nbytes: object) -> None:
    alloc = SliceAllocator(4 * A)
    with pytest.raises(ValueError):
        alloc.allocate(nbytes)  # type: ignore[arg-type]
    assert alloc.bytes_in_use == 0


def test_sizes_round_up_to_alignment_and_offsets_are_aligned() -> None:
    alloc = SliceAllocator(8 * A)
    a = alloc.allocate(1)
    b = alloc.allocate(A + 1)
    assert a == Slice(offset=0, nbytes=A, requested=1)
    assert b == Slice(offset=A, nbytes=2 * A, requested=A + 1)
    assert alloc.bytes_in_use == 3 * A
    assert alloc.aligned_size(A) == A


def test_exact_fit_fills_the_pool_then_none() -> None:
    alloc = SliceAllocator(4 * A)
    s = alloc.allocate(4 * A)
    assert s is not None and (s.offset, s.nbytes) == (0, 4 * A)
    assert alloc.bytes_free == 0 and alloc.largest_free == 0 and alloc.free_ranges() == []
    assert alloc.allocate(1) is None
    alloc.free(s)
    assert alloc.free_ranges() == [(0, 4 * A)]


def test_request_larger_than_pool_returns_none() -> None:
    alloc = SliceAllocator(4 * A)
    assert alloc.allocate(4 * A + 1) is None


def test_double_free_and_foreign_slice_raise() -> None:
    alloc = SliceAllocator(4 * A)
    s = alloc.allocate(A)
    assert s is not None
    alloc.free(s)
    with pytest.raises(ValueError, match="double free"):
        alloc.free(s)
    t = alloc.allocate(2 * A)
    assert t is not None
    with pytest.raises(ValueError):
        alloc.free(Slice(offset=t.offset, nbytes=A, requested=A))  # right offset, wrong size
    with pytest.raises(ValueError):
        alloc.free(Slice(offset=3 * A, nbytes=A, requested=A))  # never handed out
    assert alloc.bytes_in_use == 2 * A


def test_best_fit_prefers_the_smallest_hole_over_the_first() -> None:
    alloc = SliceAllocator(8 * A)
    big_hole = alloc.allocate(4 * A)  # [0, 4)
    keep1 = alloc.allocate(A)  # [4, 5)
    small_hole = alloc.allocate(2 * A)  # [5, 7)
    keep2 = alloc.allocate(A)  # [7, 8)
    assert None not in (big_hole, keep1, small_hole, keep2)
    alloc.free(big_hole)  # type: ignore[arg-type]
    alloc.free(small_hole)  # type: ignore[arg-type]
    # First fit would cut the 4-unit hole at 0; best fit takes the 2-unit hole and keeps 4 units whole.
    s = alloc.allocate(A)
    assert s is not None and s.offset == 5 * A
    assert alloc.largest_free == 4 * A
    t = alloc.allocate(4 * A)
    assert t is not None and t.offset == 0


def test_best_fit_ties_go_to_the_lowest_offset() -> None:
    alloc = SliceAllocator(6 * A)
    slices = [alloc.allocate(A) for _ in range(6)]
    alloc.free(slices[4])  # type: ignore[arg-type]
    alloc.free(slices[1])  # type: ignore[arg-type]
    s = alloc.allocate(A)
    assert s is not None and s.offset == A


def test_free_coalesces_with_both_neighbours() -> None:
    alloc = SliceAllocator(3 * A)
    a, b, c = (alloc.allocate(A) for _ in range(3))
    alloc.free(a)  # type: ignore[arg-type]
    alloc.free(c)  # type: ignore[arg-type]
    assert alloc.free_ranges() == [(0, A), (2 * A, A)]
    alloc.free(b)  # type: ignore[arg-type]
    assert alloc.free_ranges() == [(0, 3 * A)]
    assert alloc.largest_free == 3 * A


def test_max_slices_bounds_live_slices_even_with_space_left() -> None:
    alloc = SliceAllocator(8 * A, max_slices=2)
    a = alloc.allocate(A)
    assert a is not None and alloc.allocate(A) is not None
    assert alloc.allocate(A) is None
    alloc.free(a)
    assert alloc.allocate(A) is not None


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate/free sequences against a brute-force model: one bool per alignment unit."""

    def __init__(self) -> None:
        super().__init__()
        self.alloc: SliceAllocator
        self.units: list[bool] = []  # True = occupied
        self.live: dict[int, Slice] = {}

    @initialize(
        alignment=st.sampled_from([1, 8, 256]),
        num_units=st.integers(1, 48),
        slack=st.integers(0, 7),
        max_slices=st.integers(1, 24),
    )
    def setup(self, alignment: int, num_units: int, slack: int, max_slices: int) -> None:
        self.align = alignment
        self.alloc = SliceAllocator(
            num_units * alignment + slack % alignment, alignment=alignment, max_slices=max_slices
        )
        self.units = [False] * num_units
        self.max_slices = max_slices

    def free_runs(self) -> list[tuple[int, int]]:
        """Maximal free runs of the model as (start unit, length in units)."""
        runs, start = [], None
        for i, used in enumerate([*self.units, True]):
            if not used and start is None:
                start = i
            elif used and start is not None:
                runs.append((start, i - start))
                start = None
        return runs

    @rule(nbytes=st.integers(1, 20 * 256))
    def allocate(self, nbytes: int) -> None:
        need = -(-nbytes // self.align)
        fitting = [(length, start) for start, length in self.free_runs() if length >= need]
        s = self.alloc.allocate(nbytes)
        if len(self.live) >= self.max_slices or not fitting:
            assert s is None
            return
        assert s is not None, "allocate returned None although an aligned free range fits"
        # Best fit: the smallest fitting run, lowest offset on ties, cut from its start.
        _, best_start = min(fitting)
        assert s.offset == best_start * self.align
        assert s.offset % self.align == 0 and s.nbytes == need * self.align and s.requested == nbytes
        lo, hi = s.offset // self.align, s.end // self.align
        assert hi <= len(self.units) and not any(self.units[lo:hi]), "overlap with a live slice"
        self.units[lo:hi] = [True] * (hi - lo)
        self.live[s.offset] = s

    def _free(self, s: Slice) -> None:
        self.alloc.free(s)
        del self.live[s.offset]
        self.units[s.offset // self.align : s.end // self.align] = [False] * (s.nbytes // self.align)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self._free(self.live[data.draw(st.sampled_from(sorted(self.live)))])

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def double_free_is_refused(self, data: st.DataObject) -> None:
        s = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        self._free(s)
        with pytest.raises(ValueError):
            self.alloc.free(s)

    @invariant()
    def matches_model(self) -> None:
        if not self.units:
            return
        in_use = sum(s.nbytes for s in self.live.values())
        assert self.alloc.bytes_in_use == in_use
        assert self.alloc.bytes_free == self.alloc.capacity - in_use
        assert self.alloc.num_slices == len(self.live) <= self.max_slices
        runs = self.free_runs()
        assert self.alloc.free_ranges() == [(start * self.align, n * self.align) for start, n in runs]
        assert self.alloc.largest_free == max((n for _, n in runs), default=0) * self.align
        spans = sorted((s.offset, s.end) for s in self.live.values())
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))

    def teardown(self) -> None:
        if not self.units:
            return
        for s in list(self.live.values()):
            self.alloc.free(s)
        assert self.alloc.free_ranges() == [(0, self.alloc.capacity)]
        assert self.alloc.bytes_in_use == 0 and self.alloc.num_slices == 0


AllocatorMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestAllocatorStateful = AllocatorMachine.TestCase
