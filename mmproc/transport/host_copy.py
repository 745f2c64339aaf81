"""Host copies into the `bytes` objects handed to gRPC: allocated uninitialized, filled by a few threads at once.

The serialized transport copies every payload byte exactly once, from the staging buffer into the messages'
bytes. `b"".join` does that copy on one core (13 GB/s on the H200 host, 25% of the pinned D2H it follows);
the same copy spread over a handful of threads without the GIL went 2.5x faster there (docs/benchmarks/raw/session3/run1_probe_copy.py:
33.5 GB/s for 20.7 MB in 4 MiB messages with 8 threads, torch's own). So large copies are split into
pieces of at least MIN_PIECE_BYTES and run on a module-wide pool of COPY_THREADS threads; only tiny ones (below
INLINE_BYTES) run on the calling thread, which thus stays free to prepare the next message or wait for the next
image's D2H while the pool copies. When the caller finally waits, it copies the pieces no pool thread has
started yet itself, so a reply never waits behind another reply's queued pieces.

Each piece is one `np.copyto` of contiguous uint8 arrays: a single memmove that releases the GIL and stays on
its own thread (a torch `copy_` would start an OpenMP team of torch.get_num_threads() threads from every pool
thread: 8 x 8 threads on 16 vCPUs). The pool is shared by every request, so concurrent replies together use at
most COPY_THREADS copy threads (plus their own waiting threads); its queue holds at most about
(reply bytes / MIN_PIECE_BYTES) pieces per reply in progress, and reply sizes and concurrency are bounded by the
server's admission limits.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType

import numpy as np
import torch


def _cpus() -> int:
    """CPUs this process may run on (the container's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# On the H200 host (16 vCPUs) 8 copying threads were fastest: 0.62 ms for 20.7 MB, vs 0.96 ms with 16, 0.89 with 4.
COPY_THREADS = min(8, _cpus())
# Smallest piece a copy is split into: ~50-100 us of memcpy, well above the ~5 us it costs to submit it.
MIN_PIECE_BYTES = 1 << 20
# Copies below this (a few us of memcpy, about the cost of a submit) run on the calling thread.
INLINE_BYTES = 64 << 10

# Threads start on the first submit, not at import: a process that only imports this module (a forkserver
# preloading it, a client) starts none.
_POOL = ThreadPoolExecutor(max_workers=COPY_THREADS, thread_name_prefix="mmproc-host-copy")

# PYFUNCTYPE: called with the GIL held, and a NULL result raises the Python error it set (MemoryError).
_PyBytes_FromStringAndSize = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t)(
    ("PyBytes_FromStringAndSize", ctypes.pythonapi)
)

Buffer = bytes | bytearray | memoryview
Source = torch.Tensor | np.ndarray | Buffer


def new_bytes(n: int) -> bytes:
    """A bytes object of length `n` whose contents are not initialized: the caller must write all of it.

    Why: gRPC Python sends a serialized message only as `bytes` (not bytearray or memoryview), and `bytes(n)`
    zeroes its memory first (a second pass over tens of MB). `PyBytes_FromStringAndSize(NULL, n)` is how
    CPython's own C code builds bytes it fills afterwards. Why it is safe: for n >= 1 the object is new (refcount
    1, nobody else holds it), it is not interned or cached (only the empty and the 1-byte bytes built *from a
    string* are shared singletons), and its hash is computed lazily on the first hash(), which nobody can call
    before we hand the object out. Writing into it happens before that, once (see HostCopies); after that it is
    an ordinary immutable bytes object. n == 0 returns the shared b"", which is never written.
    """
    if n < 0:
        raise ValueError(f"negative size {n}")
    if n == 0:
        return b""
    return _PyBytes_FromStringAndSize(None, n)


def split_plan(nbytes: int, threads: int = COPY_THREADS, min_piece: int = MIN_PIECE_BYTES) -> list[tuple[int, int]]:
    """(start, stop) pieces of a copy of `nbytes`: at most `threads`, each at least `min_piece` bytes (except a
    copy smaller than one piece, which stays whole), sizes within one byte of each other."""
    pieces = max(1, min(threads, nbytes // min_piece))
    bounds = [nbytes * k // pieces for k in range(pieces + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _writable_u8(dst: Buffer) -> np.ndarray:
    """(len,) uint8 array over `dst`'s memory, writable even when `dst` is a bytes object (see new_bytes)."""
    if isinstance(dst, bytes):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # frombuffer warns that `bytes` is read-only: we fill it
            return torch.frombuffer(dst, dtype=torch.uint8).numpy() if len(dst) else np.empty(0, np.uint8)
    return np.frombuffer(dst, dtype=np.uint8)  # a read-only buffer fails the copy: numpy raises ValueError


def _source_u8(src: Source) -> np.ndarray:
    """(nbytes,) uint8 array over `src`'s row-major bytes: a CPU tensor (any dtype) or a contiguous buffer."""
    if isinstance(src, torch.Tensor):
        if src.device.type != "cpu":
            raise ValueError("host copies need a CPU tensor; stage it to the host first")
        # uint8 view: numpy has no bfloat16, and the bytes are the same for every dtype.
        return src.contiguous().reshape(-1).view(torch.uint8).numpy()
    return np.frombuffer(src, dtype=np.uint8)


class _Piece:
    """One piece of a copy, run by whichever thread claims it first: a pool thread or the waiting caller."""

    __slots__ = ("_claim", "_done", "_dst", "_error", "_src", "nbytes")

    def __init__(self, dst: np.ndarray, src: np.ndarray) -> None:
        self._dst, self._src, self.nbytes = dst, src, src.size
        self._claim = threading.Lock()
        self._done = threading.Event()
        self._error: BaseException | None = None

    def run(self) -> None:
        """Copy, unless another thread has claimed the piece (then return at once). Never raises: an error is
        kept for `result`, in the caller's thread."""
        if not self._claim.acquire(blocking=False):  # atomic: exactly one thread copies
            return
        try:
            np.copyto(self._dst, self._src)
        except BaseException as error:  # re-raised by result(), in the caller's thread
            self._error = error
        finally:
            self._done.set()

    def cancel(self) -> None:
        """Make sure the piece is never copied if no thread has claimed it yet (a claimed one still finishes)."""
        if self._claim.acquire(blocking=False):
            self._done.set()

    def join(self) -> None:
        """Block until the copy is done (or cancelled), by whichever thread claimed it."""
        self._done.wait()

    def result(self) -> None:
        """`join`, then raise the copy's error, if any."""
        self.join()
        if self._error is not None:
            raise self._error


class HostCopies:
    """A group of copies into host buffers, in flight on the shared pool until `wait()` (or the end of a `with`).

    Typical use builds several messages, then waits once, so that the copies of one message overlap the set-up
    of the next (and, in the serialized stream, the D2H of later images):

        with HostCopies() as copies:
            messages = [copies.message(prefix, payload) for prefix, payload in parts]
        # every message is complete here

    The bytes returned by `message` are incomplete until the wait: hand them to no one before it. A wait never
    depends on a piece still queued behind other work: the waiting thread copies (or, on an error, cancels) every
    piece no pool thread has claimed, and waits only for pieces being copied right now.
    """

    def __init__(
        self, threads: int = COPY_THREADS, min_piece: int = MIN_PIECE_BYTES, inline_bytes: int = INLINE_BYTES
    ) -> None:
        self._threads = threads  # pieces per copy; more than the pool's COPY_THREADS would only queue
        self._min_piece = min_piece
        self._inline_bytes = inline_bytes
        self._pending: list[_Piece] = []

    def copy_into(self, dst: Buffer, offset: int, src: Source) -> None:
        """Copy the raw bytes of `src` into `dst[offset : offset + nbytes]` (`dst`: a writable buffer, or bytes
        fresh from `new_bytes` that no one else has seen). Leave `dst` alone until `wait()`."""
        self._copy(_writable_u8(dst), offset, _source_u8(src))

    def message(self, prefix: bytes, payload: Source) -> bytes:
        """`prefix + payload` as one new bytes object, the payload copied once (complete after `wait()`)."""
        source = _source_u8(payload)
        if source.size < self._inline_bytes:
            return b"".join((prefix, source))  # tiny: one copy on this thread is the cheapest
        out = new_bytes(len(prefix) + source.size)
        target = _writable_u8(out)
        target[: len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
        self._copy(target, len(prefix), source)
        return out

    def _copy(self, target: np.ndarray, offset: int, source: np.ndarray) -> None:
        """target[offset : offset + source.size] = source: inline when tiny, else split_plan's pieces on the pool."""
        if offset < 0 or offset + source.size > target.size:
            raise ValueError(f"{source.size} bytes at offset {offset} do not fit in {target.size}")
        if source.size < self._inline_bytes:
            np.copyto(target[offset : offset + source.size], source)
            return
        for start, stop in split_plan(source.size, self._threads, self._min_piece):
            piece = _Piece(target[offset + start : offset + stop], source[start:stop])
            _POOL.submit(piece.run)  # its future is not needed: the piece reports its own completion
            self._pending.append(piece)

    def wait(self) -> None:
        """Block until every copy issued so far is done; re-raise the first copy error, if any.

        The calling thread copies the pieces no pool thread has started yet (newest first, while the pool works
        from the oldest), so a request progresses even when the shared pool is busy with other requests' pieces."""
        pending, self._pending = self._pending, []
        for piece in reversed(pending):
            piece.run()
        for piece in pending:  # all done before any error is raised: no thread may still write when we return
            piece.join()
        for piece in pending:
            piece.result()

    def __enter__(self) -> HostCopies:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Wait even on an error, without raising a second one: no pool thread may still write once we leave.
        if exc_type is None:
            self.wait()
        else:
            pending, self._pending = self._pending, []
            for piece in pending:
                piece.cancel()
            for piece in pending:
                piece.join()


def copy_into(dst: Buffer, offset: int, src: Source) -> None:
    """`HostCopies.copy_into` for one copy, done when this returns."""
    with HostCopies() as copies:
        copies.copy_into(dst, offset, src)


def concat_bytes(prefix: bytes, payload: Source) -> bytes:
    """`prefix + payload` as one bytes object, the payload copied once (in parallel when large): the one-shot
    form of `HostCopies.message`."""
    with HostCopies() as copies:
        return copies.message(prefix, payload)
