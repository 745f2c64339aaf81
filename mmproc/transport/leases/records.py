"""The lease table's records and errors (docs/ipc.md)."""

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

GENERATION_MAX = 2**63 - 1  # the device words are int64
MAX_READERS = 8  # a tensor-parallel group on one node


def next_generation(generation: int) -> int:
    """The generation after `generation`: 1, 2, ..., GENERATION_MAX, 1, ... (never 0 = "never written")."""
    return generation + 1 if generation < GENERATION_MAX else 1


class UnknownSessionError(KeyError):
    """The session was never opened or is closed; the consumer opens a new one."""

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
    """One slice lent to a session; its state lives in the table."""

    lease_id: int
    session_id: str
    slice: Slice
    slots: tuple[int, ...]  # one (ready, ack) word pair per reader; slots[0]'s ready word is the lease's
    generation: int  # the value the ready and every reader's ack word must hold for this lease
    created_at: float  # in the table's clock, for the TTL

    @property
    def slot(self) -> int:
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
    """A reference on a slice that outlives its lease (a cache entry's)."""

    hold_id: int
    slice: Slice


@dataclass(frozen=True)
class LeaseStats:
    """A consistent snapshot for metrics (active = LEASED, awaiting_ack = RELEASED)."""

    bytes_in_use: int
    leases_active: int
    leases_awaiting_ack: int
    sessions: int
    reclaimed_total: int
    expired_total: int
    waits_timed_out_total: int


@dataclass
class SessionLeases:
    consumer: str
    lease_ids: set[int] = field(default_factory=set)


@dataclass
class LeaseEntry:
    lease: Lease
    state: LeaseState = LeaseState.LEASED
