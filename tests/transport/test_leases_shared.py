"""Shared slices of the IPC pool (the embedding cache's): holds, leases sharing a slice, pressure relief. A slice a
consumer still reads is never freed, whoever else lets go of it (tests/transport/test_leases.py covers plain leases)."""

from __future__ import annotations

import threading
import time

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mmproc.transport.leases.allocator import SliceAllocator
from mmproc.transport.leases.records import Hold, Lease
from mmproc.transport.leases.table import LeaseTable
from service.pipeline.cache.store import CacheStore, Entry

A = 256


def make_table(units: int = 4, *, slots: int = 8) -> tuple[LeaseTable, SliceAllocator]:
    alloc = SliceAllocator(units * A)
    return LeaseTable(alloc, num_word_slots=slots), alloc


def ack(table: LeaseTable, lease: Lease) -> list[Lease]:
    table.release(lease.session_id, lease.lease_id)
    return table.confirm_acks({slot: lease.generation for slot in lease.slots})


def test_a_hold_keeps_the_slice_after_its_lease_is_acked() -> None:
    table, alloc = make_table()
    sid = table.open_session("w")
    lease = table.acquire(sid, 2 * A, deadline=None)
    hold = table.hold(lease)
    assert hold is not None and hold.slice == lease.slice
    assert ack(table, lease) == [lease]
    assert alloc.bytes_in_use == 2 * A  # the cache still holds it
    assert table.drop_hold(hold) is True and alloc.bytes_in_use == 0
    assert table.drop_hold(hold) is False  # a second drop changes nothing


def test_a_shared_lease_gets_its_own_slots_and_generation_on_the_same_bytes() -> None:
    table, alloc = make_table()
    first, second = table.open_session("a"), table.open_session("b")
    lease = table.acquire(first, A, deadline=None)
    hold = table.hold(lease)
    shared = table.share(second, hold, deadline=None)
    assert shared is not None and shared.slice == lease.slice and shared.session_id == second
    assert not set(shared.slots) & set(lease.slots) and shared.lease_id != lease.lease_id
    assert alloc.bytes_in_use == A  # no bytes allocated for a hit
    three = table.share(second, hold, deadline=None, readers=3)
    assert three is not None and three.readers == 3


def test_evicting_an_entry_never_frees_a_slice_a_consumer_still_reads() -> None:
    table, alloc = make_table(units=2)
    sid = table.open_session("reader")
    lease = table.acquire(sid, 2 * A, deadline=None)
    hold = table.hold(lease)
    ack(table, lease)
    reading = table.share(sid, hold, deadline=None)
    assert table.leased(hold)
    table.drop_hold(hold)  # evicted while the consumer reads
    assert alloc.bytes_in_use == 2 * A
    assert table.acquire(sid, A, deadline=None) is None  # its bytes cannot be handed out
    table.release(sid, reading.lease_id)
    assert table.confirm_acks({reading.slot: reading.generation - 1}) == []  # a stale ack is no proof
    assert table.confirm_acks({reading.slot: reading.generation}) == [reading]
    assert alloc.bytes_in_use == 0


def test_a_consumer_killed_while_holding_a_cached_slice() -> None:
    table, alloc = make_table(units=2)
    producer, victim, other = (table.open_session(name) for name in ("producer", "victim", "other"))
    lease = table.acquire(producer, A, deadline=None)
    hold = table.hold(lease)
    ack(table, lease)
    killed = table.share(victim, hold, deadline=None)
    still = table.share(other, hold, deadline=None)
    assert table.close_session(victim) == [killed]  # kill -9: its session stream ended
    assert alloc.bytes_in_use == A and table.leased(hold)  # the other reader and the cache keep it
    table.drop_hold(hold)
    assert alloc.bytes_in_use == A  # the other consumer is still reading
    assert table.close_session(other) == [still]
    assert alloc.bytes_in_use == 0


def test_share_of_a_dropped_hold_is_none() -> None:
    table, _ = make_table()
    sid = table.open_session("w")
    lease = table.acquire(sid, A, deadline=None)
    hold = table.hold(lease)
    table.drop_hold(hold)
    assert table.share(sid, hold, deadline=None) is None
    ack(table, lease)
    assert table.hold(lease) is None  # a freed lease cannot be held


def test_pool_pressure_is_relieved_from_unleased_cache_entries_before_waiting() -> None:
    table, alloc = make_table(units=4)
    sid = table.open_session("w")
    store = CacheStore("pool", 4 * A, "lru", on_evict=lambda e: table.drop_hold(e.hold))
    table.set_pressure_relief(lambda n: store.relieve(lambda e: table.leased(e.hold), lambda: table.fits(n)))
    holds = []
    for i in range(4):
        lease = table.acquire(sid, A, deadline=None)
        hold = table.hold(lease)
        holds.append(hold)
        store.put(f"k{i}", Entry(None, hold.slice, hold.slice.nbytes, hold))  # type: ignore[arg-type]
        ack(table, lease)
    reading = table.share(sid, holds[0], deadline=None)  # the oldest entry is read right now
    assert alloc.bytes_free == 0
    started = time.monotonic()
    big = table.acquire(sid, 2 * A, deadline=time.monotonic() + 5)
    assert big is not None and time.monotonic() - started < 5  # did not wait for the deadline
    assert store.get("k0") is not None  # the entry a lease reads was not the one given back
    assert len(store) == 2 and store.nbytes == 2 * A
    assert alloc.bytes_in_use == 2 * A + 2 * A and reading is not None


def test_relief_that_cannot_help_lets_the_request_wait_and_time_out() -> None:
    table, _ = make_table(units=1)
    sid = table.open_session("w")
    lease = table.acquire(sid, A, deadline=None)
    calls = []
    table.set_pressure_relief(lambda n: calls.append(n) or False)
    assert table.acquire(sid, A, deadline=time.monotonic() + 0.05) is None
    assert calls and calls[0] == A
    freed = threading.Timer(0.05, lambda: ack(table, lease))
    freed.start()
    assert table.acquire(sid, A, deadline=time.monotonic() + 5) is not None  # woken by the free, not by relief
    freed.join()


class SharedSliceMachine(RuleBasedStateMachine):
    """Leases, holds on them, leases sharing held slices, acks, session ends, drops, in any order: bytes in use are
    exactly the distinct slices some live lease or hold references, and those never overlap."""

    UNITS = 12
    SLOTS = 8

    def __init__(self) -> None:
        super().__init__()
        self.alloc = SliceAllocator(self.UNITS * A, max_slices=32)
        self.table = LeaseTable(self.alloc, num_word_slots=self.SLOTS, max_sessions=4)
        self.sessions: list[str] = []
        self.live: dict[int, Lease] = {}
        self.holds: dict[int, Hold] = {}

    def _forget(self, freed: list[Lease]) -> None:
        for lease in freed:
            assert self.live.pop(lease.lease_id) == lease

    @precondition(lambda self: len(self.sessions) < 4)
    @rule()
    def open_session(self) -> None:
        self.sessions.append(self.table.open_session(f"c{len(self.sessions)}"))

    @precondition(lambda self: self.sessions)
    @rule(data=st.data())
    def close_session(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.sessions))
        self.sessions.remove(sid)
        self._forget(self.table.close_session(sid))

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), nbytes=st.integers(1, 4 * A))
    def acquire(self, data: st.DataObject, nbytes: int) -> None:
        lease = self.table.acquire(data.draw(st.sampled_from(self.sessions)), nbytes, deadline=None)
        if lease is not None:
            self.live[lease.lease_id] = lease

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def hold(self, data: st.DataObject) -> None:
        hold = self.table.hold(self.live[data.draw(st.sampled_from(sorted(self.live)))])
        assert hold is not None
        self.holds[hold.hold_id] = hold

    @precondition(lambda self: self.holds and self.sessions)
    @rule(data=st.data(), readers=st.sampled_from([1, 2]))
    def share(self, data: st.DataObject, readers: int) -> None:
        hold = self.holds[data.draw(st.sampled_from(sorted(self.holds)))]
        lease = self.table.share(data.draw(st.sampled_from(self.sessions)), hold, deadline=None, readers=readers)
        if lease is None:
            assert sum(x.readers for x in self.live.values()) + readers > self.SLOTS
            return
        assert lease.slice == hold.slice
        self.live[lease.lease_id] = lease

    @precondition(lambda self: self.holds)
    @rule(data=st.data())
    def drop_hold(self, data: st.DataObject) -> None:
        assert self.table.drop_hold(self.holds.pop(data.draw(st.sampled_from(sorted(self.holds)))))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        self._forget(ack(self.table, self.live[data.draw(st.sampled_from(sorted(self.live)))]))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abandon(self, data: st.DataObject) -> None:
        lease = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        if self.table.abandon(lease):
            self._forget([lease])

    @invariant()
    def referenced_slices_are_exactly_the_allocated_ones(self) -> None:
        referenced = {x.slice for x in self.live.values()} | {h.slice for h in self.holds.values()}
        assert self.alloc.bytes_in_use == sum(s.nbytes for s in referenced)
        spans = sorted((s.offset, s.end) for s in referenced)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
        slots = [slot for x in self.live.values() for slot in x.slots]
        assert len(slots) == len(set(slots))
        for hold in self.holds.values():
            assert self.table.leased(hold) == any(x.slice == hold.slice for x in self.live.values())

    def teardown(self) -> None:
        for sid in list(self.sessions):
            self._forget(self.table.close_session(sid))
        for hold in self.holds.values():
            self.table.drop_hold(hold)
        assert self.alloc.bytes_in_use == 0 and self.alloc.free_ranges() == [(0, self.UNITS * A)]


SharedSliceMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestSharedSlices = SharedSliceMachine.TestCase
