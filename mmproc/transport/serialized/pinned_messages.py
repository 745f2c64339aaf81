"""Reply `bytes` objects page-locked once and reused, so the D2H lands in the message gRPC sends, with no host
copy (docs/benchmarks/transport.md). A message is idle when only its slot holds a reference; its length is then
reset in place (CPython's bytes layout, checked at import, else the pool stays off)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
import sysconfig
import threading
from collections.abc import Callable
from dataclasses import dataclass

from mmproc.transport.serialized.host_copy import new_bytes
from mmproc.units import MiB

logger = logging.getLogger(__name__)

MIN_MESSAGE = 256 * 1024  # smaller messages are copied: the copy is short
_MIN_CLASS = MiB
_PAGE = 4096
# PyBytesObject: PyObject_VAR_HEAD (refcount, type, ob_size), ob_shash, then ob_sval (the bytes and a NUL).
_SIZE_AT = object.__basicsize__
_HASH_AT = _SIZE_AT + ctypes.sizeof(ctypes.c_ssize_t)
_DATA_AT = bytes.__basicsize__ - 1


def data_address(message: bytes) -> int:
    """Address of a bytes object's first byte (CPython: the object's address plus its fixed header)."""
    return id(message) + _DATA_AT


def _set_length(message: bytes, n: int) -> None:
    """Shorten an unshared bytes object in place: its size, the terminating NUL and the cached hash."""
    ctypes.c_ssize_t.from_address(id(message) + _SIZE_AT).value = n
    ctypes.c_ssize_t.from_address(id(message) + _HASH_AT).value = -1
    ctypes.c_char.from_address(data_address(message) + n).value = b"\0"


def _layout_checked() -> bool:
    """Whether bytes are laid out as `_set_length` assumes (CPython with the GIL)."""
    if sys.implementation.name != "cpython" or sysconfig.get_config_var("Py_GIL_DISABLED"):
        return False
    if bytes.__basicsize__ != _HASH_AT + ctypes.sizeof(ctypes.c_ssize_t) + 1:  # the hash, then the bytes
        return False
    probe = new_bytes(16)
    ctypes.memmove(data_address(probe), b"0123456789abcdef", 16)
    _set_length(probe, 5)
    return len(probe) == 5 and probe == b"01234" and hash(probe) == hash(b"01234")


LAYOUT_OK = _layout_checked()


def cuda_register(address: int, nbytes: int) -> None:
    """Page-lock host memory for fast D2H copies (cudaHostRegister); RuntimeError if CUDA refuses."""
    import torch

    code = int(torch.cuda.cudart().cudaHostRegister(address, nbytes, 0))
    if code != 0:
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed: CUDA error {code}")


def cuda_unregister(address: int) -> None:
    import torch

    torch.cuda.cudart().cudaHostUnregister(address)


def size_class(n: int) -> int:
    """The capacity of the message that serves `n` bytes: a power of two, at least 1 MiB."""
    return max(_MIN_CLASS, 1 << (n - 1).bit_length())


@dataclass(eq=False)  # compared by identity: `taken` holds the slots a reply already has
class _Slot:
    message: bytes  # ours; idle when only this slot holds it
    capacity: int
    last_used: int = 0


class PinnedMessages:
    """At most `max_bytes` of page-locked reply messages; thread-safe."""

    def __init__(
        self,
        max_bytes: int,
        register: Callable[[int, int], None] = cuda_register,
        unregister: Callable[[int], None] = cuda_unregister,
    ) -> None:
        self.max_bytes = max_bytes
        self.registered_bytes = 0
        self.misses = 0  # replies copied instead: no idle message and no room for a new one
        self.enabled = LAYOUT_OK and max_bytes >= _MIN_CLASS
        self._register, self._unregister = register, unregister
        self._slots: list[_Slot] = []
        self._idle_refs = 0  # a message's reference count when only its slot holds it
        self._uses = 0
        self._lock = threading.Lock()

    def take(self, sizes: list[int]) -> list[bytes | None]:
        """A message per size (None below MIN_MESSAGE; all None if any longer one cannot be served), uninitialized:
        the caller writes every byte."""
        out: list[bytes | None] = [None] * len(sizes)
        wanted = [k for k, n in enumerate(sizes) if n >= MIN_MESSAGE]
        if not self.enabled or not wanted:
            return out
        with self._lock:
            taken: list[_Slot] = []
            for k in wanted:
                slot = self._idle(size_class(sizes[k]), taken)
                if slot is None:
                    self.misses += 1
                    return out
                taken.append(slot)
            self._uses += 1
            for slot, k in zip(taken, wanted):
                slot.last_used = self._uses
                _set_length(slot.message, sizes[k])
                out[k] = slot.message
            return out

    def close(self) -> None:
        """Unregister every message (memory freed while registered breaks later copies). No reply may be staging."""
        with self._lock:
            self.enabled = False
            for slot in self._slots:
                self._unregister(data_address(slot.message))
            self._slots.clear()
            self.registered_bytes = 0

    def __del__(self) -> None:  # a pool nobody closed (a library user, a test): its messages are freed next
        with contextlib.suppress(Exception):  # at interpreter exit CUDA may be gone, and its pages with it
            self.close()

    def _is_idle(self, slot: _Slot) -> bool:
        return sys.getrefcount(slot.message) == self._idle_refs

    def _idle(self, capacity: int, taken: list[_Slot]) -> _Slot | None:
        """An idle message of `capacity` not in `taken`, evicting other classes' idle ones (LRU) to make room."""
        for slot in self._slots:
            if slot.capacity == capacity and slot not in taken and self._is_idle(slot):
                return slot
        while self.registered_bytes + capacity > self.max_bytes:
            idle = [slot for slot in self._slots if slot not in taken and self._is_idle(slot)]
            if not idle:
                return None
            self._evict(min(idle, key=lambda slot: slot.last_used))
        return self._add(capacity)

    def _add(self, capacity: int) -> _Slot | None:
        # two spare pages: registrations may not share the last page
        message = new_bytes(capacity + 2 * _PAGE)
        try:
            self._register(data_address(message), capacity)
        except Exception as exc:  # locked-memory limit, a CUDA error: copy replies from now on
            self.enabled = False
            logger.warning("page-locked reply messages off (%s): replies are copied to the host", exc)
            return None
        slot = _Slot(message, capacity)
        del message
        self._slots.append(slot)
        self.registered_bytes += capacity
        self._idle_refs = sys.getrefcount(slot.message)
        return slot

    def _evict(self, slot: _Slot) -> None:
        self._slots.remove(slot)
        self._unregister(data_address(slot.message))
        self.registered_bytes -= slot.capacity
