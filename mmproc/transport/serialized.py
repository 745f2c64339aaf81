"""Serialized transport: embeddings as raw little-endian bytes plus dtype and shape. No pickle on any wire.

Producer: `stage_to_host` copies a request's embeddings to the CPU together (one pinned buffer, one
synchronize when they come from a GPU); `tensor_bytes_view` exposes each as raw bytes without copying, and
`tensor_to_bytes` copies them into a bytes object (the one copy into what protobuf / gRPC sends).
Consumer: `bytes_to_tensor` views the received bytes as a tensor and copies it once to its device.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence

import torch

# Wire names of the dtypes we send; the proto's DType enum is mapped from these in the service/client.
DTYPE_NAMES: dict[torch.dtype, str] = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}

if sys.byteorder != "little":  # pragma: no cover - every platform we run on is little-endian
    raise ImportError("mmproc's serialized transport assumes a little-endian host")


def tensor_nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n * torch.empty((), dtype=dtype).element_size()


def stage_to_host(embeddings: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copy device tensors (T_i, hidden) to the CPU for serialization; CPU tensors pass through.

    From CUDA the copies go into one pinned buffer, non-blocking on the current stream, followed by a single
    synchronize per device, so the host never reads before the copies are done.
    """
    out: list[torch.Tensor | None] = [t if t.device.type == "cpu" else None for t in embeddings]
    on_gpu = [i for i, t in enumerate(embeddings) if t.device.type != "cpu"]
    if not on_gpu:
        return out  # type: ignore[return-value]
    staging = torch.empty(sum(embeddings[i].nbytes for i in on_gpu), dtype=torch.uint8, pin_memory=True)
    start = 0
    for i in on_gpu:
        tensor = embeddings[i]
        host = staging[start : start + tensor.nbytes].view(tensor.dtype).view(tensor.shape)
        host.copy_(tensor, non_blocking=True)
        out[i] = host
        start += tensor.nbytes
    for device in {embeddings[i].device for i in on_gpu}:
        torch.cuda.current_stream(device).synchronize()
    return out  # type: ignore[return-value]


def tensor_bytes_view(tensor: torch.Tensor) -> memoryview:
    """Raw row-major bytes of a CPU tensor (any of DTYPE_NAMES' dtypes) as a flat memoryview over the tensor's
    own memory (no copy when it is contiguous). The view keeps the tensor alive; do not write to the tensor."""
    if tensor.device.type != "cpu":
        raise ValueError("tensor_bytes_view needs a CPU tensor; call stage_to_host first")
    if tensor.dtype not in DTYPE_NAMES:
        raise ValueError(f"unsupported dtype {tensor.dtype}")
    # uint8 view: numpy has no bfloat16, and the bytes are the same for every dtype.
    return memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    """Raw row-major bytes of a CPU tensor (any of DTYPE_NAMES' dtypes), copied once into a bytes object."""
    return tensor_bytes_view(tensor).tobytes()


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
