"""The run step: one runner submission per request, written into the request's destination
(a transport's, chosen by service/pipeline/delivery.py), bounded by its deadline on both sides of the device."""

from __future__ import annotations

import asyncio
import time

import torch

from mmproc.errors import DeadlineExceededError
from mmproc.runner import Runner
from mmproc.transport.producer import Destination
from mmproc.types import PreprocessedImage
from service.observe.metrics import Metrics


def count_dropped(metrics: Metrics, stage: str, images: int) -> None:
    """Images of expired or cancelled requests dropped unencoded (or undelivered), by stage. Any thread."""
    metrics.dropped_images.labels(stage).inc(images)


class ForwardStep:
    def __init__(self, runner: Runner, metrics: Metrics) -> None:
        self.runner = runner
        self._metrics = metrics

    async def __call__(
        self,
        prepared: list[PreprocessedImage],
        deadline: float | None,
        request_id: str,
        destination: Destination,
    ) -> list[torch.Tensor]:
        """The request's embeddings, each (num_tokens, hidden) on the device; abandons the destination on failure."""
        try:
            return await self._run(prepared, deadline, request_id, destination)
        except BaseException:
            destination.abandon()
            raise

    async def _run(
        self,
        prepared: list[PreprocessedImage],
        deadline: float | None,
        request_id: str,
        destination: Destination,
    ) -> list[torch.Tensor]:
        output, on_written = destination.output(), destination.on_written()
        if deadline is not None and time.monotonic() >= deadline:  # before batching: never queued
            count_dropped(self._metrics, "batching", len(prepared))
            raise DeadlineExceededError(f"request {request_id}: deadline passed before it reached the encoder")
        future = self.runner.submit(prepared, deadline, output=output, on_written=on_written)
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            embeddings = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
            await destination.written()
        except asyncio.TimeoutError:
            raise DeadlineExceededError(f"request {request_id} did not finish before its deadline") from None
        if deadline is not None and time.monotonic() >= deadline:  # before delivery: nobody waits for it
            count_dropped(self._metrics, "delivery", len(prepared))
            raise DeadlineExceededError(f"request {request_id} finished after its deadline; not delivered")
        return embeddings
