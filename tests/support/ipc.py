"""The IPC GPU tests' shared parts: a server on cuda:0 with the IPC transport, and consumer processes
(tests/support/ipc_consumer.py) that speak one JSON line per event."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.support.server import ServiceThread, test_settings


def start_ipc_server(**overrides: object) -> ServiceThread:
    # cache_ipc_mb=0: these tests watch the pool empty out after every read (tests/transport/test_ipc_cache_gpu.py: the cache)
    settings = dict(device="cuda:0", dtype="bfloat16", transport="ipc", http_address="", ipc_pool_mb=8, cache_ipc_mb=0)
    settings.update(overrides)
    return ServiceThread(test_settings(**settings)).start()


def consumer(mode: str, target: str, *args: str, **env: str) -> subprocess.Popen:
    """A `tests.support.ipc_consumer` process (`env`: extra variables, e.g. CUDA_VISIBLE_DEVICES)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.ipc_consumer", mode, target, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
    )


def next_event(proc: subprocess.Popen, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("{"):
            return json.loads(line)
        if not line and proc.poll() is not None:
            raise AssertionError(f"consumer exited {proc.returncode}: {proc.stderr.read()[-3000:]}")
    raise TimeoutError("consumer said nothing")


def pool_stats(srv: ServiceThread):
    return srv.service.pipeline.pool.stats()
