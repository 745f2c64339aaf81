"""Thin wrappers over the CUDA runtime calls of the IPC transport (CuPy, imported lazily). Every function takes
the caller's *local* device index; GPUs are matched across processes by UUID (CUDA_VISIBLE_DEVICES may differ)."""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

IPC_HANDLE_BYTES = 64


def cupy_or_none() -> Any | None:
    try:
        import cupy  # noqa: PLC0415 - optional, CUDA hosts only
    except Exception:  # ImportError, or a CuPy that cannot find its CUDA libraries
        return None
    return cupy


def ipc_unavailable_reason() -> str | None:
    """None when CUDA IPC can be attempted here, else why not (for logs and GetServerInfo)."""
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if cupy_or_none() is None:
        return "CuPy is not installed (pip install cupy-cuda13x, or pip install -e '.[cuda]' in a checkout)"
    return None


@functools.cache
def device_uuid(index: int) -> str:
    """The GPU's UUID in nvidia-smi's spelling ("GPU-xxxxxxxx-...")."""
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def device_index_by_uuid(uuid: str) -> int | None:
    for index in range(torch.cuda.device_count()):
        if device_uuid(index) == uuid:
            return index
    return None


def malloc_exportable(nbytes: int, index: int) -> tuple[int, bytes]:
    """cudaMalloc (not torch's caching allocator: the handle must map exactly this allocation) and its IPC handle."""
    cupy = cupy_or_none()
    assert cupy is not None, "CuPy is required for CUDA IPC"
    with cupy.cuda.Device(index):
        ptr = cupy.cuda.runtime.malloc(nbytes)
        handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(ptr))
    return ptr, handle


def free(ptr: int, index: int) -> None:
    cupy = cupy_or_none()
    assert cupy is not None
    with cupy.cuda.Device(index):
        cupy.cuda.runtime.free(ptr)


def open_handle(handle: bytes, index: int) -> int:
    """Map another process's allocation on OUR device `index` (lazy peer access), no context on the producer's GPU."""
    cupy = cupy_or_none()
    assert cupy is not None, "CuPy is required for CUDA IPC"
    if len(handle) != IPC_HANDLE_BYTES:
        raise ValueError(f"an IPC handle has {IPC_HANDLE_BYTES} bytes, got {len(handle)}")
    with cupy.cuda.Device(index):
        return int(cupy.cuda.runtime.ipcOpenMemHandle(handle, cupy.cuda.runtime.cudaIpcMemLazyEnablePeerAccess))


def close_handle(ptr: int, index: int) -> None:
    cupy = cupy_or_none()
    assert cupy is not None
    with cupy.cuda.Device(index):
        cupy.cuda.runtime.ipcCloseMemHandle(ptr)


def wrap(ptr: int, nbytes: int, index: int, owner: object) -> torch.Tensor:
    """A zero-copy (nbytes,) uint8 tensor over `ptr` on OUR device `index`, keeping `owner` alive.

    The CUDA array interface has no device id, so torch may pick the producer's GPU for a peer mapping: the
    result is checked, with DLPack (which has one) as the fallback."""
    cupy = cupy_or_none()
    assert cupy is not None
    memory = cupy.cuda.UnownedMemory(ptr, nbytes, owner, device_id=index)
    array = cupy.ndarray((nbytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(memory, 0))
    target = torch.device("cuda", index)
    tensor = torch.as_tensor(array, device=target)
    if tensor.device != target or tensor.data_ptr() != ptr:
        with cupy.cuda.Device(index):
            tensor = torch.from_dlpack(array)
    if tensor.device != target or tensor.data_ptr() != ptr:
        raise RuntimeError(f"wrapping device memory gave {tensor.device} at {tensor.data_ptr():#x}, not cuda:{index}")
    return tensor


@functools.cache
def _driver() -> Any | None:
    """cuda-python's driver bindings, or None."""
    try:
        from cuda.bindings import driver  # noqa: PLC0415 - optional
    except Exception:
        return None
    return driver


def _stream_value_op(op: str, stream: torch.cuda.Stream, address: int, value: int, index: int, flags: Any) -> bool:
    driver = _driver()
    if driver is None:
        return False
    cupy = cupy_or_none()
    if cupy is not None:
        cupy.cuda.runtime.setDevice(index)  # the driver call needs the device's primary context current here
    (err,) = getattr(driver, op)(
        driver.CUstream(stream.cuda_stream), driver.CUdeviceptr(address), driver.cuuint64_t(value), flags
    )
    if err != driver.CUresult.CUDA_SUCCESS:
        logger.warning("%s failed (%s); using the fallback", op, err)
        return False
    return True


def stream_wait_value64(stream: torch.cuda.Stream, address: int, value: int, index: int) -> bool:
    """Make `stream` wait on the GPU until the int64 at `address` equals `value` (cuStreamWaitValue64); False
    without cuda-python, and the caller polls."""
    driver = _driver()
    flags = None if driver is None else driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_EQ
    return _stream_value_op("cuStreamWaitValue64", stream, address, value, index, flags)


def stream_write_value64(stream: torch.cuda.Stream, address: int, value: int, index: int) -> bool:
    """Enqueue `*(int64 *)address = value` on `stream` (cuStreamWriteValue64); False without cuda-python."""
    driver = _driver()
    flags = None if driver is None else driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
    return _stream_value_op("cuStreamWriteValue64", stream, address, value, index, flags)
