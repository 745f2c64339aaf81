"""What runs inside an isolated decode worker process (see `service/pipeline/decode/pool.py`).

The parent hands a worker raw bytes plus the frozen limits/config and gets back plain data: the patches as a
numpy array (through a tmpfs file when large, see `decode_transfer`), the grid and the token count; never a
tensor or an image object. Nothing here touches gRPC; the module is preloaded by the forkserver, so forking a
worker costs no imports.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
import resource
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
from PIL import Image

from mmproc.errors import InvalidMediaError, Reason
from mmproc.media import MediaLimits, decode_image, sniff_format
from mmproc.media.formats import peek_size
from mmproc.preprocess import RULES, PreprocessConfig, preprocess_image
from mmproc.types import PreprocessedImage
from service.observe.logs import configure_logging, request_context
from service.pipeline.decode.transfer import Shipped, ship

_PAGE = os.sysconf("SC_PAGE_SIZE")
# Pillow imports its format plugins (and libwebp) on the first open of a format outside its five "preinit" ones;
# done here, in the forkserver that preloads this module, so that no worker pays it inside an image's budget.
Image.init()
MEMORY_EXIT_CODE = 75  # a worker that ran out of its memory budget exits with this (see run_task)
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None)
_MALLOC_TRIM = getattr(_LIBC, "malloc_trim", None)  # glibc only
_STARTUP_RSS = [0]  # this worker's resident size once started (init_worker); a process of its own per worker


class Prepared(NamedTuple):
    """A worker's result: the image plus its own stage timings (plain floats, so that the work may move to
    a process pool and the timings still come back with the result)."""

    image: PreprocessedImage
    decode_s: float  # validate + decode
    preprocess_s: float


@dataclass(frozen=True)
class DecodeBudget:
    """CPU time one image may use in a worker: `base_s` + `per_megapixel_s` per declared megapixel (from the
    header peek; an image it cannot size gets `base_s`), at most `cap_s`, which also caps its wall-clock time.
    CPU time, not wall time: a loaded machine slows every image down but never turns a good one into a refusal."""

    base_s: float = 0.5
    per_megapixel_s: float = 0.2
    cap_s: float = 30.0
    granted_s: float | None = None  # what the request's budget granted this image, when less (request_budget.py)

    def seconds(self, pixels: int) -> float:
        own = min(self.cap_s, self.base_s + self.per_megapixel_s * pixels / 1e6)
        return own if self.granted_s is None else min(own, self.granted_s)

    def for_image(self, data: bytes) -> float:
        return self.seconds(declared_pixels(data))


def declared_pixels(data: bytes) -> int:
    """Width x height from the image's header peek; 0 when it does not say."""
    fmt = sniff_format(data)
    size = None if fmt is None else peek_size(fmt, data)
    return 0 if size is None else max(0, size[0]) * max(0, size[1])


class _OverBudget(BaseException):
    """Raised into the task by the budget alarm. A BaseException, so that no decoder's `except Exception`
    (nor our own Pillow error mapping) can swallow it."""


def _on_budget_alarm(signum: int, frame: object) -> None:
    raise _OverBudget


def prepare_image(data: bytes, limits: MediaLimits, config: PreprocessConfig, normalize: bool = True) -> Prepared:
    """Validate, decode and preprocess one image (in a decode thread or a decode worker process)."""
    started = time.perf_counter()
    decoded = decode_image(data, limits, keep_alpha=RULES[config.family].keeps_alpha).image
    decoded_at = time.perf_counter()
    image = preprocess_image(decoded, config, normalize=normalize)
    return Prepared(image, decoded_at - started, time.perf_counter() - decoded_at)


def prepare_image_bytes(data: bytes, limits: MediaLimits, config: PreprocessConfig) -> Prepared:
    """`prepare_image` leaving the normalization to the device: uint8 patches and their table (CUDA encoders)."""
    return prepare_image(data, limits, config, normalize=False)


def address_space_bytes() -> int:
    """This process's current virtual size (what RLIMIT_AS counts), from /proc/self/statm."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * _PAGE


def init_worker(memory_budget_bytes: int, log_level: str, log_json: bool) -> None:
    """Process initializer: cap the address space at what start-up mapped plus the decode budget.

    A decoder that tries to allocate past the cap gets a MemoryError (reported as that image's fault) instead
    of growing until the host's OOM killer picks a victim. Core dumps are off (a crash is expected handling,
    not a debugging event) and SIGINT is ignored: the parent decides when workers stop. Logs go to the
    inherited stderr in the server's format, each line naming the request it decodes for.
    """
    configure_logging(log_level, log_json, background=False)  # rare lines; a worker may end without exiting
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGVTALRM, _on_budget_alarm)  # see run_task
    signal.signal(signal.SIGPROF, signal.SIG_DFL)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    torch.set_num_threads(1)  # the worker calls no torch kernels; keep an intra-op pool from ever spawning
    # The imports' objects out of the garbage collector's scans: a full pass over them (~0.1 s) inside a task
    # would count against that image's CPU budget (service/observe/gc_pauses.py).
    gc.freeze()
    _STARTUP_RSS[0] = resident_bytes(os.getpid())
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_budget_bytes > 0:
        cap = address_space_bytes() + memory_budget_bytes
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def run_task(
    task: Callable[[bytes, MediaLimits, PreprocessConfig], Prepared],
    budget: DecodeBudget,
    out_dir: str | None,
    request_id: str,
    data: bytes,
    limits: MediaLimits,
    config: PreprocessConfig,
) -> Shipped:
    """The worker's entry point: `task` within the image's time budget, its patches shipped back (`decode_transfer`).

    Three timers. The budget (user CPU time, SIGVTALRM) raises into the task at its next Python bytecode
    (Pillow's decoders return to Python between input chunks; its RLE/BMP decoder is Python): a 400
    DECODE_TIME, after which the pool retires this worker. The kernel ends the worker, with no Python involved
    (the default actions of SIGPROF and SIGALRM), when a C loop that never returns to Python has used
    budget + max(1 s, budget) of CPU time, or when the task has taken `cap_s` of wall-clock time (a decoder
    stuck without using CPU): the parent sees a dead worker, exactly as for a crash or running out of memory.
    """
    seconds = budget.for_image(data)
    error: BaseException | None = None
    started = time.process_time()
    try:
        with request_context(request_id), cpu_budget(seconds, seconds + max(1.0, seconds), budget.cap_s, "image"):
            prepared = task(data, limits, config)
        image = prepared.image
        lut = None if image.lut is None else image.lut.numpy()
        shipped = ship(
            image.patches.numpy(), image.grid_hw, image.num_tokens, out_dir, prepared[1:], image.image_size, lut
        )
        shipped.cpu_s = time.process_time() - started
        return shipped
    except BaseException as exc:  # noqa: BLE001 - every error leaves, detached, below
        error = detached(out_of_room(exc))
    finally:
        release_memory(error is not None)
    raise error


def out_of_room(exc: BaseException) -> BaseException:
    """An allocator's failure inside a media task as the media's fault (400 UNDECODABLE), never a 500: torch's
    `RuntimeError: ... can't allocate memory`, and an import a library does lazily that failed under the
    address-space cap (the forkserver preloads what it can)."""
    text = str(exc).lower() if isinstance(exc, RuntimeError | ImportError) else ""
    if isinstance(exc, ImportError) or "alloc" in text or "memory" in text:
        return InvalidMediaError("the decoder ran out of room on this item", reason=Reason.UNDECODABLE)
    return exc


def detached(exc: BaseException) -> BaseException:
    """`exc` without its traceback, cause and context: their frames hold the task's decoded pixels, and
    concurrent.futures keeps the exception a task raised until that worker's next task fails."""
    exc.__traceback__ = exc.__cause__ = exc.__context__ = None
    exc.__suppress_context__ = True
    return exc


TRIM_ABOVE = 64 << 20  # resident bytes over the worker's size at start-up that a trim gives back


def release_memory(failed: bool) -> None:
    """After a task: collect what a failure's frames left in cycles, and give freed heap back to the kernel when
    the worker stayed TRIM_ABOVE over its start-up size (glibc otherwise keeps a freed raster in its arenas, and
    the worker's RSS at rest stays at its peak). Not after every image: the next one would fault its pages in
    again (a 1024x768 JPEG took 29 ms, 38 ms with a trim after each)."""
    if failed:
        gc.collect()
    if _MALLOC_TRIM is not None and resident_bytes(os.getpid()) > _STARTUP_RSS[0] + TRIM_ABOVE:
        _MALLOC_TRIM(0)


def resident_bytes(pid: int) -> int:
    """A process's resident set size, from /proc/PID/statm (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


@contextlib.contextmanager
def cpu_budget(seconds: float, kill_cpu_s: float, cap_s: float, what: str) -> Iterator[None]:
    """Run the body under the three timers of `run_task`: `seconds` of user CPU time (then DECODE_TIME, at the
    next bytecode), `kill_cpu_s` of CPU time or `cap_s` of wall-clock time (then the kernel ends the worker).
    Out of the address-space budget the worker exits (MEMORY_EXIT_CODE): the pool retries the item alone."""
    timers = ((signal.ITIMER_REAL, cap_s), (signal.ITIMER_PROF, kill_cpu_s), (signal.ITIMER_VIRTUAL, seconds))
    try:
        try:
            for timer, after in timers:
                signal.setitimer(timer, after)
            yield
        finally:
            for timer, _ in reversed(timers):
                signal.setitimer(timer, 0)
    except _OverBudget:
        raise InvalidMediaError(
            f"decoding used more than this {what}'s budget of {seconds:.2f} s of CPU time", reason=Reason.DECODE_TIME
        ) from None
    except MemoryError:
        # Die rather than report it: the parent then treats it like a crash and retries the item alone in a
        # fresh worker, so that only an item that needs too much memory by itself is refused (not an innocent
        # one that met a worker worn by earlier work).
        os._exit(MEMORY_EXIT_CODE)


def warm_up() -> int:
    """A no-op task that makes the executor start a worker; returns the worker's pid."""
    return os.getpid()
