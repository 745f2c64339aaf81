"""One CUDA IPC pool, exported once, handed out in leases: (ready, ack) int64 word slots, then the data slices
(the hand-off: docs/ipc.md)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

import torch

from mmproc.transport.cuda_ipc import runtime as cuda_ipc
from mmproc.transport.cuda_ipc.config import WORD_BYTES, PoolConfig
from mmproc.transport.leases.allocator import SliceAllocator
from mmproc.transport.leases.records import Lease, LeaseStats
from mmproc.transport.leases.table import LeaseTable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolIdentity:
    """What a consumer needs to open the pool once (the gRPC layer copies it into PoolInfo)."""

    pool_id: str
    epoch: int
    device_uuid: str
    ipc_handle: bytes
    pool_bytes: int
    num_word_slots: int
    data_offset: int


@dataclass(frozen=True)
class SliceDescriptor:
    """Where one image's embedding lies in the pool (absolute byte offsets)."""

    lease_id: int
    generation: int
    offset: int
    nbytes: int
    ready_offset: int
    ack_offsets: tuple[int, ...]  # reader r writes its ack at ack_offsets[r]; reader 0 is the owner

    @property
    def ack_offset(self) -> int:
        """The owner's (reader 0's) ack word."""
        return self.ack_offsets[0]

    @property
    def readers(self) -> int:
        return len(self.ack_offsets)


class IpcPool:
    """Owns the pool memory on `device`, its lease table and the reclaimer thread."""

    def __init__(self, device: torch.device, config: PoolConfig) -> None:
        if device.type != "cuda":
            raise ValueError("the IPC pool lives on a CUDA device")
        self.device = device
        self.config = config
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._index = index
        self._ptr, handle = cuda_ipc.malloc_exportable(config.pool_bytes, index)
        self.memory = cuda_ipc.wrap(self._ptr, config.pool_bytes, index, owner=self)  # (pool_bytes,) uint8
        self.words = self.memory[: config.words_bytes].view(torch.int64)[: 2 * config.num_word_slots].view(-1, 2)
        self.words.zero_()
        torch.cuda.synchronize(device)
        self.identity = PoolIdentity(
            pool_id=uuid.uuid4().hex,
            epoch=time.time_ns(),
            device_uuid=cuda_ipc.device_uuid(index),
            ipc_handle=handle,
            pool_bytes=config.pool_bytes,
            num_word_slots=config.num_word_slots,
            data_offset=config.words_bytes,
        )
        allocator = SliceAllocator(config.pool_bytes - config.words_bytes, alignment=config.alignment)
        self.leases = LeaseTable(
            allocator, num_word_slots=config.num_word_slots, ttl_s=config.ttl_s, max_sessions=config.max_sessions
        )
        self._ack_host = torch.empty(config.num_word_slots, dtype=torch.int64, pin_memory=True)
        self._reader = torch.cuda.Stream(device)
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._reclaim_loop, name="mmproc-ipc-reclaim", daemon=True)
        self._thread.start()
        logger.info(
            "IPC pool %s: %d MiB on %s (%s), %d word slots",
            self.identity.pool_id,
            config.pool_bytes >> 20,
            device,
            self.identity.device_uuid,
            config.num_word_slots,
        )

    def destination(self, lease: Lease, rows: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
        """The lease's slice as a contiguous (rows, hidden) tensor of `dtype` (zero copy)."""
        nbytes = rows * hidden * torch.empty((), dtype=dtype).element_size()
        if nbytes > lease.nbytes:
            raise ValueError(f"lease {lease.lease_id} holds {lease.nbytes} bytes, {nbytes} needed")
        start = self.identity.data_offset + lease.offset
        return self.memory[start : start + nbytes].view(dtype).view(rows, hidden)

    def mark_ready(self, lease: Lease) -> None:
        """Enqueue ready[slot] = generation on the current stream, after the writes already enqueued."""
        self.words[lease.slot, 0].fill_(lease.generation)

    def descriptor(self, lease: Lease, row_start: int, rows: int, row_bytes: int) -> SliceDescriptor:
        return SliceDescriptor(
            lease_id=lease.lease_id,
            generation=lease.generation,
            offset=self.identity.data_offset + lease.offset + row_start * row_bytes,
            nbytes=rows * row_bytes,
            ready_offset=lease.slot * 2 * WORD_BYTES,
            ack_offsets=tuple(slot * 2 * WORD_BYTES + WORD_BYTES for slot in lease.slots),
        )

    def notify_released(self) -> None:
        """A consumer said it released leases: read the ack words soon."""
        self._wake.set()

    def stats(self) -> LeaseStats:
        return self.leases.stats()

    def reclaim_once(self) -> int:
        """Read the ack words of released leases and free those whose ack matches; expire past the TTL."""
        freed = 0
        pending = self.leases.pending_ack_slots()
        if pending:
            with torch.cuda.stream(self._reader):  # a side stream: never waits for the encoder's work
                self._ack_host.copy_(self.words[:, 1], non_blocking=True)
            self._reader.synchronize()
            acks = self._ack_host.tolist()
            freed += len(self.leases.confirm_acks({slot: acks[slot] for slot in pending}))
        freed += len(self.leases.expire())
        return freed

    def _reclaim_loop(self) -> None:
        last_expire = time.monotonic()
        while not self._stopping:
            pending = bool(self.leases.pending_ack_slots())
            self._wake.wait(self.config.reclaim_interval_s if pending else 1.0)
            self._wake.clear()
            try:
                if pending or self.leases.pending_ack_slots() or time.monotonic() - last_expire > 1.0:
                    self.reclaim_once()
                    last_expire = time.monotonic()
            except Exception:  # never let the reclaimer die silently; the TTL still bounds leaks
                logger.exception("IPC reclaimer failed; retrying")
                time.sleep(0.1)

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(5)
        torch.cuda.synchronize(self.device)
        del self.words, self.memory
        cuda_ipc.free(self._ptr, self._index)
