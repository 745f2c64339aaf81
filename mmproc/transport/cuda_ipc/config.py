"""The IPC pool's settings, torch-free so that the server's settings take their defaults from here."""

from __future__ import annotations

from dataclasses import dataclass

WORD_BYTES = 8
_PAGE = 4096


@dataclass(frozen=True)
class PoolConfig:
    pool_bytes: int = 512 << 20
    num_word_slots: int = 1024  # bound on leases in flight
    alignment: int = 256
    ttl_s: float = 60.0
    max_sessions: int = 1024
    reclaim_interval_s: float = 0.0005  # how often pending acks are read while any are pending

    def __post_init__(self) -> None:
        if self.pool_bytes < self.words_bytes + self.alignment:
            raise ValueError(f"ipc pool of {self.pool_bytes} bytes is too small for {self.num_word_slots} word slots")

    @property
    def words_bytes(self) -> int:
        raw = self.num_word_slots * 2 * WORD_BYTES
        return (raw + _PAGE - 1) // _PAGE * _PAGE
