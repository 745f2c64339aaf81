"""The one host copy of a serialized payload: into a `bytes` object allocated uninitialized, by torch's threads.

`b"".join` copies on one core under the GIL; a torch `copy_` releases it and uses the intra-op threads
(`torch_threads`); figures in docs/benchmarks/transport.md.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from collections.abc import Iterable

import torch

# PYFUNCTYPE: called with the GIL held, and a NULL result raises the Python error it set (MemoryError).
_PyBytes_FromStringAndSize = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t)(
    ("PyBytes_FromStringAndSize", ctypes.pythonapi)
)

Payload = torch.Tensor | bytes | bytearray | memoryview

# Each copy already runs on all of torch's threads, and every Python thread that starts one gets its own OpenMP
# team: concurrent replies copying at once would only oversubscribe the CPUs the decode workers need. Waiting
# here releases the GIL, and one message's copy is short (a fraction of a millisecond).
_ONE_COPY_AT_A_TIME = threading.Lock()


def new_bytes(n: int) -> bytes:
    """A bytes object of length `n` whose contents are not initialized: the caller must write all of it.

    Why: gRPC Python sends a serialized message only as `bytes` (not bytearray or memoryview), and `bytes(n)`
    zeroes its memory first (a second pass over tens of MB). `PyBytes_FromStringAndSize(NULL, n)` is how CPython's
    own C code builds bytes it fills afterwards. Why it is safe: for n >= 1 the object is new (refcount 1, nobody
    else holds it) and not a shared singleton, and its hash is computed lazily on the first hash(), which nobody
    can call before we hand the object out. n == 0 returns the shared b"", which is never written.
    """
    if n < 0:
        raise ValueError(f"negative size {n}")
    return _PyBytes_FromStringAndSize(None, n) if n else b""


def _u8(buffer: bytes | bytearray | memoryview) -> torch.Tensor:
    """(len,) uint8 tensor over the buffer's memory, writable even for bytes (see new_bytes: we fill it once)."""
    return torch.frombuffer(buffer, dtype=torch.uint8)


# torch warns ONCE per process that a tensor over `bytes` is writable: have that once here, silenced, rather
# than a warnings context (tens of microseconds) around every message (tests/transport/test_host_copy.py checks it).
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    _u8(b"\0")


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's row-major bytes as a flat (nbytes,) uint8 tensor: a view, no copy when it is contiguous."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _payload_u8(payload: Payload) -> torch.Tensor:
    """(nbytes,) uint8 CPU tensor over the payload's row-major bytes (a copy only for a non-contiguous tensor)."""
    if isinstance(payload, torch.Tensor):
        if payload.device.type != "cpu":
            raise ValueError("host copies need a CPU tensor; stage it to the host first")
        if payload.dtype == torch.uint8 and payload.dim() == 1 and payload.is_contiguous():
            return payload  # pieces of a staged payload (StagedTensor.wait_bytes): no further torch op
        return raw_bytes(payload)
    return _u8(payload) if len(payload) else torch.empty(0, dtype=torch.uint8)


# Parts shorter than this (headers, tags, lengths) are written by memmove or numpy under the GIL: a torch op, which
# wakes torch's thread team, costs more.
_SHORT = 64 * 1024


def join_bytes(size: int, parts: Iterable[Payload]) -> bytes:
    """`parts`, in order and `size` bytes in all, as one new bytes object: each payload copied once, by torch's
    threads (GIL released), short parts under the GIL. `parts` may be a generator that waits for a payload's D2H
    before yielding it: earlier parts are copied while later ones are still in flight.

    Few Python steps per part on purpose: on the H200 host each costs several microseconds and a 20 MB stream
    has 16 parts (docs/benchmarks/transport.md, session 11). ValueError when the parts do not add up to `size`
    (the bytes are never handed out part-filled)."""
    out = new_bytes(size)
    target = _u8(out) if size else torch.empty(0, dtype=torch.uint8)
    address = target.data_ptr()
    pos = 0
    for part in parts:
        head = isinstance(part, bytes) and len(part) < _SHORT  # one memmove, no tensor made
        source = None if head else _payload_u8(part)
        end = pos + (len(part) if source is None else source.numel())
        if end > size:
            raise ValueError(f"parts longer than the {size} bytes announced")
        if source is None:
            ctypes.memmove(address + pos, part, end - pos)
        elif end - pos < _SHORT:
            target[pos:end].numpy()[:] = source.numpy()
        else:
            with _ONE_COPY_AT_A_TIME:
                target[pos:end].copy_(source)
        pos = end
    if pos != size:
        raise ValueError(f"parts of {pos} bytes, {size} announced")
    return out


def concat_bytes(prefix: bytes, payload: Payload) -> bytes:
    """`prefix + payload` as one new bytes object, the payload copied once by torch's threads (GIL released)."""
    source = _payload_u8(payload)
    return join_bytes(len(prefix) + source.numel(), (prefix, source))
