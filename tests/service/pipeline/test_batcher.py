"""`Batcher` (service/pipeline/decode/batcher.py): what queues while the thread works runs in its next batch, up to
the bound; an error reaches every caller of its batch; a cancelled caller's job is not run; the queue's wait is
measured."""

from __future__ import annotations

import asyncio
import threading

import pytest

from service.pipeline.decode.batcher import Batcher


def test_jobs_queued_while_the_thread_works_share_its_next_batch_up_to_the_bound() -> None:
    release = threading.Event()
    batches: list[list[str]] = []

    def run(jobs: list[str]) -> list[str]:
        batches.append(jobs)
        if jobs == ["first"]:
            release.wait(5)  # busy: the others queue meanwhile
        return [job.upper() for job in jobs]

    worker = Batcher(run, max_size=4, name="test-batches")

    async def main() -> list[str]:
        first = asyncio.ensure_future(worker.submit("first"))
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(worker.submit(name, size)) for name, size in [("a", 2), ("b", 2), ("c", 1)]]
        await asyncio.sleep(0.1)
        assert worker.waits.oldest_s() >= 0.05  # three jobs wait for the thread
        release.set()
        return await asyncio.gather(first, *rest)

    try:
        assert asyncio.run(main()) == ["FIRST", "A", "B", "C"]
    finally:
        worker.close()
    assert batches == [["first"], ["a", "b"], ["c"]]  # a + b fill the bound of 4; c runs next
    assert worker.waits.oldest_s() == 0


def test_an_error_reaches_every_caller_of_its_batch_and_a_cancelled_job_is_skipped() -> None:
    release = threading.Event()
    ran: list[list[str]] = []

    def run(jobs: list[str]) -> list[str]:
        ran.append(jobs)
        if jobs == ["hold"]:
            release.wait(5)
            return ["held"]
        raise RuntimeError("device lost")

    worker = Batcher(run, max_size=8, name="test-batches")

    async def main() -> None:
        hold = asyncio.ensure_future(worker.submit("hold"))
        await asyncio.sleep(0.05)
        gone = asyncio.ensure_future(worker.submit("gone"))
        failing = [asyncio.ensure_future(worker.submit(name)) for name in ("x", "y")]
        await asyncio.sleep(0.05)
        gone.cancel()
        release.set()
        assert await hold == "held"
        for job in failing:
            with pytest.raises(RuntimeError, match="device lost"):
                await job

    try:
        asyncio.run(main())
    finally:
        worker.close()
    assert ran == [["hold"], ["x", "y"]]
