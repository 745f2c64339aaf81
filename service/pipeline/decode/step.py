"""The decode step: a request's bytes through the decode pool (isolated workers, service/pipeline/decode/pool.py),
its JPEGs on the GPU when there is a GPU decoder (service/pipeline/decode/gpu.py), its stage times observed, its
queue reservation given back however it ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

from mmproc.errors import DeadlineExceededError, ResourceExhaustedError
from mmproc.types import PreprocessedImage, PreprocessedVideo
from service.observe.metrics import Metrics
from service.pipeline.admission import Admission, Admitted
from service.pipeline.decode.gpu import GpuDecoder, decode_split
from service.pipeline.decode.pool import DecodePool, VideoJob
from service.pipeline.forward_step import count_dropped
from service.pipeline.overload import MIN_RETRY_AFTER_S, Ticket

T = TypeVar("T")


class DecodeStep:
    """`pool` is public: a test may put a pool of misbehaving workers in its place (tests/service/pipeline/test_faults.py)."""

    def __init__(self, pool: DecodePool, admission: Admission, metrics: Metrics, gpu: GpuDecoder | None = None) -> None:
        self.pool = pool
        self.gpu = gpu
        self._admission = admission
        self._metrics = metrics

    async def images(self, images: list[bytes], deadline: float | None, admitted: Admitted) -> list[PreprocessedImage]:
        try:
            paths = self._metrics.decode_paths
            if self.gpu is None:
                results = await sheddable(self.pool.prepare_all(images, deadline), admitted.ticket)
                paths.labels("cpu").inc(len(results))  # the first bad image, by position
            else:
                results = await decode_split(self.gpu, images, self.pool.prepare_all, deadline, paths)
        except DeadlineExceededError:
            count_dropped(self._metrics, "decode", len(images))
            raise
        finally:
            self._admission.unreserve(admitted)
        decode, preprocess = self._metrics.stage("decode"), self._metrics.stage("preprocess")
        for result in results:
            decode.observe(result.decode_s)
            preprocess.observe(result.preprocess_s)
        return [result.image for result in results]

    async def videos(self, jobs: list[VideoJob], deadline: float | None) -> list[PreprocessedVideo]:
        started = time.perf_counter()
        shipped = await self.pool.prepare_videos(jobs, deadline)
        self._metrics.stage("decode").observe(time.perf_counter() - started)
        return [s.to_video() for s in shipped]


async def sheddable(decode: Awaitable[T], ticket: Ticket) -> T:
    """`decode`, ended by the door when it sheds this request for newcomers (OverloadGuard._shed_dominant): then
    RESOURCE_EXHAUSTED (429) with the reason, its images not yet in a worker dropped."""
    task = asyncio.ensure_future(decode)
    loop = asyncio.get_running_loop()
    ticket.on_shed = lambda: loop.call_soon_threadsafe(task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if ticket.shed and (current is None or not current.cancelling()):
            raise ResourceExhaustedError(
                "shed: this request's images held the decoders while other requests waited; send fewer or smaller "
                "images at a time",
                retry_after_s=MIN_RETRY_AFTER_S * 20,
                cause="shed",
            ) from None
        raise
    finally:
        ticket.on_shed = None
