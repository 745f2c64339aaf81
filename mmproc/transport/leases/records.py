"""The records of the lease table (mmproc/transport/leases/table.py): leases, holds, stats, its errors. Protocol: docs/ipc.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from mmproc.errors import ResourceExhaustedError
from mmproc.transport.leases.allocator import Slice

__all__ = [
    "GENERATION_MAX",
    "MAX_READERS",
    "Hold",
    "Lease",
    "LeaseNotOwnedError",
    "LeaseState",
    "LeaseStats",
    "TooManySessionsError",
    "UnknownLeaseError",
    "UnknownSessionError",
    "next_generation",
]

# Generations fit a signed 64-bit word: the device words are int64 tensors, and 2**63 - 1 acquires of one
# slot will never happen, so wrapping (to 1, never 0) is only there for completeness.
GENERATION_MAX = 2**63 - 1
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
class SessionLeases:
    """One consumer session of the table and the leases it holds."""

    consumer: str
    lease_ids: set[int] = field(default_factory=set)


@dataclass
class LeaseEntry:
    lease: Lease
    state: LeaseState = LeaseState.LEASED
