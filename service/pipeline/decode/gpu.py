"""JPEGs decoded and preprocessed on the encoder's GPU (`gpu_decode`), the rest through the decode pool.

For each request: headers checked on the CPU (`mmproc.media.gpu_jpeg`: every refusal the CPU path makes before
decoding, same reason), the JPEGs that qualify decoded in one nvImageCodec batch, oriented, resized and cut into
uint8 patches on the device; what does not qualify, and any image the GPU could not decode, goes to the decode
pool, which decodes it or refuses it as before. One thread owns the decoder and its CUDA stream (a high-priority
one), so the event loop never waits on the GPU and the decoder is never used by two threads at once; requests
that queue while it works are decoded together in its next batch (service/pipeline/decode/batcher.py).
"""

from __future__ import annotations

import contextvars
import io
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import torch
from PIL import Image
from prometheus_client import Counter

from mmproc import thread_roles
from mmproc.errors import DeadlineExceededError, InvalidMediaError
from mmproc.media.gpu_jpeg import GpuJpeg, gpu_jpeg, orient
from mmproc.media.limits import MediaLimits
from mmproc.media.nvjpeg import NvJpegDecoder
from mmproc.preprocess import PreprocessConfig
from mmproc.preprocess.device import preprocess_same_size
from service.pipeline.decode.batcher import Batcher
from service.pipeline.decode.worker import Prepared
from service.pipeline.wait_clock import WaitClock

logger = logging.getLogger(__name__)

HUFFMAN_THREADS = 4  # host threads nvJPEG's hybrid backend may use for a batch's entropy decoding
MAX_BATCH_IMAGES = 64  # images of the requests queued together that one device round trip decodes
Gated = GpuJpeg | InvalidMediaError | None  # for the GPU / refused before decoding / for the CPU path


@dataclass
class GpuRequest:
    """One request's images, its deadline, and the context its log lines keep (the request id)."""

    images: list[bytes]
    deadline: float | None
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


@dataclass
class GpuResult:
    """Each image's gate verdict, and what the GPU made of those decoded there (None: it could not: the CPU
    path's turn). `expired`: the deadline passed before the decode, nothing was decoded."""

    gated: list[Gated]
    decoded: dict[int, Prepared | None]
    expired: bool = False


class GpuDecoder:
    """Header checks and batched decode + preprocessing of JPEGs on `device` (see module doc). Requests queued
    while the device is busy are decoded together, in one nvImageCodec batch and one wait on the device."""

    def __init__(self, limits: MediaLimits, preprocess: PreprocessConfig, device: torch.device) -> None:
        before = thread_roles.task_ids()  # the threads started here are this role's (mmproc_cpu_seconds_total)
        self.limits, self.preprocess, self.device = limits, preprocess, device
        self.decoder = NvJpegDecoder(device, HUFFMAN_THREADS)
        # High priority: the encoder keeps the GPU busy, and a decode waiting behind its kernels holds up every
        # request of the batch (and those queued behind it) for what is a few milliseconds of device work.
        self._stream = torch.cuda.Stream(device, priority=-1)
        self._done = torch.cuda.Event(blocking=True)  # a host wait that sleeps instead of spinning a core
        self._batches = Batcher(self._run_batch, MAX_BATCH_IMAGES, "mmproc-gpu-decode")
        thread_roles.register_tids("gpu_decode", thread_roles.task_ids() - before)  # nvImageCodec's and the batches'

    @property
    def waits(self) -> WaitClock:
        """Requests queued for the decoder: the GPU decode stage's queue, for overload control."""
        return self._batches.waits

    def warm_up(self) -> None:
        """One decode, so that the first request pays no nvJPEG set-up. Before serving: no request runs yet."""
        buffer = io.BytesIO()
        Image.new("RGB", (64, 64), (127, 127, 127)).save(buffer, "JPEG")
        data = buffer.getvalue()
        before = thread_roles.task_ids()  # nvJPEG may start more on its first decode; later ones count as other
        if self._decode_all([data], [gpu_jpeg(data, self.limits)])[0] is None:
            raise RuntimeError("GPU JPEG decode failed on a plain JPEG at start-up")
        thread_roles.register_tids("gpu_decode", thread_roles.task_ids() - before)

    def close(self) -> None:
        self._batches.close()

    async def decode(self, images: list[bytes], deadline: float | None) -> GpuResult:
        return await self._batches.submit(GpuRequest(images, deadline), len(images))

    def _run_batch(self, requests: list[GpuRequest]) -> list[GpuResult]:
        """(decode thread) Gate every request, then decode the JPEGs of those still in time in one batch."""
        return run_batch(requests, self.limits, self._decode_all)

    def _decode_all(self, images: list[bytes], gated: list[GpuJpeg]) -> list[Prepared | None]:
        """(decode thread) Decode, orient and preprocess on the side stream; return once the device is done."""
        started = time.perf_counter()
        out: list[Prepared | None] = [None] * len(images)
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            decoded = self.decoder.decode(images, self._stream)
            decoded_at = time.perf_counter()
            by_size: dict[tuple[int, ...], list[tuple[int, torch.Tensor]]] = {}
            for i, (pixels, facts) in enumerate(zip(decoded, gated, strict=True)):
                width, height = facts.size
                if pixels is None or tuple(pixels.shape) != (height, width, 3):  # the stream disagreed with its header
                    continue
                upright = orient(pixels, facts.orientation)
                by_size.setdefault(tuple(upright.shape), []).append((i, upright))
            for same in by_size.values():  # a few ops per size, not per image: this thread is short of the GIL
                done = preprocess_same_size([pixels for _, pixels in same], self.preprocess, normalize=False)
                for (i, _), image in zip(same, done, strict=True):
                    out[i] = Prepared(image, 0.0, 0.0)
            self._done.record(self._stream)
        self._done.synchronize()
        finished = time.perf_counter()
        share = 1 / max(1, len(images))  # the batch's host time, split evenly: per image for the stage metrics
        return [p if p is None else p._replace(decode_s=(decoded_at - started) * share,
                                               preprocess_s=(finished - decoded_at) * share) for p in out]  # fmt: skip


Decode = Callable[[list[bytes], list[GpuJpeg]], list["Prepared | None"]]


def gate_all(images: list[bytes], limits: MediaLimits) -> list[Gated]:
    out: list[Gated] = []
    for data in images:
        try:
            out.append(gpu_jpeg(data, limits))
        except InvalidMediaError as exc:
            out.append(exc)
    return out


def first_refused(gated: list[Gated]) -> int:
    """The index of the first image the gate refused; len(gated) when none: the images after it are not decoded."""
    return next((i for i, g in enumerate(gated) if isinstance(g, InvalidMediaError)), len(gated))


def run_batch(requests: list[GpuRequest], limits: MediaLimits, decode: Decode) -> list[GpuResult]:
    """Each request's headers checked (under its own log context); the JPEGs before its first refused image, of
    the requests whose deadline has not passed, decoded in one `decode` call. A call that raises (the device out
    of memory, say) leaves every image to the CPU path, with one WARNING, never a 500."""
    results: list[GpuResult] = []
    wanted: list[tuple[int, int]] = []  # (request, image) for the batch
    now = time.monotonic()
    for r, request in enumerate(requests):
        gated = request.context.run(gate_all, request.images, limits)
        first_bad = first_refused(gated)
        expired = request.deadline is not None and now >= request.deadline
        results.append(GpuResult(gated, {}, expired))
        if not expired:
            wanted += [(r, i) for i in range(first_bad) if isinstance(gated[i], GpuJpeg)]
    if not wanted:
        return results
    try:
        decoded = decode([requests[r].images[i] for r, i in wanted], [results[r].gated[i] for r, i in wanted])
    except Exception:  # noqa: BLE001 - the device failed the batch: the workers decode it
        logger.warning("GPU JPEG decode failed for a batch of %d; decoding it on the CPU", len(wanted), exc_info=True)
        decoded = [None] * len(wanted)
    for (r, i), prepared in zip(wanted, decoded, strict=True):
        results[r].decoded[i] = prepared
    return results


CpuPath = Callable[[list[bytes], float | None], Awaitable[list[Prepared]]]


async def decode_split(
    gpu: GpuDecoder, images: list[bytes], cpu_path: CpuPath, deadline: float | None, paths: Counter
) -> list[Prepared]:
    """Every image of one request, in order: qualifying JPEGs on the GPU, the others (and GPU failures) through
    `cpu_path` (the decode pool's `prepare_all`); the lowest-indexed refusal is raised, as the pool alone would.
    `paths` counts the images by where they were decoded: gpu, fallback (the GPU failed them), cpu."""
    result = await gpu.decode(images, deadline)
    if result.expired:
        raise DeadlineExceededError("deadline passed before the images were decoded")
    gated = result.gated
    first_bad = first_refused(gated)
    results = {i: p for i, p in result.decoded.items() if p is not None}
    on_cpu = [i for i in range(first_bad) if i not in results]
    failed = len(result.decoded) - len(results)
    paths.labels("gpu").inc(len(results))
    paths.labels("fallback").inc(failed)
    paths.labels("cpu").inc(len(on_cpu) - failed)
    if on_cpu:
        try:
            results |= dict(zip(on_cpu, await cpu_path([images[i] for i in on_cpu], deadline), strict=True))
        except InvalidMediaError as exc:
            raise exc.at_index(on_cpu[exc.index]) if exc.index >= 0 else exc from None
    if first_bad < len(images):
        raise gated[first_bad].at_index(first_bad)  # type: ignore[union-attr]
    return [results[i] for i in range(len(images))]
