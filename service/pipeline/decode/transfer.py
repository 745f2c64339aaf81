"""How a decode worker's result crosses the process boundary: large patch arrays through a tmpfs file.

Pickling a (L, 3, 14, 14) float32 array through multiprocessing's pipe costs ~2.5 ms per MB here (several
copies plus 64 KiB pipe writes), which made process isolation 2.5x slower than threads for a 1 MP image.
Instead the worker writes the array once into a file in a private directory on /dev/shm and the parent maps
it (copy-on-write, so the tensor stays writable) and unlinks it at once: the pages belong to the mapping from
then on and are freed with the tensor. Small arrays, or a missing/full /dev/shm, fall back to the pipe.

Leaks are bounded: the parent maps and unlinks in the executor's done-callback, whether or not the request
still waits for the image; a file left by a worker that died mid-write is removed when the pool closes, and
directories of dead processes are swept when a new pool starts.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mmproc.types import PreprocessedImage

logger = logging.getLogger(__name__)

SHM_ROOT = Path("/dev/shm")
DIR_PREFIX = "mmproc-decode-"
FILE_THRESHOLD = 256 * 1024  # bytes; below this the pipe is cheaper than a file


@dataclass
class Shipped:
    """One worker result. Exactly one of `patches` (in-band) or `path` (tmpfs file) is set when it arrives;
    `materialize()` (parent side, idempotent, thread-safe) turns a path into a mapped array."""

    grid_hw: tuple[int, int]
    num_tokens: int
    shape: tuple[int, ...]
    timings: tuple[float, ...]  # the worker's (decode_s, preprocess_s)
    patches: np.ndarray | None = None
    path: str | None = None
    image_size: tuple[int, int] = (0, 0)  # (width, height) as decoded
    dtype: str = "float32"  # of the patches: float32, or uint8 bytes that `lut` normalizes (on the device)
    lut: np.ndarray | None = None
    cpu_s: float = 0.0  # CPU time the worker's task used (the request's decode budget is charged with it)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def materialize(self) -> None:
        with self._lock:
            if self.path is None:
                return
            path, self.path = self.path, None
            try:
                self.patches = _map_file(path, self.shape, np.dtype(self.dtype))
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def to_image(self) -> PreprocessedImage:
        """The `PreprocessedImage`: patches (L, 3, p, p) CPU tensor sharing the array's memory."""
        self.materialize()
        assert self.patches is not None
        lut = None if self.lut is None else torch.from_numpy(self.lut)
        patches = torch.from_numpy(self.patches)
        return PreprocessedImage(patches, self.grid_hw, self.num_tokens, self.image_size, lut=lut)


def ship(
    patches: np.ndarray,
    grid_hw: tuple[int, int],
    num_tokens: int,
    out_dir: str | None,
    timings: tuple[float, ...] = (),
    image_size: tuple[int, int] = (0, 0),
    lut: np.ndarray | None = None,
) -> Shipped:
    """Worker side: (L, 3, p, p) C-contiguous patches (float32, or uint8 with their `lut`) -> `Shipped`, through
    a file when worthwhile."""
    shape, dtype = tuple(patches.shape), patches.dtype.name
    shipped = Shipped(grid_hw, num_tokens, shape, tuple(timings), image_size=image_size, dtype=dtype, lut=lut)
    if out_dir is not None and patches.nbytes >= FILE_THRESHOLD:
        fd, path = tempfile.mkstemp(dir=out_dir)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(memoryview(patches).cast("B"))  # write(): a full tmpfs is ENOSPC, never SIGBUS
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
        else:
            shipped.path = path
            return shipped
    shipped.patches = patches
    return shipped


class PatchWriter:
    """Worker side: patches appended as they are made (a video, frame after frame) to one file in `out_dir`, so
    that the worker holds one frame's patches at a time; kept in memory without a directory (thread mode)."""

    def __init__(self, out_dir: str | None) -> None:
        self._parts: list[np.ndarray] = []
        self._file = self._path = None
        self.rows, self.row_shape, self.dtype = 0, (), "float32"
        if out_dir is not None:
            fd, self._path = tempfile.mkstemp(dir=out_dir)
            self._file = os.fdopen(fd, "wb")

    def write(self, patches: np.ndarray) -> None:
        """(L, 3, p, p) C-contiguous patches, the same shape per row every time."""
        self.rows += patches.shape[0]
        self.row_shape, self.dtype = tuple(patches.shape[1:]), patches.dtype.name
        if self._file is not None:
            self._file.write(memoryview(patches).cast("B"))  # write(): a full tmpfs is ENOSPC, never SIGBUS
        else:
            self._parts.append(patches)

    def finish(self, grid_hw: tuple[int, int], num_tokens: int, timings: tuple[float, ...], image_size) -> Shipped:
        shape = (self.rows, *self.row_shape)
        shipped = Shipped(grid_hw, num_tokens, shape, tuple(timings), image_size=image_size, dtype=self.dtype)
        if self._file is not None:
            self._file.close()
            shipped.path, self._file = self._path, None
        else:
            shipped.patches = np.concatenate(self._parts) if self._parts else np.empty(shape, np.float32)
        return shipped

    def discard(self) -> None:
        """A failed video: its file goes (the parent never sees it)."""
        if self._file is not None:
            self._file.close()
            self._file = None
            with contextlib.suppress(OSError):
                os.unlink(self._path)


def _map_file(path: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        expected = int(np.prod(shape)) * dtype.itemsize
        if size != expected:
            raise OSError(f"decode transfer file holds {size} bytes, expected {expected}")
        mapped = mmap.mmap(file.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return np.frombuffer(mapped, dtype=dtype).reshape(shape)


def make_transfer_dir() -> str | None:
    """A fresh 0700 directory on /dev/shm for this process's pool, or None (use the pipe) when unusable."""
    if not SHM_ROOT.is_dir() or not os.access(SHM_ROOT, os.W_OK):
        return None
    _sweep_dead()
    try:
        return tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-", dir=SHM_ROOT)
    except OSError as exc:
        logger.warning("decode pool: no transfer directory on %s (%s); results go through the pipe", SHM_ROOT, exc)
        return None


def remove_transfer_dir(path: str | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def _sweep_dead() -> None:
    """Remove transfer directories left by processes that no longer exist (killed with SIGKILL, say)."""
    for entry in SHM_ROOT.glob(f"{DIR_PREFIX}*"):
        pid = entry.name.removeprefix(DIR_PREFIX).split("-", 1)[0]
        try:
            ours = entry.stat().st_uid == os.getuid()
        except OSError:
            continue
        if ours and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(entry, ignore_errors=True)
