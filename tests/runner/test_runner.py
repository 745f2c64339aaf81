"""Dynamic batching: FIFO packing under the patch budget, bounded queue, deadlines, cancellation, failures."""

from __future__ import annotations

import functools
import threading
import time

import pytest
import torch

from mmproc.batching import pack_images
from mmproc.errors import ConfigError, DeadlineExceededError, ResourceExhaustedError
from mmproc.models import VisionEncoder, load_encoder
from mmproc.runner import BatchStats, Runner, RunnerConfig
from mmproc.types import PackedBatch, PreprocessedImage
from tests.support.preprocessed import constant_image


@functools.cache
def tiny_encoder() -> VisionEncoder:
    """The real tiny encoder, built on first use (not at import) and shared by the module's tests."""
    return load_encoder(None, preset="tiny")


def alone(img: PreprocessedImage) -> torch.Tensor:
    """The image encoded on its own: what the runner must return for it, however it was batched."""
    with torch.inference_mode():
        return tiny_encoder()(pack_images([img]))


class RecordingTower:
    """The real tiny encoder, plus what the scheduling tests need to see: the batches it ran (images are
    filled with a constant that identifies them), a gate that holds the worker, and one injected failure."""

    @property
    def device(self) -> torch.device:
        return tiny_encoder().device

    @property
    def dtype(self) -> torch.dtype:
        return tiny_encoder().dtype

    @property
    def output_dim(self) -> int:
        return tiny_encoder().output_dim

    def __init__(self, gate: threading.Event | None = None, fail_on: float | None = None) -> None:
        self.batches: list[PackedBatch] = []
        self.gate = gate
        self.fail_on = fail_on

    def __call__(self, batch: PackedBatch, out: list[torch.Tensor]) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        self.batches.append(batch)
        if self.fail_on is not None and self.fail_on in image_ids(batch):
            raise RuntimeError("boom")
        tiny_encoder()(batch, out=out)


def image_ids(batch: PackedBatch) -> list[float]:
    starts = batch.cu_seqlens[:-1].tolist()
    return [batch.pixel_values[s, 0, 0, 0].item() for s in starts]


def make_runner(tower, **config) -> Runner:
    runner = Runner(tower, RunnerConfig(**config), max_patches_per_image=64)
    runner.start()
    return runner


def test_concurrent_requests_are_packed_fifo_under_the_budget() -> None:
    gate = threading.Event()
    tower = RecordingTower(gate)
    runner = make_runner(tower, max_batch_patches=64, max_wait_ms=50)
    blocker = runner.submit([constant_image(2, 2, -1.0)])  # occupies the worker until the gate opens
    time.sleep(0.1)
    requests = [[constant_image(4, 4, float(i)), constant_image(2, 2, i + 0.5)] for i in range(6)]
    futures = [runner.submit(r) for r in requests]
    gate.set()
    blocker.result(5)
    for request, future in zip(requests, futures):
        got = future.result(5)
        assert [t.shape for t in got] == [(4, 256), (1, 256)]
        for img, emb in zip(request, got):
            torch.testing.assert_close(emb, alone(img), rtol=1e-4, atol=1e-5)
    runner.stop()
    packed = tower.batches[1:]
    assert all(b.num_patches <= 64 for b in packed)
    assert len(packed) < 6, "concurrent requests should share forwards"
    order = [v for b in packed for v in image_ids(b)]
    assert order == sorted(order), "images must run in arrival order"


def test_full_queue_is_refused_at_once() -> None:
    gate = threading.Event()
    runner = make_runner(RecordingTower(gate), max_queued_images=3, max_wait_ms=0)
    runner.submit([constant_image(2, 2, 0.0)])
    time.sleep(0.05)  # the worker holds the first image
    runner.submit([constant_image(2, 2, 1.0)] * 3)
    started = time.monotonic()
    with pytest.raises(ResourceExhaustedError):
        runner.submit([constant_image(2, 2, 2.0)])
    assert time.monotonic() - started < 0.5
    gate.set()
    runner.stop()


def test_expired_and_cancelled_requests_never_run() -> None:
    gate = threading.Event()
    tower = RecordingTower(gate)
    runner = make_runner(tower, max_wait_ms=0)
    first = runner.submit([constant_image(2, 2, 0.0)])
    time.sleep(0.05)
    assert runner.queued_patches == 0  # the first image is in its forward, not queued
    expired = runner.submit([constant_image(2, 2, 7.0)], deadline=time.monotonic() + 0.01)
    cancelled = runner.submit([constant_image(2, 2, 8.0)])
    assert runner.queued_patches == 2 * 4
    assert cancelled.cancel()
    assert runner.queued_patches == 4  # a cancelled request's patches leave the queue's count at once
    kept = runner.submit([constant_image(2, 2, 9.0)])
    time.sleep(0.05)
    gate.set()
    first.result(5)
    kept_image = constant_image(2, 2, 9.0)
    torch.testing.assert_close(kept.result(5)[0], alone(kept_image), rtol=1e-4, atol=1e-5)
    with pytest.raises(DeadlineExceededError):
        expired.result(5)
    runner.stop()
    ran = {v for b in tower.batches for v in image_ids(b)}
    assert 7.0 not in ran and 8.0 not in ran
    assert runner.queued_patches == 0  # the expired one dropped, the kept one run


def test_a_failing_batch_fails_only_its_requests_and_the_runner_keeps_going() -> None:
    stats: list[BatchStats] = []
    runner = Runner(
        RecordingTower(fail_on=3.0), RunnerConfig(max_wait_ms=0), max_patches_per_image=64, observer=stats.append
    )
    runner.start()
    with pytest.raises(RuntimeError, match="boom"):
        runner.submit([constant_image(2, 2, 3.0)]).result(5)
    fine = constant_image(2, 2, 4.0)
    torch.testing.assert_close(runner.submit([fine]).result(5)[0], alone(fine), rtol=1e-4, atol=1e-5)
    runner.stop()
    assert stats and stats[-1].num_images == 1


def test_budget_smaller_than_one_image_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="max_batch_patches"):
        Runner(RecordingTower(), RunnerConfig(max_batch_patches=16), max_patches_per_image=64)


def test_each_request_gets_its_own_destination_written_in_place() -> None:
    """The `output` allocator's buffer is what the request gets back (the IPC pool relies on this)."""
    runner = make_runner(RecordingTower(), max_wait_ms=20)
    pool = torch.full((64, 256), float("nan"))
    written: list[bool] = []
    request = [constant_image(4, 4, 1.0), constant_image(2, 4, 2.0)]  # 4 + 2 tokens
    future = runner.submit(request, output=lambda rows: pool[10 : 10 + rows], on_written=lambda: written.append(True))
    other = runner.submit([constant_image(2, 2, 3.0)])
    got = future.result(5)
    other.result(5)
    runner.stop()
    assert written == [True]
    assert got[0].data_ptr() == pool[10].data_ptr() and got[1].data_ptr() == pool[14].data_ptr()
    for img, emb in zip(request, got):
        torch.testing.assert_close(emb, alone(img), rtol=1e-4, atol=1e-5)
    assert torch.isnan(pool[:10]).all() and torch.isnan(pool[16:]).all(), "wrote outside its slice"


def test_batches_are_packed_in_the_pixel_dtype_it_was_given() -> None:
    """A bf16 CUDA encoder gets bf16 pixels (half the H2D bytes); the default stays float32."""
    towers = {dtype: RecordingTower() for dtype in (torch.float32, torch.bfloat16)}
    pixels = constant_image(2, 4, 1.0 + 2**-8)  # rounds to 1.0 in bf16
    for dtype, tower in towers.items():
        runner = Runner(tower, RunnerConfig(max_wait_ms=0), max_patches_per_image=64, pixel_dtype=dtype)
        runner.start()
        assert runner.submit([pixels]).result(5)[0].shape == (2, 256)
        runner.stop()
    assert [b.pixel_values.dtype for b in towers[torch.float32].batches] == [torch.float32]
    assert [b.pixel_values.dtype for b in towers[torch.bfloat16].batches] == [torch.bfloat16]
    assert towers[torch.bfloat16].batches[0].pixel_values.eq(1.0).all()
    assert towers[torch.float32].batches[0].pixel_values.eq(1.0 + 2**-8).all()


def test_a_batch_waits_for_company_only_while_more_requests_are_on_their_way() -> None:
    # max_wait_ms is long (1 s) so that "waited" and "did not wait" cannot be confused.
    coming = threading.Event()
    tower = RecordingTower()
    runner = Runner(tower, RunnerConfig(max_wait_ms=1000), max_patches_per_image=64, company_expected=coming.is_set)
    runner.start()
    try:
        started = time.monotonic()
        runner.submit([constant_image(2, 2, 1.0)]).result(5)
        assert time.monotonic() - started < 0.5, "nothing else was on its way: the batch must not wait"
        coming.set()  # another request is being decoded: the first one waits for it and they share a forward
        first = runner.submit([constant_image(2, 2, 2.0)])
        time.sleep(0.1)
        second = runner.submit([constant_image(2, 2, 3.0)])
        first.result(5), second.result(5)
        assert [image_ids(b) for b in tower.batches] == [[1.0], [2.0, 3.0]]
    finally:
        runner.stop()


def test_adaptive_lifo_serves_the_newest_request_first_once_the_queue_is_old() -> None:
    gate = threading.Event()
    tower = RecordingTower(gate)
    runner = make_runner(tower, max_wait_ms=0, max_batch_images=2, queue_discipline="adaptive_lifo", lifo_after_ms=20)
    first = runner.submit([constant_image(2, 2, 0.0)])  # holds the worker at the gate
    time.sleep(0.05)
    old = runner.submit([constant_image(2, 2, 1.0)])
    middle = runner.submit([constant_image(2, 2, 2.0)])
    new = runner.submit([constant_image(2, 2, 3.0), constant_image(2, 2, 4.0)])
    time.sleep(0.05)  # the oldest queued image has waited past lifo_after_ms
    gate.set()
    for future in (first, old, middle, new):
        future.result(5)
    runner.stop()
    assert [image_ids(b) for b in tower.batches] == [[0.0], [3.0, 4.0], [2.0, 1.0]]


def test_dropped_images_are_reported_by_stage() -> None:
    gate = threading.Event()
    dropped: list[tuple[str, int]] = []
    runner = Runner(
        RecordingTower(gate), RunnerConfig(max_wait_ms=0), max_patches_per_image=64,
        on_dropped=lambda stage, n: dropped.append((stage, n)),
    )  # fmt: skip
    runner.start()
    first = runner.submit([constant_image(2, 2, 0.0)])
    time.sleep(0.05)
    expired = runner.submit([constant_image(2, 2, 1.0), constant_image(2, 2, 2.0)], deadline=time.monotonic() + 0.01)
    cancelled = runner.submit([constant_image(2, 2, 3.0)])
    assert cancelled.cancel()
    time.sleep(0.05)
    gate.set()
    first.result(5)
    with pytest.raises(DeadlineExceededError):
        expired.result(5)
    runner.stop()
    assert sorted(dropped) == [("queue", 1), ("queue", 2)]  # the cancelled one at once, the expired two when due
