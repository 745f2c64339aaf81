"""Leases of the CUDA IPC pool, host-side bookkeeping only (no CUDA). The protocol: docs/ipc.md."""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

from mmproc.transport.leases.allocator import Slice, SliceAllocator
from mmproc.transport.leases.records import (
    MAX_READERS,
    Hold,
    Lease,
    LeaseEntry,
    LeaseNotOwnedError,
    LeaseState,
    LeaseStats,
    SessionLeases,
    TooManySessionsError,
    UnknownLeaseError,
    UnknownSessionError,
    next_generation,
)

logger = logging.getLogger(__name__)

_WORD_MASK = 2**64 - 1


class LeaseTable:
    """Leases of one pool under one lock. Deadlines and the TTL are in `clock`'s time base."""

    def __init__(
        self,
        allocator: SliceAllocator,
        *,
        num_word_slots: int,
        ttl_s: float = 60.0,
        max_sessions: int = 1024,
        max_leases_per_session: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if num_word_slots <= 0:
            raise ValueError(f"num_word_slots must be positive, got {num_word_slots}")
        if not ttl_s > 0 or not math.isfinite(ttl_s):
            raise ValueError(f"ttl_s must be a positive finite number of seconds, got {ttl_s}")
        if max_sessions <= 0:
            raise ValueError(f"max_sessions must be positive, got {max_sessions}")
        if max_leases_per_session is not None and max_leases_per_session <= 0:
            raise ValueError(f"max_leases_per_session must be positive or None, got {max_leases_per_session}")
        self._allocator = allocator
        self._num_word_slots = num_word_slots
        self._ttl_s = float(ttl_s)
        self._max_sessions = max_sessions
        self._max_leases_per_session = max_leases_per_session
        self._clock = clock

        self._cond = threading.Condition(threading.Lock())
        self._sessions: dict[str, SessionLeases] = {}
        self._leases: dict[int, LeaseEntry] = {}
        self._slot_lease: dict[int, int] = {}  # slot -> id of the live lease holding it
        # FIFO reuse: a freed slot rests as long as possible
        self._free_slots: deque[int] = deque(range(num_word_slots))
        self._generations = [0] * num_word_slots  # last generation handed out per slot; 0 = never used
        self._next_lease_id = 1
        # Shared slices: offset -> references (live leases + holds) and -> holds alone; a slice is freed at 0.
        self._slice_refs: dict[int, int] = {}
        self._slice_holds: dict[int, int] = {}
        self._holds: dict[int, Hold] = {}
        self._next_hold_id = 1
        self._relieve: Callable[[int], bool] | None = None
        self._reclaimed_total = 0
        self._expired_total = 0
        self._waits_timed_out_total = 0

    @property
    def num_word_slots(self) -> int:
        return self._num_word_slots

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    # -- sessions ------------------------------------------------------------------------------------------

    def open_session(self, consumer: str) -> str:
        """Register a consumer; the id is random so no other consumer can release its leases."""
        with self._cond:
            if len(self._sessions) >= self._max_sessions:
                raise TooManySessionsError(f"{self._max_sessions} consumer sessions are open; cannot add {consumer!r}")
            session_id = secrets.token_hex(8)
            while session_id in self._sessions:  # pragma: no cover - 64 random bits
                session_id = secrets.token_hex(8)
            self._sessions[session_id] = SessionLeases(consumer=consumer)
        logger.info("ipc session %s opened for consumer %r", session_id, consumer)
        return session_id

    def close_session(self, session_id: str) -> list[Lease]:
        """Free all the session's leases, in any state; UnknownSessionError if unknown or closed."""
        with self._cond:
            session = self._session(session_id)
            freed = [self._free_locked(self._leases[lease_id]) for lease_id in sorted(session.lease_ids)]
            del self._sessions[session_id]
            self._reclaimed_total += len(freed)
        if freed:
            logger.info(
                "ipc session %s (%r) closed; reclaimed %d leases (%d bytes)",
                session_id,
                session.consumer,
                len(freed),
                sum(lease.nbytes for lease in freed),
            )
        else:
            logger.info("ipc session %s (%r) closed", session_id, session.consumer)
        return freed

    # -- producer side -------------------------------------------------------------------------------------

    def acquire(self, session_id: str, nbytes: int, *, deadline: float | None, readers: int = 1) -> Lease | None:
        """Lease `nbytes` for `readers` consumers, waiting until `deadline` (None: try once); None if nothing came
        free. UnknownSessionError if the session is unknown or closes meanwhile."""
        size = self._allocator.aligned_size(nbytes)  # validates nbytes
        if deadline is not None and not math.isfinite(deadline):
            raise ValueError(f"deadline must be finite (waiting is always bounded), got {deadline}")
        if isinstance(readers, bool) or not isinstance(readers, int) or not 1 <= readers <= MAX_READERS:
            raise ValueError(f"readers must be in 1..{MAX_READERS}, got {readers!r}")
        return self._acquire(
            session_id, deadline, readers, size, lambda s: self._try_acquire_locked(session_id, s, nbytes, readers)
        )

    def share(self, session_id: str, hold: Hold, *, deadline: float | None, readers: int = 1) -> Lease | None:
        """Lend the held slice as a new lease (new slots and generation, no copy); None if the hold was dropped
        or no slots came free. The producer still writes the new ready word."""
        if isinstance(readers, bool) or not isinstance(readers, int) or not 1 <= readers <= MAX_READERS:
            raise ValueError(f"readers must be in 1..{MAX_READERS}, got {readers!r}")

        def attempt(session: SessionLeases) -> Lease | None:
            if self._holds.get(hold.hold_id) != hold:
                return None
            return self._try_acquire_locked(session_id, session, hold.slice.nbytes, readers, shared=hold.slice)

        return self._acquire(session_id, deadline, readers, 0, attempt, relieve=False)

    def _acquire(
        self,
        session_id: str,
        deadline: float | None,
        readers: int,
        size: int,
        attempt: Callable[[SessionLeases], Lease | None],
        *,
        relieve: bool = True,
    ) -> Lease | None:
        relieved = not relieve or self._relieve is None
        with self._cond:
            while True:
                session = self._session(session_id)
                lease = attempt(session)
                if lease is not None:
                    return lease
                if not relieved and size and len(self._free_slots) >= readers:
                    relieved = True  # once per wake-up: the cache drops unleased holds before this request waits
                    self._cond.release()
                    try:
                        freed = self._relieve(size)
                    finally:
                        self._cond.acquire()
                    if freed:
                        continue
                remaining = 0.0 if deadline is None else deadline - self._clock()
                if remaining <= 0 or size > self._allocator.capacity or readers > self._num_word_slots:
                    self._waits_timed_out_total += 1
                    return None
                self._cond.wait(remaining)
                relieved = not relieve or self._relieve is None

    def abandon(self, lease: Lease) -> bool:
        """Free a lease whose descriptor never reached a consumer; False if gone or RELEASED (the consumer
        may be copying: only its ack or the TTL frees it)."""
        with self._cond:
            entry = self._leases.get(lease.lease_id)
            if entry is None or entry.lease != lease or entry.state is not LeaseState.LEASED:
                return False
            self._free_locked(entry)
        logger.debug("ipc lease %d of session %s abandoned by the producer", lease.lease_id, lease.session_id)
        return True

    # -- shared slices (the embedding cache) ---------------------------------------------------------------

    def set_pressure_relief(self, relieve: Callable[[int], bool] | None) -> None:
        """`relieve(nbytes)` runs (unlocked) before an `acquire` waits; True if it dropped any holds."""
        self._relieve = relieve

    def hold(self, lease: Lease) -> Hold | None:
        """A reference on `lease`'s slice that outlives the lease; None if the lease is no longer live."""
        with self._cond:
            entry = self._leases.get(lease.lease_id)
            if entry is None or entry.lease != lease:
                return None
            hold = Hold(self._next_hold_id, lease.slice)
            self._next_hold_id += 1
            self._holds[hold.hold_id] = hold
            self._slice_refs[lease.offset] += 1
            self._slice_holds[lease.offset] = self._slice_holds.get(lease.offset, 0) + 1
            return hold

    def drop_hold(self, hold: Hold) -> bool:
        """Drop a hold; the slice is freed when nothing else references it. True if the hold was live."""
        with self._cond:
            if self._holds.pop(hold.hold_id, None) is None:
                return False
            offset = hold.slice.offset
            self._slice_holds[offset] -= 1
            if not self._slice_holds[offset]:
                del self._slice_holds[offset]
            self._unref_locked(hold.slice)
            return True

    def leased(self, hold: Hold) -> bool:
        """Whether a live lease still references the held slice."""
        with self._cond:
            offset = hold.slice.offset
            return self._slice_refs.get(offset, 0) > self._slice_holds.get(offset, 0)

    def fits(self, nbytes: int) -> bool:
        """Whether an `acquire` of `nbytes` would find a slice now (word slots aside)."""
        size = self._allocator.aligned_size(nbytes)
        with self._cond:
            allocator = self._allocator
            return allocator.largest_free >= size and allocator.num_slices < allocator.max_slices

    # -- consumer side -------------------------------------------------------------------------------------

    def release(self, session_id: str, lease_id: int) -> bool:
        """LEASED -> RELEASED (the owner enqueued its copy and ack); False if already done (ids are never reused).
        Raises UnknownSessionError, UnknownLeaseError or LeaseNotOwnedError."""
        with self._cond:
            self._session(session_id)
            entry = self._leases.get(lease_id)
            if entry is None:
                if not 0 < lease_id < self._next_lease_id:
                    raise UnknownLeaseError(f"lease {lease_id} was never issued")
                return False
            if entry.lease.session_id != session_id:
                raise LeaseNotOwnedError(f"lease {lease_id} does not belong to session {session_id}")
            if entry.state is LeaseState.RELEASED:
                return False
            entry.state = LeaseState.RELEASED
            return True

    # -- reclaimer -----------------------------------------------------------------------------------------

    def pending_ack_slots(self) -> list[int]:
        """Every reader's word slot of the RELEASED leases, ascending: the ack words the reclaimer reads."""
        with self._cond:
            released = (e.lease for e in self._leases.values() if e.state is LeaseState.RELEASED)
            return sorted(slot for lease in released for slot in lease.slots)

    def confirm_acks(self, observed: Mapping[int, int]) -> list[Lease]:
        """Free each RELEASED lease whose readers' ack words (slot -> word, mod 2**64) all equal its generation."""
        freed: list[Lease] = []
        with self._cond:
            lease_ids = {self._slot_lease[slot] for slot in observed if slot in self._slot_lease}
            for lease_id in sorted(lease_ids):
                entry = self._leases[lease_id]
                lease = entry.lease
                if entry.state is LeaseState.RELEASED and all(
                    slot in observed and observed[slot] & _WORD_MASK == lease.generation for slot in lease.slots
                ):
                    freed.append(self._free_locked(entry))
        return freed

    def expire(self, now: float | None = None) -> list[Lease]:
        """TTL backstop: force-free every lease older than `ttl_s`, in any state, with a warning each."""
        with self._cond:
            now = self._clock() if now is None else now
            old = [e for e in self._leases.values() if now - e.lease.created_at >= self._ttl_s]
            freed = [(self._free_locked(e), e.state) for e in old]
            self._expired_total += len(freed)
        for lease, state in freed:
            logger.warning(
                "ipc lease %d of session %s expired after %.0f s in state %s (slot %d, %d bytes): force-freed; "
                "a consumer still reading it may see overwritten data",
                lease.lease_id,
                lease.session_id,
                now - lease.created_at,
                state.value,
                lease.slot,
                lease.nbytes,
            )
        return [lease for lease, _ in freed]

    # -- introspection -------------------------------------------------------------------------------------

    def state_of(self, lease_id: int) -> LeaseState | None:
        """None once freed or never issued."""
        with self._cond:
            entry = self._leases.get(lease_id)
            return None if entry is None else entry.state

    def live_leases(self) -> list[Lease]:
        """Every live lease (LEASED or RELEASED), by lease id."""
        with self._cond:
            return [self._leases[i].lease for i in sorted(self._leases)]

    def stats(self) -> LeaseStats:
        with self._cond:
            awaiting = sum(1 for e in self._leases.values() if e.state is LeaseState.RELEASED)
            return LeaseStats(
                bytes_in_use=self._allocator.bytes_in_use,
                leases_active=len(self._leases) - awaiting,
                leases_awaiting_ack=awaiting,
                sessions=len(self._sessions),
                reclaimed_total=self._reclaimed_total,
                expired_total=self._expired_total,
                waits_timed_out_total=self._waits_timed_out_total,
            )

    # -- internals (call with the lock held) ---------------------------------------------------------------

    def _session(self, session_id: str) -> SessionLeases:
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(f"unknown or closed ipc session {session_id!r}")
        return session

    def _try_acquire_locked(
        self, session_id: str, session: SessionLeases, nbytes: int, readers: int, shared: Slice | None = None
    ) -> Lease | None:
        if self._max_leases_per_session is not None and len(session.lease_ids) >= self._max_leases_per_session:
            return None
        if len(self._free_slots) < readers:
            return None
        if shared is not None:
            s = shared
            self._slice_refs[s.offset] += 1
        else:
            s = self._allocator.allocate(nbytes)
            if s is None:
                return None
            self._slice_refs[s.offset] = 1
        slots = tuple(self._free_slots.popleft() for _ in range(readers))
        # one generation above every slot's history: per slot it only grows
        generation = next_generation(max(self._generations[slot] for slot in slots))
        for slot in slots:
            self._generations[slot] = generation
        lease = Lease(
            lease_id=self._next_lease_id,
            session_id=session_id,
            slice=s,
            slots=slots,
            generation=generation,
            created_at=self._clock(),
        )
        self._next_lease_id += 1
        self._leases[lease.lease_id] = LeaseEntry(lease)
        for slot in slots:
            self._slot_lease[slot] = lease.lease_id
        session.lease_ids.add(lease.lease_id)
        return lease

    def _free_locked(self, entry: LeaseEntry) -> Lease:
        lease = entry.lease
        self._unref_locked(lease.slice)
        del self._leases[lease.lease_id]
        for slot in lease.slots:
            del self._slot_lease[slot]
            self._free_slots.append(slot)
        session = self._sessions.get(lease.session_id)
        if session is not None:
            session.lease_ids.discard(lease.lease_id)
        self._cond.notify_all()
        return lease

    def _unref_locked(self, s: Slice) -> None:
        self._slice_refs[s.offset] -= 1
        if not self._slice_refs[s.offset]:
            del self._slice_refs[s.offset]
            self._allocator.free(s)
            self._cond.notify_all()
