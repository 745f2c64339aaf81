"""What runs inside an isolated decode worker process (see `service/decode_pool.py`).

The parent hands a worker raw bytes plus the frozen limits/config and gets back plain data: the patches as a
numpy array (through a tmpfs file when large, see `decode_transfer`), the grid and the token count; never a
tensor or an image object. Nothing here touches gRPC; the module is preloaded by the forkserver, so forking a
worker costs no imports.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from mmproc.media import MediaLimits, decode_image
from mmproc.preprocess import RULES, PreprocessConfig, preprocess_image
from mmproc.types import PreprocessedImage
from service.decode_transfer import Shipped, ship
from service.logs import configure_logging, request_context

_PAGE = os.sysconf("SC_PAGE_SIZE")
MEMORY_EXIT_CODE = 75  # a worker that ran out of its memory budget exits with this (see run_task)


class Prepared(NamedTuple):
    """A worker's result: the image plus its own stage timings (plain floats, so that the work may move to
    a process pool and the timings still come back with the result)."""

    image: PreprocessedImage
    decode_s: float  # validate + decode
    preprocess_s: float


def prepare_image(data: bytes, limits: MediaLimits, config: PreprocessConfig) -> Prepared:
    """Validate, decode and preprocess one image (in a decode thread or a decode worker process)."""
    started = time.perf_counter()
    decoded = decode_image(data, limits, keep_alpha=RULES[config.family].keeps_alpha).image
    decoded_at = time.perf_counter()
    image = preprocess_image(decoded, config)
    return Prepared(image, decoded_at - started, time.perf_counter() - decoded_at)


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
    configure_logging(log_level, log_json)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # see run_task
    torch.set_num_threads(1)  # the worker calls no torch kernels; keep an intra-op pool from ever spawning
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_budget_bytes > 0:
        cap = address_space_bytes() + memory_budget_bytes
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def run_task(
    task: Callable[[bytes, MediaLimits, PreprocessConfig], Prepared],
    alarm_s: float,
    out_dir: str | None,
    request_id: str,
    data: bytes,
    limits: MediaLimits,
    config: PreprocessConfig,
) -> Shipped:
    """The worker's entry point: `task` under a real-time alarm, its patches shipped back (`decode_transfer`).

    Past `alarm_s` the kernel ends this worker (SIGALRM's default action needs no Python, so it works while a
    C decoder spins); the parent sees a dead worker, exactly as for a crash, or for running out of memory.
    """
    signal.setitimer(signal.ITIMER_REAL, alarm_s)
    try:
        with request_context(request_id):
            prepared = task(data, limits, config)
    except MemoryError:
        # Out of the RLIMIT_AS budget. Die rather than report it: the parent then treats it like a crash and
        # retries the image alone in a fresh worker, so that only an image that needs too much memory by
        # itself is refused (not an innocent one that met a worker worn by earlier work).
        os._exit(MEMORY_EXIT_CODE)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    image = prepared.image
    return ship(image.patches.numpy(), image.grid_hw, image.num_tokens, out_dir, prepared[1:], image.image_size)


def warm_up() -> int:
    """A no-op task that makes the executor start a worker; returns the worker's pid."""
    return os.getpid()
