"""Decode tasks that misbehave on purpose, for fault tests of `service/pipeline/decode/pool.py`.

Top-level functions so that a process worker can import them by name; each behaves like
`service.pipeline.decode.worker.prepare_image` except on its magic input.
"""

from __future__ import annotations

import os
import signal
import time

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
    if data.startswith(SLOW):
        time.sleep(0.2)
        data = data[len(SLOW) :]
    if data.startswith(BALLOON):
        hoard = bytearray(64 << 30)  # 64 GiB at once, far past any budget: refused at once, whatever the budget
        del hoard
    return prepare_image(data, limits, config)
