"""LeaseTable: the lease state machine, device-ack gating of reuse, sessions, TTL, bounded waiting."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mmproc.errors import ResourceExhaustedError
from mmproc.transport.leases.allocator import SliceAllocator
from mmproc.transport.leases.records import (
    GENERATION_MAX,
    MAX_READERS,
    Lease,
    LeaseNotOwnedError,
    LeaseState,
    LeaseStats,
    TooManySessionsError,
    UnknownLeaseError,
    UnknownSessionError,
    next_generation,
)
from mmproc.transport.leases.table import LeaseTable

A = 256


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_table(units: int = 4, *, slots: int = 8, **kwargs: object) -> LeaseTable:
    return LeaseTable(SliceAllocator(units * A), num_word_slots=slots, **kwargs)  # type: ignore[arg-type]


def test_lifecycle_acquire_release_confirm() -> None:
    table = make_table()
    sid = table.open_session("worker-0")
    lease = table.acquire(sid, 100, deadline=None)
    assert lease is not None
    assert (lease.session_id, lease.offset, lease.nbytes, lease.slice.requested) == (sid, 0, A, 100)
    assert lease.generation == 1 and 0 <= lease.slot < table.num_word_slots
    assert table.state_of(lease.lease_id) is LeaseState.LEASED
    assert table.pending_ack_slots() == []
    assert table.stats() == LeaseStats(A, 1, 0, 1, 0, 0, 0)

    assert table.release(sid, lease.lease_id) is True
    assert table.state_of(lease.lease_id) is LeaseState.RELEASED
    assert table.pending_ack_slots() == [lease.slot]
    assert table.stats().leases_awaiting_ack == 1 and table.stats().leases_active == 0

    assert table.confirm_acks({lease.slot: lease.generation}) == [lease]
    assert table.state_of(lease.lease_id) is None
    assert table.pending_ack_slots() == []
    assert table.stats() == LeaseStats(0, 0, 0, 1, 0, 0, 0)


def test_released_lease_is_not_reused_until_its_device_ack() -> None:
    table = make_table(units=1)
    sid = table.open_session("w")
    lease = table.acquire(sid, A, deadline=None)
    assert lease is not None
    table.release(sid, lease.lease_id)
    # The host said "released", but the ack word has not landed: the slice must stay untouched.
    assert table.acquire(sid, A, deadline=time.monotonic() + 0.05) is None
    assert table.confirm_acks({lease.slot: 0}) == []  # ack word not yet written
    assert table.confirm_acks({lease.slot: lease.generation + 1}) == []  # not this lease's generation
    assert table.acquire(sid, A, deadline=None) is None
    assert table.stats().waits_timed_out_total == 2
    assert table.confirm_acks({lease.slot: lease.generation}) == [lease]
    again = table.acquire(sid, A, deadline=None)
    assert again is not None and again.offset == lease.offset


def test_ack_observed_while_still_leased_does_not_free() -> None:
    table = make_table()
    sid = table.open_session("w")
    lease = table.acquire(sid, A, deadline=None)
    assert lease is not None
    assert table.confirm_acks({lease.slot: lease.generation}) == []
    assert table.state_of(lease.lease_id) is LeaseState.LEASED


def test_stale_ack_from_an_earlier_generation_does_not_free_a_newer_lease() -> None:
    table = make_table(slots=1)
    sid = table.open_session("w")
    first = table.acquire(sid, A, deadline=None)
    assert first is not None
    table.release(sid, first.lease_id)
    table.confirm_acks({first.slot: first.generation})
    second = table.acquire(sid, A, deadline=None)
    assert second is not None and second.slot == first.slot
    assert second.generation == next_generation(first.generation) != first.generation
    table.release(sid, second.lease_id)
    # The ack word still holds the first lease's generation (the second copy is in flight).
    assert table.confirm_acks({second.slot: first.generation}) == []
    assert table.state_of(second.lease_id) is LeaseState.RELEASED
    assert table.confirm_acks({second.slot: second.generation}) == [second]


def test_ack_words_read_as_signed_int64_compare_modulo_2_64() -> None:
    table = make_table()
    sid = table.open_session("w")
    lease = table.acquire(sid, A, deadline=None)
    assert lease is not None
    table.release(sid, lease.lease_id)
    assert table.confirm_acks({lease.slot: -1, 999: lease.generation}) == []  # garbage word; unknown slot
    assert table.confirm_acks({lease.slot: lease.generation - 2**64}) == [lease]


def test_generation_is_never_zero_and_wraps_to_one() -> None:
    assert next_generation(0) == 1
    assert next_generation(41) == 42
    assert next_generation(GENERATION_MAX) == 1
    assert GENERATION_MAX == 2**63 - 1  # fits a signed int64 device word


def test_word_slots_bound_leases_in_flight() -> None:
    table = make_table(units=64, slots=2)
    sid = table.open_session("w")
    a, b = table.acquire(sid, A, deadline=None), table.acquire(sid, A, deadline=None)
    assert a is not None and b is not None and a.slot != b.slot
    assert table.acquire(sid, A, deadline=None) is None
    table.abandon(a)
    c = table.acquire(sid, A, deadline=None)
    assert c is not None and c.slot == a.slot and c.generation == a.generation + 1


def test_close_session_reclaims_everything_and_wakes_a_waiter() -> None:
    table = make_table(units=2)
    dead = table.open_session("killed")
    other = table.open_session("alive")
    leased = table.acquire(dead, A, deadline=None)
    released = table.acquire(dead, A, deadline=None)
    assert leased is not None and released is not None
    table.release(dead, released.lease_id)

    result: list[Lease | None] = []
    waiter = threading.Thread(target=lambda: result.append(table.acquire(other, 2 * A, deadline=time.monotonic() + 5)))
    start = time.monotonic()
    waiter.start()
    time.sleep(0.05)
    assert waiter.is_alive()  # blocked: the pool is full
    assert sorted(lease.lease_id for lease in table.close_session(dead)) == [leased.lease_id, released.lease_id]
    waiter.join(timeout=5)
    assert not waiter.is_alive() and time.monotonic() - start < 2
    assert result[0] is not None and result[0].session_id == other and result[0].nbytes == 2 * A
    stats = table.stats()
    assert (stats.sessions, stats.reclaimed_total, stats.bytes_in_use) == (1, 2, 2 * A)
    with pytest.raises(UnknownSessionError):
        table.close_session(dead)
    with pytest.raises(UnknownSessionError):
        table.release(dead, leased.lease_id)


def test_waiter_whose_own_session_closes_gets_unknown_session() -> None:
    table = make_table(units=1)
    holder = table.open_session("holder")
    waiting = table.open_session("waiting")
    assert table.acquire(holder, A, deadline=None) is not None
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            table.acquire(waiting, A, deadline=time.monotonic() + 5)
        except UnknownSessionError as exc:
            errors.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.05)
    table.close_session(waiting)
    table.close_session(holder)  # frees space and wakes the waiter, which finds its session gone
    t.join(timeout=5)
    assert not t.is_alive() and len(errors) == 1


def test_ttl_expiry_with_injected_clock(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    table = make_table(units=8, ttl_s=60.0, clock=clock)
    sid = table.open_session("slow-consumer")
    leased = table.acquire(sid, A, deadline=None)
    clock.now += 30
    released = table.acquire(sid, A, deadline=None)
    assert leased is not None and released is not None
    table.release(sid, released.lease_id)
    clock.now += 29.9
    assert table.expire() == []
    clock.now += 0.1  # leased is 60 s old
    with caplog.at_level(logging.WARNING, logger="mmproc.transport.leases.table"):
        assert table.expire() == [leased]
    assert f"lease {leased.lease_id} of session {sid}" in caplog.text
    assert table.state_of(leased.lease_id) is None
    assert table.expire(now=clock.now + 30) == [released]  # RELEASED leases expire too (ack never came)
    stats = table.stats()
    assert (stats.expired_total, stats.bytes_in_use, stats.leases_active, stats.leases_awaiting_ack) == (2, 0, 0, 0)
    assert table.release(sid, released.lease_id) is False  # a late release of a freed lease is harmless
    # A late ack of the expired lease cannot free the next lease on its slot.
    fresh = [table.acquire(sid, A, deadline=None) for _ in range(table.num_word_slots)]
    reuse = next(x for x in fresh if x is not None and x.slot == released.slot)
    table.release(sid, reuse.lease_id)
    assert table.confirm_acks({released.slot: released.generation}) == []
    assert table.state_of(reuse.lease_id) is LeaseState.RELEASED


def test_deadline_in_the_past_returns_none_immediately() -> None:
    table = make_table(units=1)
    sid = table.open_session("w")
    assert table.acquire(sid, A, deadline=None) is not None
    start = time.monotonic()
    assert table.acquire(sid, A, deadline=time.monotonic() - 1) is None
    assert time.monotonic() - start < 0.05
    assert table.stats().waits_timed_out_total == 1


def test_waiting_is_bounded_by_the_deadline() -> None:
    table = make_table(units=1)
    sid = table.open_session("w")
    assert table.acquire(sid, A, deadline=None) is not None
    start = time.monotonic()
    assert table.acquire(sid, A, deadline=start + 0.2) is None
    assert 0.19 <= time.monotonic() - start < 1.0


def test_request_larger_than_the_pool_gives_up_without_waiting() -> None:
    table = make_table(units=2)
    sid = table.open_session("w")
    start = time.monotonic()
    assert table.acquire(sid, 2 * A + 1, deadline=start + 10) is None
    assert time.monotonic() - start < 0.05


def test_bad_arguments() -> None:
    table = make_table()
    sid = table.open_session("w")
    with pytest.raises(ValueError):
        table.acquire(sid, 0, deadline=None)
    with pytest.raises(ValueError):
        table.acquire(sid, A, deadline=float("inf"))
    with pytest.raises(UnknownSessionError):
        table.acquire("nope", A, deadline=None)
    with pytest.raises(KeyError):  # UnknownSessionError is a KeyError / LookupError
        table.acquire("nope", A, deadline=None)
    with pytest.raises(ValueError):
        make_table(slots=0)
    with pytest.raises(ValueError):
        make_table(ttl_s=0)


def test_abandon_frees_at_once_but_not_a_released_lease() -> None:
    table = make_table(units=1)
    sid = table.open_session("w")
    lease = table.acquire(sid, A, deadline=None)
    assert lease is not None
    assert table.abandon(lease) is True
    assert table.abandon(lease) is False  # idempotent
    assert table.stats().bytes_in_use == 0
    again = table.acquire(sid, A, deadline=None)
    assert again is not None
    table.release(sid, again.lease_id)
    assert table.abandon(again) is False  # the consumer has it: only its ack may free it
    assert table.state_of(again.lease_id) is LeaseState.RELEASED


def test_release_rules() -> None:
    table = make_table()
    mine, theirs = table.open_session("a"), table.open_session("b")
    assert mine != theirs
    lease = table.acquire(mine, A, deadline=None)
    assert lease is not None
    with pytest.raises(LeaseNotOwnedError):
        table.release(theirs, lease.lease_id)
    assert table.state_of(lease.lease_id) is LeaseState.LEASED
    assert table.release(mine, lease.lease_id) is True
    assert table.release(mine, lease.lease_id) is False  # idempotent
    with pytest.raises(UnknownLeaseError):
        table.release(mine, lease.lease_id + 100)
    with pytest.raises(UnknownLeaseError):
        table.release(mine, 0)


def test_max_sessions_is_a_resource_exhausted_error() -> None:
    table = make_table(max_sessions=2)
    first = table.open_session("a")
    table.open_session("b")
    with pytest.raises(TooManySessionsError) as info:
        table.open_session("c")
    assert isinstance(info.value, ResourceExhaustedError) and info.value.http_status == 429
    table.close_session(first)
    table.open_session("c")
    assert table.stats().sessions == 2


def test_max_leases_per_session() -> None:
    table = make_table(units=8, max_leases_per_session=2)
    greedy, other = table.open_session("greedy"), table.open_session("other")
    assert table.acquire(greedy, A, deadline=None) is not None
    assert table.acquire(greedy, A, deadline=None) is not None
    assert table.acquire(greedy, A, deadline=None) is None
    assert table.acquire(other, A, deadline=None) is not None


# -- several readers (tensor-parallel fan-out) ------------------------------------------------------------------


def shared_lease(table: LeaseTable, sid: str, readers: int = 3) -> Lease:
    lease = table.acquire(sid, A, deadline=None, readers=readers)
    assert lease is not None
    return lease


def test_multi_reader_lease_holds_one_word_slot_per_reader_with_one_generation() -> None:
    table = make_table(slots=8)
    sid = table.open_session("rank-0")
    lease = shared_lease(table, sid, readers=4)
    assert lease.readers == 4 and len(set(lease.slots)) == 4 and lease.slot == lease.slots[0]
    assert lease.generation == 1
    assert table.pending_ack_slots() == []
    table.release(sid, lease.lease_id)
    assert table.pending_ack_slots() == sorted(lease.slots)  # the reclaimer reads every reader's ack word
    single = table.acquire(sid, A, deadline=None)
    assert single is not None and single.readers == 1 and single.slot not in lease.slots


def test_multi_reader_lease_is_not_freed_until_every_reader_acked() -> None:
    table = make_table(units=1, slots=4)
    sid = table.open_session("rank-0")
    lease = shared_lease(table, sid, readers=3)
    g = lease.generation
    assert table.confirm_acks(dict.fromkeys(lease.slots, g)) == []  # every ack in, but the owner has not released
    table.release(sid, lease.lease_id)
    assert table.confirm_acks({lease.slots[0]: g}) == []  # rank 0 (the owner) acked; ranks 1 and 2 still read
    assert table.confirm_acks({lease.slots[0]: g, lease.slots[1]: g, lease.slots[2]: 0}) == []  # rank 2 not yet
    assert table.confirm_acks({lease.slots[1]: g, lease.slots[2]: g}) == []  # a partial read misses rank 0's word
    assert table.acquire(sid, A, deadline=None) is None  # the slice stays untouched meanwhile
    assert table.confirm_acks(dict.fromkeys(lease.slots, g)) == [lease]
    again = table.acquire(sid, A, deadline=None, readers=3)
    assert again is not None and again.offset == lease.offset


def test_a_stale_ack_of_one_reader_does_not_count() -> None:
    table = make_table(slots=3)
    sid = table.open_session("rank-0")
    first = shared_lease(table, sid, readers=3)
    table.release(sid, first.lease_id)
    assert table.confirm_acks(dict.fromkeys(first.slots, first.generation)) == [first]
    second = shared_lease(table, sid, readers=3)
    assert set(second.slots) == set(first.slots) and second.generation == first.generation + 1
    table.release(sid, second.lease_id)
    # Ranks 0 and 1 acked the new generation; rank 2's word still holds its ack of the previous lease.
    words = {second.slots[0]: second.generation, second.slots[1]: second.generation, second.slots[2]: first.generation}
    assert table.confirm_acks(words) == []
    assert table.state_of(second.lease_id) is LeaseState.RELEASED
    words[second.slots[2]] = second.generation
    assert table.confirm_acks(words) == [second]


def test_shared_generation_is_above_every_slot_history() -> None:
    table = make_table(units=8, slots=2)
    sid = table.open_session("w")
    quiet = table.acquire(sid, A, deadline=None)  # holds one slot at generation 1
    assert quiet is not None
    for _ in range(5):  # the other slot goes through generations 1..5
        lease = table.acquire(sid, A, deadline=None)
        assert lease is not None and lease.slot != quiet.slot
        table.abandon(lease)
    assert lease.generation == 5
    table.abandon(quiet)
    shared = shared_lease(table, sid, readers=2)
    assert set(shared.slots) == {quiet.slot, lease.slot}
    assert shared.generation == 6  # one generation for both slots, above the busier slot's history
    table.release(sid, shared.lease_id)
    # The quiet slot's words can never have held 6 before, so no old ack can confirm it by accident.
    assert table.confirm_acks({quiet.slot: quiet.generation, lease.slot: 6}) == []
    assert table.confirm_acks(dict.fromkeys(shared.slots, 6)) == [shared]


def test_only_the_owner_session_releases_a_shared_lease() -> None:
    table = make_table()
    owner, peer = table.open_session("rank-0"), table.open_session("rank-1")
    lease = shared_lease(table, owner, readers=2)
    with pytest.raises(LeaseNotOwnedError):
        table.release(peer, lease.lease_id)
    assert table.close_session(peer) == []  # a non-owner rank's session ending frees nothing of it
    assert table.state_of(lease.lease_id) is LeaseState.LEASED


def test_owner_session_close_frees_a_shared_lease_at_once() -> None:
    table = make_table(units=1, slots=2)
    owner = table.open_session("rank-0")
    lease = shared_lease(table, owner, readers=2)
    table.release(owner, lease.lease_id)
    table.confirm_acks({lease.slots[0]: lease.generation})  # rank 1 is still reading when rank 0 dies
    assert table.close_session(owner) == [lease]  # safe only because a TP group dies together
    other = table.open_session("next")
    assert table.acquire(other, A, deadline=None, readers=2) is not None


def test_ttl_frees_a_shared_lease_whose_peer_never_acks() -> None:
    clock = FakeClock()
    table = make_table(slots=4, ttl_s=60.0, clock=clock)
    owner = table.open_session("rank-0")
    lease = shared_lease(table, owner, readers=3)
    table.release(owner, lease.lease_id)
    acked = {lease.slots[0]: lease.generation, lease.slots[1]: lease.generation}  # rank 2 died before its ack
    clock.now += 59
    assert table.confirm_acks(acked) == [] and table.expire() == []
    clock.now += 1
    assert table.expire() == [lease]
    assert table.stats().expired_total == 1 and table.stats().bytes_in_use == 0


def test_readers_need_as_many_free_word_slots() -> None:
    table = make_table(units=8, slots=4)
    sid = table.open_session("w")
    held = shared_lease(table, sid, readers=3)
    assert table.acquire(sid, A, deadline=None, readers=2) is None  # one slot left
    start = time.monotonic()
    assert table.acquire(sid, A, deadline=start + 10, readers=5) is None  # more readers than slots: never fits
    assert time.monotonic() - start < 0.05
    result: list[Lease | None] = []
    waiter = threading.Thread(
        target=lambda: result.append(table.acquire(sid, A, deadline=time.monotonic() + 5, readers=2))
    )
    waiter.start()
    time.sleep(0.05)
    assert waiter.is_alive()
    table.abandon(held)
    waiter.join(timeout=5)
    assert result[0] is not None and result[0].readers == 2


@pytest.mark.parametrize("readers", [0, -1, MAX_READERS + 1, True, 1.0])
def test_readers_out_of_range_is_a_value_error(readers: object) -> None:
    table = make_table(slots=16)
    sid = table.open_session("w")
    with pytest.raises(ValueError):
        table.acquire(sid, A, deadline=None, readers=readers)  # type: ignore[arg-type]
    assert table.acquire(sid, A, deadline=None, readers=MAX_READERS) is not None


class LeaseMachine(RuleBasedStateMachine):
    """Several sessions acquiring (one reader or several), releasing, acking (correctly, stale, or only some
    readers), abandoning, expiring, closing."""

    UNITS = 16
    SLOTS = 6

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.alloc = SliceAllocator(self.UNITS * A, max_slices=32)
        self.table = LeaseTable(self.alloc, num_word_slots=self.SLOTS, ttl_s=60.0, max_sessions=4, clock=self.clock)
        self.sessions: list[str] = []
        self.live: dict[int, Lease] = {}
        self.released: set[int] = set()
        self.ever_issued: dict[int, Lease] = {}

    def _forget(self, freed: list[Lease]) -> None:
        for lease in freed:
            assert self.live.pop(lease.lease_id) == lease
            self.released.discard(lease.lease_id)

    @precondition(lambda self: len(self.sessions) < 4)
    @rule()
    def open_session(self) -> None:
        self.sessions.append(self.table.open_session(f"c{len(self.sessions)}"))

    @precondition(lambda self: self.sessions)
    @rule(data=st.data())
    def close_session(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.sessions))
        self.sessions.remove(sid)
        freed = self.table.close_session(sid)
        assert {lease.lease_id for lease in freed} == {i for i, lease in self.live.items() if lease.session_id == sid}
        self._forget(freed)

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), nbytes=st.integers(1, 5 * A), readers=st.sampled_from([1, 1, 2, 3]))
    def acquire(self, data: st.DataObject, nbytes: int, readers: int) -> None:
        sid = data.draw(st.sampled_from(self.sessions))
        lease = self.table.acquire(sid, nbytes, deadline=None, readers=readers)
        if lease is None:
            used = sum(x.readers for x in self.live.values())
            assert used + readers > self.SLOTS or self.alloc.largest_free < nbytes
            return
        assert lease.readers == readers and len(set(lease.slots)) == readers
        assert lease.lease_id not in self.ever_issued and lease.generation != 0
        # One generation for all its slots, one above the newest any of them ever carried.
        previous = [old.generation for old in self.ever_issued.values() if set(old.slots) & set(lease.slots)]
        assert lease.generation == max(previous, default=0) + 1
        self.live[lease.lease_id] = self.ever_issued[lease.lease_id] = lease

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        assert self.table.release(lease.session_id, lease.lease_id) is (lease.lease_id not in self.released)
        self.released.add(lease.lease_id)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def confirm(self, data: st.DataObject) -> None:
        lease = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        kinds = st.sampled_from(["ack", "ack", "stale", "missing"])
        acks = data.draw(st.lists(kinds, min_size=lease.readers, max_size=lease.readers))
        words = {
            slot: lease.generation - (kind == "stale") for slot, kind in zip(lease.slots, acks) if kind != "missing"
        }
        freed = self.table.confirm_acks(words)
        expect_freed = all(kind == "ack" for kind in acks) and lease.lease_id in self.released
        assert freed == ([lease] if expect_freed else [])
        self._forget(freed)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abandon(self, data: st.DataObject) -> None:
        lease = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        freed = self.table.abandon(lease)
        assert freed is (lease.lease_id not in self.released)
        if freed:
            self._forget([lease])

    @rule(seconds=st.sampled_from([1.0, 20.0, 45.0]))
    def time_passes_and_expire(self, seconds: float) -> None:
        self.clock.now += seconds
        freed = self.table.expire()
        assert {x.lease_id for x in freed} == {i for i, x in self.live.items() if self.clock.now - x.created_at >= 60.0}
        self._forget(freed)

    @invariant()
    def live_leases_are_disjoint_and_accounted(self) -> None:
        assert self.table.live_leases() == [self.live[i] for i in sorted(self.live)]
        spans = sorted((x.offset, x.slice.end) for x in self.live.values())
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
        slots = [slot for x in self.live.values() for slot in x.slots]
        assert len(slots) == len(set(slots)), "a word slot is shared by two live leases"
        assert self.table.pending_ack_slots() == sorted(slot for i in self.released for slot in self.live[i].slots)
        stats = self.table.stats()
        assert stats.bytes_in_use == sum(x.nbytes for x in self.live.values())
        assert (stats.leases_active, stats.leases_awaiting_ack) == (
            len(self.live) - len(self.released),
            len(self.released),
        )
        assert stats.sessions == len(self.sessions)

    def teardown(self) -> None:
        for sid in list(self.sessions):
            self._forget(self.table.close_session(sid))
        assert not self.live and self.table.live_leases() == []
        assert self.alloc.bytes_in_use == 0 and self.alloc.free_ranges() == [(0, self.UNITS * A)]
        sid = self.table.open_session("final")  # every word slot is free again
        assert all(self.table.acquire(sid, 1, deadline=None) is not None for _ in range(self.SLOTS))


LeaseMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestLeasesStateful = LeaseMachine.TestCase
