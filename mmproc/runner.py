"""The one thread that owns the device: dynamic batching of concurrent requests into packed forwards.

Every image fits the patch budget alone, so FIFO never starves one; queue, batch and wait are bounded."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Protocol

import torch

from mmproc import thread_roles
from mmproc.batching import pack_images
from mmproc.errors import ConfigError, DeadlineExceededError, ResourceExhaustedError, UnavailableError
from mmproc.queue_discipline import take_batch
from mmproc.runner_config import RunnerConfig
from mmproc.types import PackedBatch, PreprocessedImage

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchStats:
    """What one forward did; passed to the observer (metrics) after every batch."""

    num_images: int
    num_patches: int
    num_tokens: int
    queue_wait_s: float  # oldest image's wait in the queue
    forward_s: float


OutputAllocator = Callable[[int], torch.Tensor]  # rows -> contiguous (rows, hidden) destination on the device


@dataclass
class _Job:
    """One request; its images may run in different batches but write into one output buffer, in order."""

    future: Future
    deadline: float | None  # time.monotonic() deadline
    row_offsets: list[int]  # first output row of each image; row_offsets[-1] == total rows
    allocate: OutputAllocator
    on_written: Callable[[], None] | None
    remaining: int
    out: torch.Tensor | None = None
    submitted: float = field(default_factory=time.monotonic)

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def rows(self, first: int, last: int) -> torch.Tensor:
        """The destination rows of images first..last (inclusive), allocating the buffer on first use."""
        if self.out is None:
            self.out = self.allocate(self.row_offsets[-1])
        return self.out[self.row_offsets[first] : self.row_offsets[last + 1]]

    def results(self) -> list[torch.Tensor]:
        assert self.out is not None
        offsets = self.row_offsets
        return [self.out[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


@dataclass
class _Item:
    job: _Job
    position: int
    image: PreprocessedImage

    @property
    def patches(self) -> int:
        return self.image.num_patches


class BatchModel(Protocol):
    """A forward over a packed batch (a `VisionEncoder` is one)."""

    device: torch.device
    dtype: torch.dtype
    output_dim: int

    def __call__(self, batch: PackedBatch, out: list[torch.Tensor]) -> object: ...


class Runner:
    """Runs the model on a worker thread; the projector writes each request's rows straight into its own
    output buffer (the `output` allocator's, e.g. an IPC pool slice), with no batch-sized intermediate."""

    def __init__(
        self,
        model: BatchModel,
        config: RunnerConfig,
        *,
        max_patches_per_image: int,
        merge_kernel_size: tuple[int, int] = (2, 2),
        pin_memory: bool = False,
        pixel_dtype: torch.dtype = torch.float32,
        observer: Callable[[BatchStats], None] | None = None,
        company_expected: Callable[[], bool] | None = None,
        on_dropped: Callable[[str, int], None] | None = None,
        batch_patches: Callable[[], int] | None = None,
    ) -> None:
        """pin_memory, pixel_dtype: how batches are packed (CUDA: `batching.pixel_transfer_dtype`).
        company_expected: whether more requests are on their way; if not, a batch starts without waiting.
        on_dropped(stage, images): images dropped unrun ("queue") or run for a caller gone ("late"); any thread.
        batch_patches: the next batch's patch budget, at most `max_batch_patches` (None: that maximum)."""
        if max_patches_per_image > config.max_batch_patches:
            raise ConfigError(
                f"runner: max_batch_patches={config.max_batch_patches} is smaller than one image can be "
                f"({max_patches_per_image} patches); raise it so that every image fits a batch"
            )
        self._model = model
        self._config = config
        self._merge = merge_kernel_size
        self._pin_memory = pin_memory
        self._pixel_dtype = pixel_dtype
        self._observer = observer
        self._company_expected = company_expected or (lambda: True)
        self._on_dropped = on_dropped or (lambda stage, images: None)
        self._max_patches_per_image = max_patches_per_image
        self._batch_patches = batch_patches
        self._queue: deque[_Item] = deque()
        self._queued_patches = 0  # of the images in _queue, kept with it under _cond
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mmproc-runner", daemon=True)
        self._started = False

    # -- public -------------------------------------------------------------------------------------

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Finish what is queued, then stop the worker."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._started:
            self._thread.join(timeout)

    def oldest_wait_s(self) -> float:
        """The queue's sojourn time: how long the oldest queued image has waited (0 when empty)."""
        with self._cond:
            return time.monotonic() - self._queue[0].job.submitted if self._queue else 0.0

    @property
    def queued_images(self) -> int:
        with self._cond:
            return len(self._queue)

    @property
    def queued_patches(self) -> int:
        return self._queued_patches  # an int read: atomic, no lock

    def default_output(self, rows: int) -> torch.Tensor:
        model = self._model
        return torch.empty((rows, model.output_dim), dtype=model.dtype, device=model.device)

    def submit(
        self,
        images: Sequence[PreprocessedImage],
        deadline: float | None = None,
        *,
        output: OutputAllocator | None = None,
        on_written: Callable[[], None] | None = None,
    ) -> Future:
        """Queue a request's images; the future gets one (tokens_i, hidden) tensor per image, in order.

        deadline: time.monotonic(); images not started by then are dropped (DeadlineExceededError), as are
        those of a cancelled future. output: allocates the (total tokens, hidden) destination, on the runner.
        on_written: on the runner, after the last forward was enqueued (stream-ordered), before the future resolves.
        """
        future: Future = Future()
        if not images:
            future.set_result([])
            return future
        offsets = [0]
        for image in images:
            offsets.append(offsets[-1] + image.num_tokens)
        job = _Job(
            future=future,
            deadline=deadline,
            row_offsets=offsets,
            allocate=output or self.default_output,
            on_written=on_written,
            remaining=len(images),
        )
        with self._cond:
            if self._stopping:
                raise UnavailableError("encoder is shutting down")
            if len(self._queue) + len(images) > self._config.max_queued_images:
                raise ResourceExhaustedError(
                    f"encoder queue full ({len(self._queue)} images queued, limit {self._config.max_queued_images})",
                    cause="queue_full",
                )
            self._queue.extend(_Item(job, i, image) for i, image in enumerate(images))
            self._queued_patches += sum(image.num_patches for image in images)
            self._cond.notify()
        future.add_done_callback(self._drop_if_cancelled)
        return future

    def _drop_if_cancelled(self, future: Future) -> None:
        if future.cancelled():
            with self._cond:
                before = len(self._queue)
                self._queue = deque(item for item in self._queue if item.job.future is not future)
                self._queued_patches = sum(item.patches for item in self._queue)
                dropped = before - len(self._queue)
            if dropped:
                self._on_dropped("queue", dropped)

    # -- worker -------------------------------------------------------------------------------------

    def _run(self) -> None:
        thread_roles.register("runner")
        while True:
            items = self._next_batch()
            if items is None:
                return
            if items:
                self._execute(items)

    def _next_batch(self) -> list[_Item] | None:
        """Block for work, then take a batch from the queue; None means stop."""
        cfg = self._config
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                self._cond.wait()
            wait_until = time.monotonic() + cfg.max_wait_ms / 1000
            while not self._stopping and not self._budget_full() and self._company_expected():
                left = wait_until - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._take_prefix()

    def _patch_budget(self) -> int:
        ceiling = self._config.max_batch_patches
        if self._batch_patches is None:
            return ceiling
        return max(self._max_patches_per_image, min(ceiling, self._batch_patches()))

    def _budget_full(self) -> bool:
        patches, budget = 0, self._patch_budget()
        for n, item in enumerate(self._queue):
            patches += item.image.num_patches
            if patches >= budget or n + 1 >= self._config.max_batch_images:
                return True
        return False

    def _take_prefix(self) -> list[_Item]:
        """The batch, after the last deadline/cancellation check; dead images leave the queue wherever they are."""
        now = time.monotonic()
        dead = {id(item.job): item.job for item in self._queue if item.job.future.done() or item.job.expired(now)}
        if dead:  # the queue is copied only then
            live = deque(item for item in self._queue if id(item.job) not in dead)
            for job in dead.values():
                _settle(job.future, exception=DeadlineExceededError("deadline passed while queued"))
            self._on_dropped("queue", len(self._queue) - len(live))
            self._queue = live
            self._queued_patches = sum(item.patches for item in live)
        cfg = self._config
        budget = self._patch_budget()
        newest_first = (
            cfg.queue_discipline == "adaptive_lifo"
            and bool(self._queue)
            and now - self._queue[0].job.submitted > cfg.lifo_after_ms / 1000
        )
        batch = take_batch(
            self._queue,
            lambda images, patches: patches <= budget and images < cfg.max_batch_images,
            newest_first,
        )
        self._queued_patches -= sum(item.patches for item in batch)
        return batch

    def _execute(self, items: list[_Item]) -> None:
        started = time.monotonic()
        batch = pack_images(
            [item.image for item in items],
            merge_kernel_size=self._merge,
            pin_memory=self._pin_memory,
            dtype=self._pixel_dtype,
        )
        try:
            with torch.inference_mode():
                self._model(batch, out=[job.rows(first, last) for job, first, last in _runs(items)])
        except Exception as exc:  # a model failure fails this batch's requests, not the service
            logger.exception("encoder forward failed for a batch of %d images", len(items))
            for item in items:
                _settle(item.job.future, exception=exc)
            return
        finished = time.monotonic()
        if self._observer is not None:  # before any reply: a caller that has its result finds the batch counted
            oldest = min(item.job.submitted for item in items)
            self._observer(
                BatchStats(len(items), batch.num_patches, batch.num_tokens, started - oldest, finished - started)
            )
        for job, first, last in _runs(items):
            job.remaining -= last - first + 1
            if job.future.done():  # its caller gave up during the forward: work nobody receives
                self._on_dropped("late", last - first + 1)
            if job.remaining == 0:
                if job.on_written is not None:
                    job.on_written()
                _settle(job.future, result=job.results())


def _runs(items: list[_Item]) -> list[tuple[_Job, int, int]]:
    """(job, first, last) runs; a job's images are queued together, so within a batch they are contiguous."""
    runs: list[tuple[_Job, int, int]] = []
    for item in items:
        if runs and runs[-1][0] is item.job and runs[-1][2] + 1 == item.position:
            job, first, _ = runs[-1]
            runs[-1] = (job, first, item.position)
        else:
            runs.append((item.job, item.position, item.position))
    return runs


def _settle(future: Future, *, result: object = None, exception: BaseException | None = None) -> None:
    """Resolve a future unless the caller cancelled it meanwhile (cancellation races the worker)."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass
