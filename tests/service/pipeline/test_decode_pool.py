"""The decode pool (service/pipeline/decode/pool.py): process isolation, crash/hang/allocation containment, transfer."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest
import torch

from mmproc.errors import DeadlineExceededError, InvalidMediaError, UnavailableError
from mmproc.media import MediaLimits
from mmproc.preprocess import PreprocessConfig
from service.app.configs import decode_config
from service.pipeline.decode.pool import DecodePool, DecodePoolConfig, FairShare
from service.pipeline.decode.transfer import FILE_THRESHOLD
from service.pipeline.decode.worker import prepare_image
from tests.support.common import wait_until
from tests.support.decode_faults import BALLOON, BUSY, CRASH, HANG, SEGV, SLOW, SPIN, misbehaving_task
from tests.support.media_samples import make_image_bytes

LIMITS, CONFIG = MediaLimits(), PreprocessConfig.kimi_vl()
GOOD = [
    make_image_bytes(448, 448, fmt="PNG", seed=1),  # 1024 patches: 2.4 MB, through a tmpfs file
    make_image_bytes(30, 20, fmt="JPEG", seed=2),  # 4 patches: through the pipe
    make_image_bytes(97, 333, fmt="WEBP", seed=3),
]


@pytest.fixture(scope="module")
def pool() -> Iterator[DecodePool]:
    config = DecodePoolConfig(isolation="process", workers=2, worker_memory_mb=512, timeout_s=1.0)
    pool = DecodePool(LIMITS, CONFIG, config, task=misbehaving_task)
    pool.start()
    yield pool
    pool.close()


def run(coro):
    return asyncio.run(coro)


def reasons(results: list) -> list[str]:
    return [r.reason if isinstance(r, InvalidMediaError) else type(r).__name__ for r in results]


def test_process_results_equal_thread_results_bit_for_bit(pool: DecodePool) -> None:
    got = run(pool.prepare_all(GOOD))
    for data, prepared in zip(GOOD, got):
        want = prepare_image(data, LIMITS, CONFIG).image
        assert prepared.image.grid_hw == want.grid_hw and prepared.image.num_tokens == want.num_tokens
        assert prepared.image.patches.dtype == torch.float32 and prepared.image.patches.is_contiguous()
        assert torch.equal(prepared.image.patches, want.patches)
        assert prepared.decode_s > 0 and prepared.preprocess_s > 0
    assert got[0].image.patches.numel() * 4 >= FILE_THRESHOLD > got[1].image.patches.numel() * 4
    got[0].image.patches.add_(1.0)  # the mapping is private and writable: no warnings, no shared writes


def test_no_transfer_file_outlives_its_request(pool: DecodePool) -> None:
    run(pool.prepare_all(GOOD * 3))
    assert os.listdir(pool.transfer_dir) == []


@pytest.mark.parametrize(
    "poison",
    [CRASH, SEGV, HANG, BUSY, SPIN, BALLOON],
    ids=["sigkill", "sigsegv", "hang", "busy", "spin-in-c", "balloon"],
)
def test_a_poisoned_image_is_refused_and_its_neighbours_are_unaffected(pool: DecodePool, poison: bytes) -> None:
    crashes, retired = pool.crashes, pool.retired
    # A decode that uses more CPU than its budget is interrupted (decode_time) and its workers retired; one that
    # cannot be (a C loop), hangs past the wall-clock cap, crashes or runs out of memory kills its worker:
    # retried alone, then undecodable.
    reason = "decode_time" if poison == BUSY else "undecodable"

    async def burst() -> list:
        return await asyncio.gather(
            pool.prepare_all(GOOD),
            pool.prepare_all([GOOD[1], poison + b"\x00" * 16, GOOD[2]]),
            pool.prepare_all(GOOD[::-1]),
            return_exceptions=True,
        )

    started = time.monotonic()
    first, poisoned, last = run(burst())
    assert time.monotonic() - started < 10
    assert isinstance(poisoned, InvalidMediaError), poisoned
    assert (poisoned.reason, poisoned.index) == (reason, 1)
    assert len(first) == 3 and len(last) == 3  # innocent images caught in the crash were retried alone
    for prepared, data in zip(first, GOOD):
        assert torch.equal(prepared.image.patches, prepare_image(data, LIMITS, CONFIG).image.patches)
    if poison == BUSY:  # the worn workers are replaced by a background thread once fresh ones are warm
        assert wait_until(lambda: pool.retired == retired + 1, timeout=60), pool.retired
        assert pool.crashes == crashes
    else:
        assert pool.crashes == crashes + 1  # out of memory, too: the worker exits and the image is retried alone
    assert len(run(pool.prepare_all(GOOD))) == 3  # the replaced pool serves
    assert len(pool.worker_pids()) >= 1


def test_the_lowest_indexed_bad_image_is_reported(pool: DecodePool) -> None:
    images = [GOOD[0], b"", GOOD[1], b"not an image", b"\x89PNG\r\n\x1a\n"]
    with pytest.raises(InvalidMediaError) as info:
        run(pool.prepare_all(images))
    assert (info.value.index, info.value.reason) == (1, "empty")


def test_deadline_ends_the_wait(pool: DecodePool) -> None:
    with pytest.raises(DeadlineExceededError):
        run(pool.prepare_all([HANG], deadline=time.monotonic() + 0.05))


def test_thread_mode_gives_the_same_answers() -> None:
    threads = DecodePool(LIMITS, CONFIG, DecodePoolConfig(isolation="thread", workers=2))
    try:
        got = run(threads.prepare_all(GOOD))
        for data, prepared in zip(GOOD, got):
            assert torch.equal(prepared.image.patches, prepare_image(data, LIMITS, CONFIG).image.patches)
        with pytest.raises(InvalidMediaError) as info:
            run(threads.prepare_all([GOOD[0], b"GIF89a"]))
        assert info.value.index == 1
    finally:
        threads.close()
    with pytest.raises(UnavailableError):
        run(threads.prepare_all(GOOD))


def test_closed_pool_refuses_and_removes_its_transfer_directory() -> None:
    pool = DecodePool(LIMITS, CONFIG, DecodePoolConfig(workers=1))
    assert pool.transfer_dir is None  # nothing on /dev/shm until the pool is used
    pool.start()
    directory = pool.transfer_dir
    assert directory is not None and os.path.isdir(directory)
    assert oct(os.stat(directory).st_mode & 0o777) == "0o700"
    pool.close()
    assert not os.path.exists(directory)
    with pytest.raises(UnavailableError):
        run(pool.prepare_all(GOOD))


def test_worker_memory_budget_follows_max_pixels() -> None:
    from tests.support.server import test_settings

    assert decode_config(test_settings()).worker_memory_mb == (24 * 40_000_000) // (1 << 20) + 128
    assert decode_config(test_settings(max_pixels=80_000_000)).worker_memory_mb > 1900
    assert decode_config(test_settings(decode_worker_memory_mb=0)).worker_memory_mb == 0


def test_fair_share_hands_slots_out_round_robin_by_request() -> None:
    order: list[str] = []

    async def one(share: FairShare, key: str, name: str) -> None:
        async with share.slot(key):
            order.append(name)
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        share = FairShare(1)
        names = [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("c", "c1"), ("c", "c2")]
        tasks = [asyncio.ensure_future(one(share, key, name)) for key, name in names]
        tasks.append(asyncio.ensure_future(one(share, "d", "d1")))
        await asyncio.sleep(0)
        tasks[-1].cancel()  # a waiter that gives up leaves no hole
        await asyncio.gather(*tasks, return_exceptions=True)
        assert share.free == 1 and share.waiting == 0

    run(scenario())
    assert order == ["a1", "a2", "b1", "c1", "a3", "c2"]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_long_request_cannot_starve_a_short_one(isolation: str) -> None:
    # One worker; request A has 10 slow images, B (arriving later) one: B's image gets the next free slot in
    # turn and is done while A still decodes (first come, first served would put B behind all of A).
    pool = DecodePool(LIMITS, CONFIG, DecodePoolConfig(isolation=isolation, workers=1), task=misbehaving_task)
    pool.start()

    async def scenario() -> tuple[bool, int]:
        a = asyncio.ensure_future(pool.prepare_all([SLOW + GOOD[1]] * 10))
        await asyncio.sleep(0.05)  # A's first image is decoding, the other nine wait for the slot
        b = await pool.prepare_all([GOOD[1]])
        a_still_running = not a.done()
        return a_still_running, len(b) + len(await a)

    try:
        assert run(scenario()) == (True, 11)
    finally:
        pool.close()
