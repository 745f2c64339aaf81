"""Decoding and preprocessing off the event loop: in isolated worker processes (default) or in threads.

Why processes: Pillow's decoders are C code fed with hostile bytes. In a worker process a segfault, an abort
or a runaway allocation (capped by RLIMIT_AS, see `decode_worker.init_worker`) ends that worker, not the
service. The price is one hop per image (bytes in through the pipe, float32 patches out through tmpfs, see
`decode_transfer`); docs/reliability.md has the measurements behind the default.

Crash handling (process mode). When a worker dies, `ProcessPoolExecutor` fails *every* pending image of
that executor with BrokenProcessPool, so the culprit cannot be told from its neighbours. The pool is
replaced at once (new work goes to the new one) and each affected image is retried alone, one at a time, in
a one-worker quarantine executor: an image that crashes there is certainly at fault and gets a 400
UNDECODABLE; the innocent ones simply succeed. A worker that runs out of its memory budget exits on purpose
and is handled the same way (a worker worn by earlier work cannot get an innocent image refused). A worker
busy with one image for longer than `timeout_s` is ended by its own alarm (`decode_worker.run_task`), i.e. it
becomes a crash, so a decoder stuck in a loop cannot eat the pool either; time queued for a worker does not
count.

Time budget (process mode): each image gets `budget_base_s` + `budget_per_mp_s` per declared megapixel of CPU
time (at most `timeout_s`); past it the worker's timer interrupts the decode and the image is refused
DECODE_TIME. The workers are then replaced: fresh ones are started in the background, swapped in once warm,
and the worn ones finish what they already hold (no other image fails). A decoder that does not come back to
Python is killed by the kernel (see `run_task`).

Fairness: at most `workers` images are handed to the executor at a time, and a free slot goes to the requests
waiting for one in turn (round robin by request), so a request of 32 slow images delays another request's
image by at most one image's time per worker, not by the whole request.

Thread mode runs the same code in a ThreadPoolExecutor: cheaper per image, no protection against crashes,
and a stuck decoder keeps its thread (the request still ends at its deadline).

About pickle: the executor talks to its own children over a local pipe with multiprocessing's pickle. Only
our own structures cross it (bytes and frozen configs in; a numpy array, ints or a typed error out). It is
not a network wire; a worker that a decoder exploit took over already runs as the same user as the service,
so unpickling its reply adds no privilege it did not have. No network path ever unpickles anything.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace

from mmproc.errors import ConfigError, DeadlineExceededError, InvalidMediaError, Reason, UnavailableError
from mmproc.media import MediaLimits
from mmproc.preprocess import PreprocessConfig
from mmproc.units import MiB
from service.observe.logs import REQUEST_ID
from service.pipeline.decode import video_worker as decode_video_worker
from service.pipeline.decode import worker as decode_worker
from service.pipeline.decode.config import DecodePoolConfig
from service.pipeline.decode.futures import cancel_running, first_error_in_order, materialize
from service.pipeline.decode.jobs import VideoJob, _ImageJob
from service.pipeline.decode.request_budget import RequestSpend, check_megapixels
from service.pipeline.decode.transfer import Shipped, make_transfer_dir, remove_transfer_dir
from service.pipeline.decode.video_worker import ShippedVideo
from service.pipeline.decode.worker import Prepared, declared_pixels, init_worker, resident_bytes, run_task, warm_up
from service.pipeline.fair_share import FairShare
from service.pipeline.wait_clock import WaitClock

logger = logging.getLogger(__name__)

Task = Callable[[bytes, MediaLimits, PreprocessConfig], Prepared]


class DecodePool:
    """Turns a request's image bytes into `Prepared` images, or the first bad image's InvalidMediaError.

    `task` replaces the per-image function (a top-level function with the signature of
    `decode_worker.prepare_image`, importable by name in a worker); tests use it to crash a worker on purpose.
    Without it, thread mode looks `decode_worker.prepare_image` up at each call (tests may patch it).
    """

    def __init__(
        self,
        limits: MediaLimits,
        preprocess: PreprocessConfig,
        config: DecodePoolConfig,
        *,
        task: Task | None = None,
    ) -> None:
        self.limits = limits
        self.preprocess = preprocess
        self.config = config
        self._task = task
        self._lock = threading.Lock()
        self._closed = False
        self.crashes = 0  # process executors found broken (each one replaced)
        self.quarantined = 0  # images retried alone after a crash or a timeout
        self.quarantine_crashes = 0  # of those, the ones that killed their lone worker too (refused undecodable)
        self.retired = 0  # process executors replaced after an image ran out of its time budget
        self._share = FairShare(config.workers)
        # Requests waiting for their first worker slot: what a request arriving now waits for one (slots go round
        # robin by request, so a big request's later images say nothing of it). For overload control.
        self.waits = WaitClock()
        self._request_keys = itertools.count()
        self._transfer_dir: str | None = None  # made on first use: an engine never started leaves nothing
        if config.isolation == "thread":
            self._executor: Executor = ThreadPoolExecutor(config.workers, thread_name_prefix="mmproc-decode")
            return
        self._context = multiprocessing.get_context("forkserver")
        # The forkserver imports these once; every worker (and every replacement) is forked from it.
        preload = {"service.pipeline.decode.worker", "service.pipeline.decode.video_worker"}
        preload |= {task.__module__} if task is not None else set()
        self._context.set_forkserver_preload(sorted(preload))
        self._transfer_made = False
        self._executor = self._new_process_executor(config.workers)
        self._quarantine: ProcessPoolExecutor | None = None
        self._quarantine_thread = ThreadPoolExecutor(1, thread_name_prefix="mmproc-quarantine")
        self._respawner = ThreadPoolExecutor(1, thread_name_prefix="mmproc-respawn")
        self._respawning = False

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every process worker now, so that the first requests pay no fork."""
        if self.config.isolation == "process":
            self._transfer()
            futures = [self._executor.submit(warm_up) for _ in range(self.config.workers)]
            try:
                for future in futures:
                    future.result(timeout=120)
            except BrokenProcessPool:
                raise ConfigError(
                    "decode worker processes could not start (their error is above). A worker re-imports the "
                    "main module: it must be a file guarded by `if __name__ == '__main__':`; or set "
                    "decode_isolation=thread"
                ) from None

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self.config.isolation == "process":
            self._respawner.shutdown(wait=True, cancel_futures=True)  # a fresh executor it made is shut down too
            self._executor.shutdown(wait=True, cancel_futures=True)  # in case one was swapped in meanwhile
            self._quarantine_thread.shutdown(wait=True, cancel_futures=True)
            if self._quarantine is not None:
                self._quarantine.shutdown(wait=True, cancel_futures=True)
            remove_transfer_dir(self._transfer_dir)

    def worker_pids(self) -> list[int]:
        """Pids of the live process workers (empty in thread mode); for tests and diagnostics."""
        processes = getattr(self._executor, "_processes", None) or {}
        return [p.pid for p in list(processes.values()) if p.is_alive()]

    # -- requests -----------------------------------------------------------------------------------

    async def prepare_all(self, images: Sequence[bytes], deadline: float | None = None) -> list[Prepared]:
        """All images of one request, in order; raises the lowest-indexed image's error.

        When image i fails, images after i that have not started are cancelled (their outcome cannot change
        the answer) while images before i still finish, so the error reported is deterministic. `deadline`
        (time.monotonic()) ends the wait with DeadlineExceededError; cancelling the caller cancels the rest.
        """
        budget = self.config.budget
        pixels = [declared_pixels(data) for data in images]
        # An image over max_pixels is its own refusal (with its index): it counts at most that here.
        check_megapixels([min(p, self.limits.max_pixels) for p in pixels], self.config.request_megapixels)
        jobs = []
        for data, declared in zip(images, pixels, strict=True):
            seconds = budget.seconds(declared)
            jobs.append(_ImageJob(data, seconds, heavy=seconds > self.config.heavy_s))
        return await self._prepare_many(jobs, deadline, "images")

    async def prepare_videos(self, jobs: Sequence[VideoJob], deadline: float | None = None) -> list[ShippedVideo]:
        """Every video of one request (`VideoJob`s), in order, as `decode_video_worker.ShippedVideo`s: the same
        workers, fair share, crash quarantine and first-error-in-order rule as images (one video, one slot)."""
        return await self._prepare_many(jobs, deadline, "videos")

    async def _prepare_many(self, jobs: Sequence, deadline: float | None, what: str) -> list:
        key = next(self._request_keys)  # this request's turn in the fair share
        token = self.waits.enter()
        spend = RequestSpend(self.config.request_cpu_s) if self.config.request_cpu_s else None
        tasks = [asyncio.ensure_future(self._prepare_one(job, key, deadline, token, spend)) for job in jobs]
        try:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            return await asyncio.wait_for(first_error_in_order(tasks), timeout)
        except asyncio.TimeoutError:
            raise DeadlineExceededError(f"deadline passed while decoding the {what}") from None
        finally:
            self.waits.leave(token)
            for task in tasks:
                task.cancel()

    async def _prepare_one(
        self, job: _ImageJob | VideoJob, key: object, deadline: float | None, waiting: int, spend: RequestSpend | None
    ):
        await self._share.acquire(key, job.heavy)
        self.waits.leave(waiting)  # the request has a slot: no longer waiting for its first
        future: Future | None = None
        try:
            if deadline is not None and time.monotonic() >= deadline:  # before its decode: nobody would wait
                raise DeadlineExceededError("deadline passed before the item was decoded")
            if self.config.isolation == "thread":
                future = self._submit_thread(job)
                return job.unship(await asyncio.wrap_future(future))
            granted = spend.grant(job.seconds) if spend is not None and isinstance(job, _ImageJob) else None
            executor, future = self._submit_process(job, granted)
            try:
                result = await asyncio.wrap_future(future)
                if granted is not None:
                    spend.charge(result.cpu_s)
                return job.unship(result)
            except BrokenProcessPool:
                self._replace(executor)
            except InvalidMediaError as exc:
                if exc.reason == Reason.DECODE_TIME:
                    self._retire(executor)
                raise
            finally:
                self._recycle_if_worn(executor)
        finally:
            self._release_when_done(future, job.heavy)
        self.quarantined += 1  # outside the fair share: the quarantine is its own one-worker executor
        loop = asyncio.get_running_loop()
        run = contextvars.copy_context().run  # keeps the request id for the worker's log lines
        return job.unship(await loop.run_in_executor(self._quarantine_thread, run, self._run_alone, job))

    def _release_when_done(self, future: Future | None, heavy: bool) -> None:
        """Give the slot back once the image has left its worker: a cancelled request's image that is already
        running keeps its worker busy, so its slot stays taken until it ends (else the executor's own queue,
        first come first served, would fill up behind it)."""
        if future is None or future.done() or future.cancel():
            self._share.release(heavy)
        else:
            future.add_done_callback(lambda _: self._share.release(heavy))  # on an executor thread
            cancel_running(future)

    def _submit_thread(self, job: _ImageJob | VideoJob) -> Future:
        run = contextvars.copy_context().run  # the decode thread's log lines carry the request id
        try:
            if isinstance(job, VideoJob):
                return self._executor.submit(run, decode_video_worker.prepare_video, *job.args)
            task = self._task or self._prepare
            return self._executor.submit(run, task, job.data, self.limits, self.preprocess)
        except RuntimeError:  # shut down
            raise UnavailableError("decoder pool is shut down") from None

    def _submit_process(self, job: _ImageJob | VideoJob, granted: float | None = None) -> tuple[Executor, Future]:
        with self._lock:
            if self._closed:
                raise UnavailableError("decoder pool is shut down")
            executor = self._executor
        try:
            return executor, self._submit_task(executor, job, granted)
        except BrokenProcessPool:  # broken by another image's crash before this one ever ran: not a suspect
            self._replace(executor)
            return self._submit_process(job, granted)

    def _submit_task(self, executor: Executor, job: _ImageJob | VideoJob, granted: float | None = None) -> Future:
        request_id = REQUEST_ID.get()
        if isinstance(job, VideoJob):  # a file at cancel_path ends it when its request is gone (_release_when_done)
            out = self._transfer()
            cancel = None if out is None else os.path.join(out, f"cancel-{next(self._request_keys)}")
            future = executor.submit(decode_video_worker.run_video_task, request_id, out, *job.args, cancel)
            future.cancel_path = cancel  # type: ignore[attr-defined]
        else:
            task = self._task or self._prepare
            budget = self.config.budget if granted is None else replace(self.config.budget, granted_s=granted)
            future = executor.submit(
                run_task, task, budget, self._transfer(), request_id, job.data, self.limits, self.preprocess
            )
        future.add_done_callback(materialize)  # before anyone waits: maps and unlinks even if nobody does
        return future

    @property
    def transfer_dir(self) -> str | None:
        """The tmpfs directory of large worker results: None until the first process decode (and in thread mode)."""
        return self._transfer_dir

    @property
    def _prepare(self) -> Callable:
        """The worker task, looked up at each call (tests may patch it): normalized patches, or the bytes."""
        return decode_worker.prepare_image if self.config.normalize else decode_worker.prepare_image_bytes

    def _transfer(self) -> str | None:
        """The tmpfs directory workers ship large results through (None: use the pipe)."""
        with self._lock:
            if not self._transfer_made and not self._closed:
                self._transfer_dir, self._transfer_made = make_transfer_dir(), True
            return self._transfer_dir

    def _replace(self, broken: Executor) -> None:
        """Swap in a fresh process executor, once per broken one, and let the broken one go."""
        with self._lock:
            if self._executor is not broken or self._closed:
                return
            self._executor = self._new_process_executor(self.config.workers)
            self.crashes += 1
        logger.warning("decode pool: a worker died; replaced the workers, retrying their images one at a time")
        broken.shutdown(wait=False, cancel_futures=True)

    def _recycle_if_worn(self, executor: Executor) -> None:
        """After a task: a worker whose resident size stayed over `worker_recycle_mb` (memory a decoder kept, or
        a heap that did not shrink) gets its executor retired, so the next image meets a worker at its idle size."""
        limit = self.config.worker_recycle_mb * MiB
        processes = getattr(executor, "_processes", None) or {}
        if limit and any(resident_bytes(p.pid) > limit for p in list(processes.values())):
            self._retire(executor, "a worker stayed over its resident size limit after a task")

    def _retire(self, worn: Executor, why: str = "an image ran out of its time budget") -> None:
        """After an image ran out of its time budget: replace the workers that ran it, without a gap.

        Starting workers can take seconds (a forkserver child re-imports `__main__`), so fresh ones are started
        and warmed up in the background while the worn ones keep serving (the interrupted decode left them in
        a clean Python state); then they are swapped in, and the worn executor finishes the images it already
        holds (nobody's image fails) before its workers exit. Requests to retire during a respawn fold into it.
        """
        with self._lock:
            if self._executor is not worn or self._closed or self._respawning:
                return
            self._respawning = True
        logger.info("decode pool: %s; replacing its workers", why)
        self._respawner.submit(self._respawn, worn)

    def _respawn(self, worn: Executor) -> None:
        """(respawn thread) Start and warm up a fresh executor, then swap it in for `worn`."""
        fresh = self._new_process_executor(self.config.workers)
        try:
            for future in [fresh.submit(warm_up) for _ in range(self.config.workers)]:
                future.result(timeout=120)
        except Exception:  # noqa: BLE001 - could not start workers now: keep the worn ones, say so
            logger.exception("decode pool: fresh workers did not start; keeping the current ones")
            fresh.shutdown(wait=False, cancel_futures=True)
            with self._lock:
                self._respawning = False
            return
        with self._lock:
            self._respawning = False
            swap = self._executor is worn and not self._closed
            if swap:
                self._executor = fresh
                self.retired += 1
        (worn if swap else fresh).shutdown(wait=False)

    def _run_alone(self, job: _ImageJob | VideoJob) -> Shipped:
        """Quarantine (one image at a time, on the single quarantine thread): a crash here is this image's."""
        if self._closed:
            raise UnavailableError("decoder pool is shut down")
        if self._quarantine is None:
            self._quarantine = self._new_process_executor(1)
        executor = self._quarantine
        try:
            return self._submit_task(executor, job).result()  # bounded: the worker's alarm ends it
        except InvalidMediaError as exc:
            if exc.reason == Reason.DECODE_TIME:  # a worn quarantine worker is not reused either
                self._quarantine = None
                executor.shutdown(wait=False)
            raise
        except BrokenProcessPool:
            self._quarantine = None
            self.quarantine_crashes += 1
            executor.shutdown(wait=False, cancel_futures=True)
            logger.warning("decode pool: an image crashed its decoder alone (or ran out of time or memory); refused")
            raise InvalidMediaError(
                "the decoder crashed, or ran out of time or memory, on this image", reason=Reason.UNDECODABLE
            ) from None

    def _new_process_executor(self, workers: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            workers,
            mp_context=self._context,
            initializer=init_worker,
            initargs=(self.config.worker_memory_mb * MiB, self.config.log_level, self.config.log_json),
        )
