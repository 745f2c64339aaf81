"""Serialized transport: embeddings as raw little-endian bytes plus dtype and shape (no pickle on any wire)."""

from __future__ import annotations

import ctypes
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mmproc.transport.serialized.host_copy import concat_bytes, join_bytes, raw_bytes
from mmproc.transport.serialized.pinned_messages import PinnedMessages, data_address

DTYPE_NAMES: dict[torch.dtype, str] = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}

if sys.byteorder != "little":  # pragma: no cover - every platform we run on is little-endian
    raise ImportError("mmproc's serialized transport assumes a little-endian host")


def tensor_nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n * torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class StagedTensor:
    """`host` (CPU) holds the values once `ready` fired; `queued` fires when the work before the copy is done.
    Both None for a tensor already on the CPU."""

    host: torch.Tensor
    ready: torch.cuda.Event | None = None
    queued: torch.cuda.Event | None = None

    def wait(self) -> torch.Tensor:
        """`host`, after its D2H copy has landed (blocks this thread only, not the device)."""
        if self.queued is not None and not self.queued.query():  # (a sleeping wait costs even when done)
            self.queued.synchronize()  # sleeps while the device finishes what was queued before the copy
        if self.ready is not None:
            self.ready.synchronize()  # spins (GIL released) through the copy alone
        return self.host

    def wait_bytes(self) -> torch.Tensor:
        """`wait()`'s tensor as (nbytes,) uint8, a view when contiguous."""
        return raw_bytes(self.wait())


def start_staging(embeddings: Sequence[torch.Tensor], into: Sequence[torch.Tensor] | None = None) -> list[StagedTensor]:
    """Start copying device tensors (T_i, hidden) to the CPU; CPU tensors pass through, already ready.

    Copies go non-blocking into one pinned buffer, an event per tensor, so tensor i can be serialized while later
    ones are in flight; `wait()` each before reading. `into`: page-locked flat uint8 destinations instead.
    A wait sleeps through the work before the copy and spins only through the copy
    (docs/benchmarks/transport.md, "Serialized staging")."""
    if into is not None:
        for tensor, target in zip(embeddings, into, strict=True):
            if target.numel() != tensor.nbytes:
                raise ValueError(f"a {target.numel()}-byte destination for a {tensor.nbytes}-byte tensor")
    out: list[StagedTensor | None] = [None] * len(embeddings)
    for i, t in enumerate(embeddings):
        if t.device.type == "cpu":
            out[i] = StagedTensor(t if into is None else into[i].copy_(raw_bytes(t)))
    on_gpu = [i for i, t in enumerate(embeddings) if t.device.type != "cpu"]
    if not on_gpu:
        return out  # type: ignore[return-value]
    size = sum(embeddings[i].nbytes for i in on_gpu)
    staging = torch.empty(size, dtype=torch.uint8, pin_memory=True) if into is None else None
    queued_on: dict[torch.device, torch.cuda.Event] = {}  # one per device: its copies follow each other
    start = 0
    for i in on_gpu:
        tensor = embeddings[i]
        stream = torch.cuda.current_stream(tensor.device)
        queued = queued_on.get(tensor.device)
        if queued is None:
            queued = queued_on[tensor.device] = torch.cuda.Event(blocking=True)
            queued.record(stream)
        if staging is not None:
            host = staging[start : start + tensor.nbytes].view(tensor.dtype).view(tensor.shape)
            host.copy_(tensor, non_blocking=True)  # enqueued on that same stream
        else:
            host = into[i]  # type: ignore[index]
            host.copy_(raw_bytes(tensor), non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(stream)
        out[i] = StagedTensor(host, ready, queued)
        start += tensor.nbytes
    return out  # type: ignore[return-value]


def stage_to_host(embeddings: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`start_staging`, then wait: the (T_i, hidden) tensors on the CPU."""
    return [staged.wait() for staged in start_staging(embeddings)]


def tensor_bytes_view(tensor: torch.Tensor) -> memoryview:
    """A CPU tensor's raw row-major bytes as a memoryview of its memory (no copy when contiguous)."""
    if tensor.device.type != "cpu":
        raise ValueError("tensor_bytes_view needs a CPU tensor; call stage_to_host first")
    if tensor.dtype not in DTYPE_NAMES:
        raise ValueError(f"unsupported dtype {tensor.dtype}")
    # uint8 view: numpy has no bfloat16, and the bytes are the same for every dtype.
    return memoryview(raw_bytes(tensor).numpy())


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    """A CPU tensor's raw row-major bytes, copied once into a bytes object."""
    return concat_bytes(b"", tensor_bytes_view(tensor))


def bytes_to_tensor(
    data: bytes, dtype_name: str, shape: tuple[int, ...], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Inverse of `tensor_to_bytes`: a tensor of `shape` on `device` (a fresh, writable tensor)."""
    dtype = _DTYPES_BY_NAME.get(dtype_name)
    if dtype is None:
        raise ValueError(f"unknown dtype {dtype_name!r}")
    expected = tensor_nbytes(shape, dtype)
    if len(data) != expected:
        raise ValueError(f"payload has {len(data)} bytes, {shape} x {dtype_name} needs {expected}")
    if expected == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # frombuffer warns that `bytes` is read-only; we copy below
        view = torch.frombuffer(data, dtype=torch.uint8).view(dtype).view(shape)
    target = torch.device(device)
    if target.type == "cpu":
        return view.clone()
    return view.to(target)


Part = bytes | torch.Tensor  # a message's framing (bytes) or a payload (a tensor on a GPU or the CPU)


def write_messages(messages: Sequence[Sequence[Part]], pinned: PinnedMessages | None = None) -> list[bytes]:
    """Each message's parts, in order, as one bytes object (framing as is, payloads' raw bytes).

    With `pinned`, GPU payloads land in page-locked messages directly when the pool has room; else they are
    staged and copied once."""
    sizes = [sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts) for parts in messages]
    on_gpu = any(isinstance(p, torch.Tensor) and p.device.type != "cpu" for parts in messages for p in parts)
    out = pinned.take(sizes) if pinned is not None and on_gpu else [None] * len(messages)
    direct, into = [], []  # payloads that land in a page-locked message, and where
    for message, parts in zip(out, messages):
        if message is None:
            continue
        target, address, pos = torch.frombuffer(message, dtype=torch.uint8), data_address(message), 0
        for p in parts:
            if isinstance(p, bytes):
                ctypes.memmove(address + pos, p, len(p))
                pos += len(p)
            else:
                direct.append(p)
                into.append(target[pos : pos + p.nbytes])
                pos += p.nbytes
    try:
        landing = start_staging(direct, into)
        copied = [k for k, message in enumerate(out) if message is None]
        staged = iter(start_staging([p for k in copied for p in messages[k] if isinstance(p, torch.Tensor)]))
        for k in copied:
            parts = messages[k]
            out[k] = join_bytes(sizes[k], (p if isinstance(p, bytes) else next(staged).wait_bytes() for p in parts))
        for staged_tensor in landing:
            staged_tensor.wait()
    except BaseException:
        for device in {p.device for p in direct if p.device.type == "cuda"}:
            torch.cuda.synchronize(device)  # no copy may still be landing in a message the pool takes back
        raise
    return out  # type: ignore[return-value]
