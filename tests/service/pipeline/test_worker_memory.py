"""Decode workers return to their idle size: a failed task's memory is not kept (its error crosses the process
boundary without frames), a worker that stays big after a task is replaced, and an allocator's failure in a media
task is a 400, never a 500 (issue 47, item 9)."""

from __future__ import annotations

import asyncio

import pytest

from mmproc.errors import InvalidMediaError
from mmproc.media import MediaLimits
from mmproc.preprocess import PreprocessConfig
from mmproc.units import MiB
from service.pipeline.decode.pool import DecodePool, DecodePoolConfig
from service.pipeline.decode.worker import resident_bytes
from tests.support.common import wait_until
from tests.support.decode_faults import HOLD, LAZY_IMPORT, LEAK, NO_ROOM, misbehaving_task
from tests.support.media_samples import make_image_bytes

LIMITS, CONFIG = MediaLimits(), PreprocessConfig.kimi_vl()
GOOD = make_image_bytes(64, 64, fmt="PNG")


def one_worker(recycle_mb: int) -> DecodePool:
    config = DecodePoolConfig(workers=1, worker_memory_mb=1024, worker_recycle_mb=recycle_mb, timeout_s=20)
    pool = DecodePool(LIMITS, CONFIG, config, task=misbehaving_task)
    pool.start()
    return pool


def run(pool: DecodePool, data: bytes):
    return asyncio.run(pool.prepare_all([data]))


def test_a_failed_tasks_memory_goes_back() -> None:
    pool = one_worker(recycle_mb=0)  # no recycling: the memory must go back by itself
    try:
        run(pool, GOOD)
        (pid,) = pool.worker_pids()
        idle = resident_bytes(pid)
        for _ in range(3):
            with pytest.raises(InvalidMediaError) as refused:
                run(pool, HOLD)
            assert refused.value.reason == "undecodable" and refused.value.__cause__ is None
        run(pool, GOOD)
        assert pool.worker_pids() == [pid]  # the same worker: nothing was recycled
        grown = (resident_bytes(pid) - idle) / MiB
        assert grown < 100, f"the worker kept {grown:.0f} MB after three failed 300 MB tasks"
    finally:
        pool.close()


def test_a_worker_that_stays_big_is_replaced() -> None:
    pool = one_worker(recycle_mb=400)  # an idle worker holds ~150 MB; the leak adds 300
    try:
        (pid,) = pool.worker_pids()
        run(pool, LEAK + GOOD)  # served, then the worker is retired in the background
        assert wait_until(lambda: pool.retired == 1 and pid not in pool.worker_pids(), 60, interval=0.05)
        run(pool, GOOD)
        (fresh,) = pool.worker_pids()
        assert resident_bytes(fresh) < 400 * MiB
    finally:
        pool.close()


@pytest.mark.parametrize("magic", [NO_ROOM, LAZY_IMPORT], ids=["torch-allocator", "lazy-import"])
def test_running_out_of_room_in_a_media_task_is_a_400(magic) -> None:
    pool = one_worker(recycle_mb=0)
    try:
        with pytest.raises(InvalidMediaError) as refused:
            run(pool, magic)
        assert refused.value.reason == "undecodable"
        assert len(run(pool, GOOD)) == 1
    finally:
        pool.close()
