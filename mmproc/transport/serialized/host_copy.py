"""The one host copy of a serialized payload, into uninitialized `bytes`, by torch's threads with the GIL released
(docs/benchmarks/transport.md)."""

from __future__ import annotations

import ctypes
import threading
import warnings
from collections.abc import Iterable

import torch

# PYFUNCTYPE: GIL held; NULL raises the error it set
_PyBytes_FromStringAndSize = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t)(
    ("PyBytes_FromStringAndSize", ctypes.pythonapi)
)

Payload = torch.Tensor | bytes | bytearray | memoryview

# each copy uses all torch threads; concurrent ones would oversubscribe the decode workers' CPUs
_ONE_COPY_AT_A_TIME = threading.Lock()


def new_bytes(n: int) -> bytes:
    """Uninitialized bytes of length `n`; the caller writes all of it (gRPC sends only `bytes`, and `bytes(n)`
    zeroes first). Safe: for n >= 1 the object is new and unshared, its hash not yet computed."""
    if n < 0:
        raise ValueError(f"negative size {n}")
    return _PyBytes_FromStringAndSize(None, n) if n else b""


def _u8(buffer: bytes | bytearray | memoryview) -> torch.Tensor:
    """(len,) uint8 tensor over the buffer's memory, writable even for bytes."""
    return torch.frombuffer(buffer, dtype=torch.uint8)


# torch warns once per process: have it here, silenced, not a warnings context per message
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    _u8(b"\0")


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """(nbytes,) uint8 view of a tensor's row-major bytes (a copy only when not contiguous)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _payload_u8(payload: Payload) -> torch.Tensor:
    if isinstance(payload, torch.Tensor):
        if payload.device.type != "cpu":
            raise ValueError("host copies need a CPU tensor; stage it to the host first")
        if payload.dtype == torch.uint8 and payload.dim() == 1 and payload.is_contiguous():
            return payload  # pieces of a staged payload (StagedTensor.wait_bytes): no further torch op
        return raw_bytes(payload)
    return _u8(payload) if len(payload) else torch.empty(0, dtype=torch.uint8)


_SHORT = 64 * 1024  # shorter parts are copied under the GIL: waking torch's threads costs more


def join_bytes(size: int, parts: Iterable[Payload]) -> bytes:
    """`parts` (`size` bytes in all) as one new bytes object. `parts` may be a generator that waits for each D2H,
    so earlier parts are copied while later ones land. Few Python steps per part on purpose
    (docs/benchmarks/transport.md). ValueError when the parts do not add up to `size`."""
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
    """`prefix + payload` as one new bytes object."""
    source = _payload_u8(payload)
    return join_bytes(len(prefix) + source.numel(), (prefix, source))
