"""Decode tasks that misbehave on purpose, for fault tests of `service/pipeline/decode/pool.py`.

Top-level functions so that a process worker can import them by name; each behaves like
`service.pipeline.decode.worker.prepare_image` except on its magic input.
"""

from __future__ import annotations

import os
import signal
import time

from mmproc.errors import InvalidMediaError, Reason
from mmproc.media import MediaLimits
from mmproc.preprocess import PreprocessConfig
from service.pipeline.decode.worker import Prepared, prepare_image

CRASH = b"CRASH-THE-DECODER"  # SIGKILL the worker (stands in for a segfault in a C decoder)
SEGV = b"SEGFAULT-THE-DECODER"  # a real SIGSEGV
HANG = b"HANG-THE-DECODER"  # wait forever without using CPU (a decoder stuck on something)
BUSY = b"BUSY-THE-DECODER"  # burn CPU forever in Python (a slow decoder that returns to Python now and then)
SPIN = b"SPIN-IN-C-THE-DECODER"  # burn CPU with the budget timer blocked (a C decoder that never returns)
BALLOON = b"ALLOCATE-TOO-MUCH"  # allocate far past the worker's memory budget
SLOW = b"SLOW-THE-DECODER:"  # take 0.2 s, then decode the image that follows the magic
HOLD = b"HOLD-300-MB-THEN-FAIL"  # fail, chained, from a frame that holds 300 MB (a decoder failing late)
LEAK = b"LEAK-300-MB"  # keep 300 MB for good (a decoder that leaks), then decode normally
NO_ROOM = b"TORCH-CANNOT-ALLOCATE"  # torch's allocator RuntimeError
LAZY_IMPORT = b"LAZY-IMPORT-FAILS"  # an import a library does lazily fails (under the address-space cap)
BURN = b"BURN-0.2-S-OF-CPU:"  # use 0.2 s of CPU time, then decode the image that follows the magic
SLOW_TAIL = b"SLOW-AFTER-IEND"  # at the end of a real image (its header still sizes it): take 0.3 s first
_LEAKED: list = []


def misbehaving_task(data: bytes, limits: MediaLimits, config: PreprocessConfig) -> Prepared:
    if data.startswith(CRASH):
        os.kill(os.getpid(), signal.SIGKILL)
    if data.startswith(SEGV):
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    if data.startswith(HANG):
        while True:
            time.sleep(0.01)
    if data.startswith(BUSY):
        while True:
            pass
    if data.startswith(SPIN):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGVTALRM})  # as deaf to the budget as a C loop
        while True:
            pass
    if data.startswith(BURN):
        until = time.process_time() + 0.2
        while time.process_time() < until:
            pass
        data = data[len(BURN) :]
    if data.endswith(SLOW_TAIL):
        time.sleep(0.3)
    if data.startswith(SLOW):
        time.sleep(0.2)
        data = data[len(SLOW) :]
    if data.startswith(HOLD):
        held = bytearray(300 << 20)
        held[::4096] = b"x" * len(held[::4096])  # touched: resident
        try:
            raise OSError("broken data stream")
        except OSError as exc:
            raise InvalidMediaError("could not be decoded", reason=Reason.UNDECODABLE) from exc
    if data.startswith(LEAK):
        _LEAKED.append(bytearray(300 << 20))
        _LEAKED[-1][::4096] = b"x" * len(_LEAKED[-1][::4096])
        data = data[len(LEAK) :]
    if data.startswith(NO_ROOM):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
    if data.startswith(LAZY_IMPORT):
        raise ImportError("cannot load library 'libfoo.so': cannot allocate memory in static TLS block")
    if data.startswith(BALLOON):
        hoard = bytearray(64 << 30)  # 64 GiB at once, far past any budget: refused at once, whatever the budget
        del hoard
    return prepare_image(data, limits, config)
