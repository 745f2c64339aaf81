"""The consumer side of the CUDA IPC transport: the handle cache and stream-ordered read/ack (docs/ipc.md)."""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field

import torch

from mmproc.errors import DeadlineExceededError, InternalError
from mmproc.transport.cuda_ipc import runtime as cuda_ipc
from mmproc.transport.cuda_ipc.pool import WORD_BYTES, PoolIdentity, SliceDescriptor

logger = logging.getLogger(__name__)


@dataclass
class HandleCacheStats:
    opens: int = 0
    closes: int = 0
    open_failures: int = 0


class TypedViews:
    """Views at byte offsets of a flat uint8 tensor, one `as_strided` each (host time per torch op counts)."""

    def __init__(self, memory: torch.Tensor) -> None:
        self._memory = memory
        self._typed: dict[torch.dtype, torch.Tensor] = {}

    def view(self, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        typed = self._typed.get(dtype)
        if typed is None:
            typed = self._typed.setdefault(dtype, self._memory.view(dtype))
        itemsize = typed.element_size()
        strides, numel = [], 1
        for dim in reversed(shape):
            strides.append(numel)
            numel *= dim
        if offset % itemsize or numel * itemsize != nbytes or offset < 0:
            raise InternalError(f"descriptor at byte {offset} ({nbytes} bytes) does not hold {shape} x {dtype}")
        return typed.as_strided(shape, strides[::-1], offset // itemsize)


class OpenedPool:
    """A producer pool mapped into this process on `device`."""

    def __init__(self, identity: PoolIdentity, device: torch.device) -> None:
        self.identity = identity
        self.device = device
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._ptr = cuda_ipc.open_handle(identity.ipc_handle, self._index)
        self.memory = cuda_ipc.wrap(self._ptr, identity.pool_bytes, self._index, owner=self)
        self.words = self.memory[: identity.num_word_slots * 2 * WORD_BYTES].view(torch.int64).view(-1, 2)
        self._views = TypedViews(self.memory)
        self.closed = False

    def view(self, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """Zero-copy view of one embedding; only valid between wait_ready and ack."""
        return self._views.view(offset, nbytes, dtype, shape)

    def wait_ready(self, desc: SliceDescriptor, stream: torch.cuda.Stream, timeout_s: float) -> None:
        """Order `stream` after the producer's ready write (on the GPU, else a host poll bounded by `timeout_s`)."""
        slot = desc.ready_offset // (2 * WORD_BYTES)
        if cuda_ipc.stream_wait_value64(stream, self._ptr + desc.ready_offset, desc.generation, self._index):
            return
        deadline = time.monotonic() + timeout_s
        word = self.words[slot, 0]
        with torch.cuda.stream(stream):
            while int(word.item()) != desc.generation:
                if time.monotonic() > deadline:
                    raise DeadlineExceededError(f"lease {desc.lease_id} was not ready within {timeout_s:.1f} s")
                time.sleep(20e-6)

    def ack(self, desc: SliceDescriptor, stream: torch.cuda.Stream, reader: int = 0) -> None:
        """Enqueue reader `reader`'s ack on `stream`, after the reads enqueued there."""
        offset = desc.ack_offsets[reader]
        if cuda_ipc.stream_write_value64(stream, self._ptr + offset, desc.generation, self._index):
            return
        with torch.cuda.stream(stream):
            self.words[offset // (2 * WORD_BYTES), 1].fill_(desc.generation)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            torch.cuda.synchronize(self.device)
            del self.words, self.memory, self._views
            cuda_ipc.close_handle(self._ptr, self._index)


@dataclass
class HandleCache:
    """Opened pools by (pool id, epoch, consumer GPU uuid); `enabled=False` reopens per request (A/B only)."""

    enabled: bool = True
    stats: HandleCacheStats = field(default_factory=HandleCacheStats)
    _pools: dict[tuple[str, int, str], OpenedPool] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    @functools.cache
    def process_wide() -> HandleCache:
        """The process's cache: a mapping is per process, so all its clients share it."""
        return HandleCache(enabled=True)

    def acquire(self, identity: PoolIdentity, device: torch.device) -> OpenedPool:
        """The open pool for `identity` on `device`; opens it (retrying once) on a miss."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (identity.pool_id, identity.epoch, cuda_ipc.device_uuid(index))
        with self._lock:
            pool = self._pools.get(key) if self.enabled else None
            if pool is not None:
                return pool
            for stale in [k for k in self._pools if k[2] == key[2] and k[:2] != key[:2]]:
                self._close(stale)  # the producer restarted: its old mapping is dead
            pool = self._open(identity, device)
            if self.enabled:
                self._pools[key] = pool
            return pool

    def release(self, pool: OpenedPool) -> None:
        """Per-request mode only: close what `acquire` opened."""
        if not self.enabled:
            pool.close()
            self.stats.closes += 1

    def close_all(self) -> None:
        with self._lock:
            for key in list(self._pools):
                self._close(key)

    def _open(self, identity: PoolIdentity, device: torch.device) -> OpenedPool:
        for attempt in (1, 2):
            try:
                pool = OpenedPool(identity, device)
            except Exception as exc:
                self.stats.open_failures += 1
                logger.warning("opening IPC pool %s failed (attempt %d): %s", identity.pool_id, attempt, exc)
                if attempt == 2:
                    raise
            else:
                self.stats.opens += 1
                return pool
        raise AssertionError("unreachable")

    def _close(self, key: tuple[str, int, str]) -> None:
        self._pools.pop(key).close()
        self.stats.closes += 1
