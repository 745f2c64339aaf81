"""Leases of the CUDA IPC pool: who holds which slice, and when a slice may be written again.

Host-side bookkeeping only (no CUDA here); the device side (the pool, the ready/ack words, the reclaimer
that reads them) lives next to the pool and calls this table.

Concepts
--------
- **Session**: one consumer process (an LLM worker), registered once over a long-lived stream with
  `open_session(consumer)`. Every lease belongs to a session. When the stream ends, `close_session`
  reclaims all the session's leases at once: a consumer that died (even kill -9) took its CUDA context
  and any copy in flight with it, so nothing can still read its slices. Sessions are the primary
  mechanism against leaks; the client library must therefore keep its session stream open for as long
  as it holds any view into the pool, and treat losing it as losing those views.
- **Word slot**: an index into a bounded array of (ready, ack) 64-bit word pairs at the start of the pool.
  The producer's stream writes `ready = generation` after the embeddings are in the slice; the consumer's
  stream waits for it, copies (or uses) the slice, then writes `ack = generation`. `num_word_slots` bounds
  the leases in flight (a lease with N readers takes N slots).
- **Generation**: per slot, grows at every acquire (by one, unless a multi-reader lease lifts it), never 0 (0 means "never written"), at most
  2**63 - 1 so it fits a signed int64 word (torch.int64) without sign games. A stale ack left by an earlier
  use of the slot can never confirm a newer lease.
- **Lease** = slice + word slot(s) + generation, owned by one session.
- **Readers** (tensor-parallel fan-out): a lease may be read by N consumer processes (one per TP rank, each on
  its own GPU, reading the same slice through peer access). It then holds N word slots: the first slot's
  ready word is the one the producer writes and every reader waits on; reader r acks in slot r's ack word.
  All N slots share the lease's generation, which is one above the highest generation any of them ever had,
  so per slot generations still only grow and a stale ack from an earlier use of any slot cannot match.
  The lease is freed only when *every* reader's ack word holds the generation. Only the owner session (rank
  0's, the one that sent the request) releases it; the other ranks have sessions of their own (pool identity,
  handle cache) but own nothing, so nothing they send can free another session's slice.

State machine of a lease::

    acquire(readers=N) ─▶ LEASED ── release (owner's host: "my copy and ack are enqueued") ─▶ RELEASED
                            │                                                                 │
                            ├─ abandon (producer: the descriptor never reached a consumer) ─▶ freed
                            │                  confirm_acks: ALL N ack words == generation ───┤
                            └───── close_session(owner) / expire (TTL) ─▶ freed ◀─────────────┘
                                                   (slice and N slots reusable; waiters woken)

With N readers, RELEASED means "the owner is done"; the other readers may not even have started. The device
acks are the proof for every reader: N-1 matching acks and one stale or missing keep the slice. What happens
when a reader dies:
- a non-owner rank dies: its ack never lands, and nobody may vouch for it: its lease-less session tells the
  server nothing about this lease, and rank 0 cannot tell a dead peer from a slow one (a host-side "done" is
  not proof of a finished copy). So the slice stays held until the TTL frees it; rank 0 must not free early.
- the owner (rank 0) dies: its session ends and `close_session` frees the lease at once, even though other
  ranks may still be reading. That is only safe because a tensor-parallel group lives and dies together
  (one rank gone and the engine tears the group down); a deployment whose ranks outlive rank 0 must not
  share leases.

`release` is NOT proof that the copy finished: the consumer's host runs ahead of its stream. A slice is
reused only after the *device-side* ack (written by the consumer's stream after its copy) is observed
equal to the lease's generation. Freeing on the host-side ack is the bug SGLang shipped (the next image
overwrote a slice while the previous copy was still reading it). `release` still matters: it tells the
reclaimer which few ack words to read (`pending_ack_slots`), so one small device read covers them.

TTL backstop: `expire` force-frees leases older than `ttl_s` in any state, with a warning naming the
session and lease. The risk: a consumer that holds a view longer than the TTL (or whose ack never lands)
may read data overwritten by a later image. That is why the TTL is long (60 s by default, far above any
request) and only a backstop behind sessions and acks. The reclaimer calls `confirm_acks` and `expire`
periodically; this table starts no thread of its own.

Shared slices (the embedding cache, service/cache/embedding_cache.py): a slice is reference-counted. Every live lease
on it is one reference, and so is every `Hold` (a reference that outlives the lease it was taken from, owned by
the cache). `share(session, hold)` lends a slice already held to another session as a new lease: new word
slots and generation, no bytes allocated or copied; the producer writes its ready word at once (the data is in
place). A slice goes back to the allocator only when its last lease is freed (ack, session end, TTL, abandon)
and its last hold is dropped, so evicting a cache entry never frees a slice a consumer still reads. Before an
`acquire` waits for space it asks the pressure relief (`set_pressure_relief`, the cache) to drop holds nobody
leases; the cache never allocates, so it never grows the pool.

Waiting: `acquire` waits on a condition until a slice and enough word slots are free or its deadline passes,
then returns None and the caller chooses (serialized fallback or `ResourceExhaustedError`). It never waits
without a deadline; no deadline means "try once".

Thread-safe: one lock and one condition guard all state, including the `SliceAllocator`, which is not
thread-safe by itself. Everything is bounded: sessions, leases per session (optional), word slots, slices.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from mmproc.errors import ResourceExhaustedError
from mmproc.transport.allocator import Slice, SliceAllocator

__all__ = [
    "GENERATION_MAX",
    "MAX_READERS",
    "Hold",
    "Lease",
    "LeaseNotOwnedError",
    "LeaseState",
    "LeaseStats",
    "LeaseTable",
    "TooManySessionsError",
    "UnknownLeaseError",
    "UnknownSessionError",
    "next_generation",
]

logger = logging.getLogger(__name__)

# Generations fit a signed 64-bit word: the device words are int64 tensors, and 2**63 - 1 acquires of one
# slot will never happen, so wrapping (to 1, never 0) is only there for completeness.
GENERATION_MAX = 2**63 - 1
_WORD_MASK = 2**64 - 1
# Readers of one lease: a tensor-parallel group on one node (8 GPUs), each rank one reader.
MAX_READERS = 8


def next_generation(generation: int) -> int:
    """The generation after `generation`: 1, 2, ..., GENERATION_MAX, 1, ... (never 0 = "never written")."""
    return generation + 1 if generation < GENERATION_MAX else 1


class UnknownSessionError(KeyError):
    """The session id was never opened or is closed (the consumer disconnected, or the server restarted).
    The consumer should open a new session."""

    def __str__(self) -> str:  # KeyError's str() is the repr of its argument; keep the message readable
        return str(self.args[0]) if self.args else "unknown session"


class UnknownLeaseError(KeyError):
    """The lease id was never issued by this table."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown lease"


class LeaseNotOwnedError(PermissionError):
    """A session tried to release a lease that belongs to another session."""


class TooManySessionsError(ResourceExhaustedError):
    """`max_sessions` consumer sessions are already open (HTTP 429 / RESOURCE_EXHAUSTED)."""


class LeaseState(str, Enum):
    LEASED = "leased"  # the producer writes the slice, the consumer reads it
    RELEASED = "released"  # the consumer's host enqueued its copy and ack; waiting for the device ack


@dataclass(frozen=True)
class Lease:
    """One slice of the pool lent to a session. Immutable: the state lives in the table (`state_of`)."""

    lease_id: int
    session_id: str
    slice: Slice
    slots: tuple[int, ...]  # one (ready, ack) word pair per reader; slots[0]'s ready word is the lease's
    generation: int  # the value the ready and every reader's ack word must hold for this lease
    created_at: float  # in the table's clock, for the TTL

    @property
    def slot(self) -> int:
        """The word slot whose ready word the producer writes (and reader 0 acks in)."""
        return self.slots[0]

    @property
    def readers(self) -> int:
        return len(self.slots)

    @property
    def offset(self) -> int:
        return self.slice.offset

    @property
    def nbytes(self) -> int:
        return self.slice.nbytes


@dataclass(frozen=True)
class Hold:
    """A reference on a leased slice that outlives the lease (an embedding cache entry's): the slice stays
    allocated until every hold on it is dropped and every lease on it is freed."""

    hold_id: int
    slice: Slice


@dataclass(frozen=True)
class LeaseStats:
    """A consistent snapshot for metrics. `leases_active` counts LEASED leases, `leases_awaiting_ack` the
    RELEASED ones; `reclaimed_total` counts leases freed by `close_session`, `expired_total` by the TTL,
    `waits_timed_out_total` the acquires that gave up (deadline passed, or a no-wait try found no room)."""

    bytes_in_use: int
    leases_active: int
    leases_awaiting_ack: int
    sessions: int
    reclaimed_total: int
    expired_total: int
    waits_timed_out_total: int


@dataclass
class _Session:
    consumer: str
    lease_ids: set[int] = field(default_factory=set)


@dataclass
class _Entry:
    lease: Lease
    state: LeaseState = LeaseState.LEASED


class LeaseTable:
    """Leases of one pool: sessions, word slots, generations, and the slice allocator, under one lock.

    `deadline`s and the TTL are in `clock`'s time base (`time.monotonic` by default); waiting needs a clock
    that advances with real time, an injected fake clock is for TTL tests with `deadline=None`.
    """

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
        self._sessions: dict[str, _Session] = {}
        self._leases: dict[int, _Entry] = {}
        self._slot_lease: dict[int, int] = {}  # slot -> id of the live lease holding it
        # FIFO reuse: the slot freed longest ago goes first, so a slot rests as long as possible.
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
        """Register a consumer process; returns its session id (random, so another consumer cannot guess it
        and release its leases). Raises TooManySessionsError when `max_sessions` are open."""
        with self._cond:
            if len(self._sessions) >= self._max_sessions:
                raise TooManySessionsError(f"{self._max_sessions} consumer sessions are open; cannot add {consumer!r}")
            session_id = secrets.token_hex(8)
            while session_id in self._sessions:  # pragma: no cover - 64 random bits
                session_id = secrets.token_hex(8)
            self._sessions[session_id] = _Session(consumer=consumer)
        logger.info("ipc session %s opened for consumer %r", session_id, consumer)
        return session_id

    def close_session(self, session_id: str) -> list[Lease]:
        """End a session (its stream disconnected) and free every lease it holds, in any state, at once.

        Safe because the stream ends when the consumer process does, and a dead process's CUDA context and
        copies die with it. Wakes waiters. Raises UnknownSessionError for an unknown or closed session.
        """
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
        """Lease `nbytes` of the pool to `session_id` for `readers` consumers, waiting until `deadline` (in
        `clock`'s time base) for a slice and `readers` word slots; None when none came free in time.
        `deadline=None` tries once, no wait.

        A request larger than the whole pool, or with more readers than word slots, can never fit and returns
        None at once. Raises UnknownSessionError if the session is unknown or closes while this call waits
        (its consumer is gone, so the embeddings have nowhere to go), ValueError for a non-positive size, a
        non-finite deadline or `readers` outside 1..MAX_READERS (the service validates it first).
        """
        size = self._allocator.aligned_size(nbytes)  # validates nbytes
        if deadline is not None and not math.isfinite(deadline):
            raise ValueError(f"deadline must be finite (waiting is always bounded), got {deadline}")
        if isinstance(readers, bool) or not isinstance(readers, int) or not 1 <= readers <= MAX_READERS:
            raise ValueError(f"readers must be in 1..{MAX_READERS}, got {readers!r}")
        return self._acquire(
            session_id, deadline, readers, size, lambda s: self._try_acquire_locked(session_id, s, nbytes, readers)
        )

    def share(self, session_id: str, hold: Hold, *, deadline: float | None, readers: int = 1) -> Lease | None:
        """Lend the slice `hold` keeps to `session_id` as a new lease (its own word slots and generation, the same
        bytes: no allocation, no copy), waiting until `deadline` for word slots. None when the hold was dropped
        meanwhile (the caller encodes again) or no slots came free in time. The producer must still write the
        new lease's ready word (the data is already in place)."""
        if isinstance(readers, bool) or not isinstance(readers, int) or not 1 <= readers <= MAX_READERS:
            raise ValueError(f"readers must be in 1..{MAX_READERS}, got {readers!r}")

        def attempt(session: _Session) -> Lease | None:
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
        attempt: Callable[[_Session], Lease | None],
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
        """The producer gives back a lease whose descriptor never reached a consumer (the request failed or
        was cancelled after allocation): freed at once. True if freed.

        False, and nothing changes, if the lease is already gone (freed by close_session or expire, which
        may race with the producer's error path) or already RELEASED: then the consumer did get it and may
        have a copy in flight, so only its ack (or the TTL) may free it.
        """
        with self._cond:
            entry = self._leases.get(lease.lease_id)
            if entry is None or entry.lease != lease or entry.state is not LeaseState.LEASED:
                return False
            self._free_locked(entry)
        logger.debug("ipc lease %d of session %s abandoned by the producer", lease.lease_id, lease.session_id)
        return True

    # -- shared slices (the embedding cache) ---------------------------------------------------------------

    def set_pressure_relief(self, relieve: Callable[[int], bool] | None) -> None:
        """`relieve(nbytes)` is called (without this table's lock) before an `acquire` of `nbytes` waits: it may
        drop holds (`drop_hold`) and returns True if it dropped any."""
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
        """Whether a live lease still references the held slice (dropping the hold would then free nothing)."""
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
        """The consumer's host says its copy and ack write are enqueued: LEASED -> RELEASED (for a lease with
        several readers: the owner's own copy and ack; the others' device acks still gate the free). True on that
        transition; False if the lease was already released, or already freed (acked, expired, abandoned:
        lease ids are never reused, so a repeated release is harmless).

        Raises UnknownSessionError for an unknown session, UnknownLeaseError for an id this table never
        issued, LeaseNotOwnedError for a live lease of another session.
        """
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
        """Word slots (every reader's) of RELEASED leases, ascending: the ack words the reclaimer reads (one
        small D2H)."""
        with self._cond:
            released = (e.lease for e in self._leases.values() if e.state is LeaseState.RELEASED)
            return sorted(slot for lease in released for slot in lease.slots)

    def confirm_acks(self, observed: Mapping[int, int]) -> list[Lease]:
        """Free each RELEASED lease whose readers' observed ack words ALL equal its generation; wake waiters.

        `observed` maps slot -> ack word as read from the device (read as int64 or uint64: compared modulo
        2**64). A word from an earlier use of the slot (stale generation), of a slot now LEASED, or of a
        slot with no live lease changes nothing; nor does a lease some of whose readers' words are stale or
        missing from `observed`. Returns the freed leases, by lease id.
        """
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
        """TTL backstop: force-free every lease older than `ttl_s`, in any state, with a warning each.

        Risky by nature (a consumer still reading may see data overwritten by a later image), hence the long
        TTL; sessions and acks free leases long before it in normal operation.
        """
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
        """The lease's state, or None once it is freed (or was never issued)."""
        with self._cond:
            entry = self._leases.get(lease_id)
            return None if entry is None else entry.state

    def live_leases(self) -> list[Lease]:
        """Every live lease (LEASED or RELEASED), by lease id. For tests and debugging."""
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

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(f"unknown or closed ipc session {session_id!r}")
        return session

    def _try_acquire_locked(
        self, session_id: str, session: _Session, nbytes: int, readers: int, shared: Slice | None = None
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
        # One generation for all the lease's slots, above each one's history: per slot it still only grows.
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
        self._leases[lease.lease_id] = _Entry(lease)
        for slot in slots:
            self._slot_lease[slot] = lease.lease_id
        session.lease_ids.add(lease.lease_id)
        return lease

    def _free_locked(self, entry: _Entry) -> Lease:
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
