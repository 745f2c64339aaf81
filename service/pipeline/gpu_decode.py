"""JPEGs decoded and preprocessed on the encoder's GPU (`gpu_decode`), the rest through the decode pool.

For each request: headers checked on the CPU (`mmproc.media.gpu_jpeg`: every refusal the CPU path makes before
decoding, same reason), the JPEGs that qualify decoded in one nvImageCodec batch, oriented, resized and cut into
uint8 patches on the device; what does not qualify, and any image the GPU could not decode, goes to the decode
pool, which decodes it or refuses it as before. One thread owns the decoder and its CUDA stream, so the event
loop never waits on the GPU and the decoder is never used by two threads at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from PIL import Image
from prometheus_client import Counter

from mmproc import thread_roles
from mmproc.errors import DeadlineExceededError, InvalidMediaError
from mmproc.media.gpu_jpeg import GpuJpeg, gpu_jpeg, orient
from mmproc.media.limits import MediaLimits
from mmproc.media.nvjpeg import NvJpegDecoder
from mmproc.preprocess import PreprocessConfig
from mmproc.preprocess.device import preprocess_tensor
from service.pipeline.decode_worker import Prepared

logger = logging.getLogger(__name__)

HUFFMAN_THREADS = 4  # host threads nvJPEG's hybrid backend may use for a batch's entropy decoding
Gated = GpuJpeg | InvalidMediaError | None  # for the GPU / refused before decoding / for the CPU path


class GpuDecoder:
    """Header checks and batched decode + preprocessing of one request's JPEGs on `device` (see module doc)."""

    def __init__(self, limits: MediaLimits, preprocess: PreprocessConfig, device: torch.device) -> None:
        before = thread_roles.task_ids()  # the threads nvImageCodec starts are this role's (mmproc_cpu_seconds_total)
        self.limits, self.preprocess, self.device = limits, preprocess, device
        self.decoder = NvJpegDecoder(device, HUFFMAN_THREADS)
        self._stream = torch.cuda.Stream(device)
        self._done = torch.cuda.Event(blocking=True)  # a host wait that sleeps instead of spinning a core
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="mmproc-gpu-decode")
        thread_roles.register_tids("gpu_decode", thread_roles.task_ids() - before)

    def warm_up(self) -> None:
        """One decode, so that the first request pays no nvJPEG set-up."""
        buffer = io.BytesIO()
        Image.new("RGB", (64, 64), (127, 127, 127)).save(buffer, "JPEG")
        data = buffer.getvalue()
        before = thread_roles.task_ids()  # nvJPEG may start more on its first decode
        if self._decode_all([data], [gpu_jpeg(data, self.limits)])[0] is None:
            raise RuntimeError("GPU JPEG decode failed on a plain JPEG at start-up")
        thread_roles.register_tids("gpu_decode", thread_roles.task_ids() - before)
        # The decode thread itself, started now; a thread nvImageCodec starts later is not found: it counts as other.
        self._thread.submit(thread_roles.register, "gpu_decode").result()

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)

    async def gate(self, images: list[bytes]) -> list[Gated]:
        return await self._in_thread(self._gate_all, images)

    async def decode(self, images: list[bytes], gated: list[GpuJpeg]) -> list[Prepared | None]:
        return await self._in_thread(self._decode_all, images, gated)

    async def _in_thread(self, fn, *args):
        run = contextvars.copy_context().run  # log lines keep the request id
        return await asyncio.get_running_loop().run_in_executor(self._thread, run, fn, *args)

    def _gate_all(self, images: list[bytes]) -> list[Gated]:
        out: list[Gated] = []
        for data in images:
            try:
                out.append(gpu_jpeg(data, self.limits))
            except InvalidMediaError as exc:
                out.append(exc)
        return out

    def _decode_all(self, images: list[bytes], gated: list[GpuJpeg]) -> list[Prepared | None]:
        """(decode thread) Decode, orient and preprocess on the side stream; return once the device is done."""
        started = time.perf_counter()
        out: list[Prepared | None] = []
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            decoded = self.decoder.decode(images, self._stream)
            decoded_at = time.perf_counter()
            for pixels, facts in zip(decoded, gated, strict=True):
                width, height = facts.size
                if pixels is None or tuple(pixels.shape) != (height, width, 3):  # the stream disagreed with its header
                    out.append(None)
                    continue
                upright = orient(pixels, facts.orientation)
                out.append(Prepared(preprocess_tensor(upright, self.preprocess, normalize=False), 0.0, 0.0))
            self._done.record(self._stream)
        self._done.synchronize()
        finished = time.perf_counter()
        share = 1 / max(1, len(images))  # the batch's host time, split evenly: per image for the stage metrics
        return [p if p is None else p._replace(decode_s=(decoded_at - started) * share,
                                               preprocess_s=(finished - decoded_at) * share) for p in out]  # fmt: skip


CpuPath = Callable[[list[bytes], float | None], Awaitable[list[Prepared]]]


async def decode_split(
    gpu: GpuDecoder, images: list[bytes], cpu_path: CpuPath, deadline: float | None, paths: Counter
) -> list[Prepared]:
    """Every image of one request, in order: qualifying JPEGs on the GPU, the others (and GPU failures) through
    `cpu_path` (the decode pool's `prepare_all`); the lowest-indexed refusal is raised, as the pool alone would.
    `paths` counts the images by where they were decoded: gpu, fallback (the GPU failed them), cpu."""
    gated = await gpu.gate(images)
    first_bad = next((i for i, g in enumerate(gated) if isinstance(g, InvalidMediaError)), len(images))
    results: dict[int, Prepared] = {}
    on_gpu = [i for i in range(first_bad) if isinstance(gated[i], GpuJpeg)]
    if on_gpu:
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineExceededError("deadline passed before the images were decoded")
        try:
            decoded = await gpu.decode([images[i] for i in on_gpu], [gated[i] for i in on_gpu])
        except Exception:  # noqa: BLE001 - the device failed the batch (out of memory, say): the workers decode it
            logger.warning(
                "GPU JPEG decode failed for a batch of %d; decoding it on the CPU", len(on_gpu), exc_info=True
            )
            decoded = [None] * len(on_gpu)
        results = {i: p for i, p in zip(on_gpu, decoded, strict=True) if p is not None}
    on_cpu = [i for i in range(first_bad) if i not in results]
    failed = len(on_gpu) - len(results)
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
