"""The request pipeline, free of gRPC/HTTP: admit -> (cache) -> decode -> run -> deliver, each step an object with
its own state (docs/architecture.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from mmproc.batching import pixel_transfer_dtype
from mmproc.errors import ConfigError, InvalidRequestError, Reason
from mmproc.media.limits import MediaLimits
from mmproc.models import VisionEncoder
from mmproc.preprocess import PreprocessConfig, preprocess_image
from mmproc.runner import BatchStats, Runner
from mmproc.transport.producer import Producer
from mmproc.types import PreprocessedImage
from mmproc.wire.results import EncodedImage
from mmproc.wire.transports import BY_BYTES, Table, Via
from service.observe.metrics import Metrics
from service.pipeline.admission import Admission, check_readers
from service.pipeline.cache.cached_encode import EmbeddingCache
from service.pipeline.cache.keys import CacheKeys, model_context
from service.pipeline.config import PipelineConfig
from service.pipeline.decode.config import DecodePoolConfig
from service.pipeline.decode.gpu import GpuDecoder
from service.pipeline.decode.pool import DecodePool
from service.pipeline.decode.step import DecodeStep
from service.pipeline.delivery import Delivery, delivered
from service.pipeline.forward_step import ForwardStep, count_dropped
from service.pipeline.key_store import KeyStore, check_keys
from service.pipeline.overload import OverloadGuard

__all__ = ["EncodedImage", "RequestPipeline"]

logger = logging.getLogger(__name__)


class RequestPipeline:
    def __init__(
        self,
        encoder: VisionEncoder,
        preprocess: PreprocessConfig,
        config: PipelineConfig | None = None,
        metrics: Metrics | None = None,
        transports: Table | None = None,
    ) -> None:
        config = config or PipelineConfig()
        self.transports = transports or Table()  # what front ends ask for a request's route and reply
        self.encoder = encoder
        self.preprocess = preprocess
        self.config = config
        self.media_limits = config.media
        self.request_limits = config.request
        self.metrics = metrics = metrics or Metrics()
        decode = config.decode
        runner = Runner(
            encoder,
            config.runner,
            max_patches_per_image=preprocess.max_patches_per_image,
            merge_kernel_size=preprocess.merge_kernel_size,
            pin_memory=encoder.device.type == "cuda",
            pixel_dtype=pixel_transfer_dtype(encoder.device, encoder.dtype),
            observer=self._observe_batch,
            company_expected=lambda: self.admission.arriving > 0,
            on_dropped=lambda stage, images: count_dropped(metrics, stage, images),
            batch_patches=lambda: self.overload.batch_patches(),
        )
        patch_bytes = 3 * preprocess.patch_size**2 * (4 if decode.normalize else 1)  # as decode workers ship them
        overload = replace(
            config.overload, bytes_per_patch=patch_bytes, max_batch_patches=config.runner.max_batch_patches
        )
        self.overload = OverloadGuard(
            overload, queue_wait=self._sojourn_s, encoder_queue=lambda: (runner.queued_images, runner.queued_patches)
        )
        self.admission = Admission(
            config.request, config.inflight, preprocess, self.overload,
            max_queued_images=config.runner.max_queued_images, queued_images=lambda: runner.queued_images,
        )  # fmt: skip
        gpu = self._gpu_decoder(config.gpu_decode, config.media, decode)
        self.decode = DecodeStep(DecodePool(config.media, preprocess, decode), self.admission, metrics, gpu)
        self.run = ForwardStep(runner, metrics)
        self.delivery = Delivery(encoder.output_dim, encoder.dtype, metrics, config.replies)
        self.keys = KeyStore(config.key_store)
        self.cache = self._build_cache(config)
        self.ipc_status = "transports: serialized only (none started)"
        self.batches_run = 0
        self.videos = None  # a VideoPipeline for a model that takes video
        metrics.track(queue_images=lambda: runner.queued_images, inflight_requests=lambda: self.admission.inflight)
        metrics.track_decode(lambda: self.decode.pool)
        if self.cache is not None:
            metrics.track_cache(self.cache.snapshot)
        metrics.track_overload(
            pending_bytes=lambda: self.overload.pending_bytes,
            estimated_wait=self.overload.ahead_s,
            estimate_overrun=lambda: self.overload.overrun.seconds,
            forward_cost={
                "fixed": lambda: self.overload.forward.fixed_s,
                "per_patch": lambda: self.overload.forward.per_patch_s,
                "per_image": lambda: self.overload.forward.per_image_s,
            },
            worker_pids=lambda: self.decode.pool.worker_pids(),
        )

    def _sojourn_s(self) -> float:
        """How long a request arriving now waits before its forward: the longer decoder wait, then the encoder's."""
        decode = self.decode
        waits = decode.pool.waits.oldest_s()
        if decode.gpu is not None:
            waits = max(waits, decode.gpu.waits.oldest_s())
        return waits + self.run.runner.oldest_wait_s()

    def _gpu_decoder(self, mode: str, limits: MediaLimits, decode: DecodePoolConfig) -> GpuDecoder | None:
        """A GPU JPEG decoder when `mode` allows and the encoder can use one; "on" without one is a ConfigError."""
        if mode == "off":
            return None
        why = "the encoder is not on CUDA" if self.encoder.device.type != "cuda" else ""
        why = why or ("gpu_preprocess is off" if decode.normalize else "")
        if not why:
            try:
                return GpuDecoder(limits, self.preprocess, self.encoder.device)
            except Exception as exc:  # noqa: BLE001 - no nvImageCodec, or it cannot start here: say so, or refuse
                why = f"{type(exc).__name__}: {exc}"
        if mode == "on":
            raise ConfigError(f"gpu_decode=on, but {why}")
        logger.log(logging.INFO if self.encoder.device.type == "cuda" else logging.DEBUG,
                   "JPEGs are decoded on the CPU (GPU decode unavailable: %s)", why)  # fmt: skip
        return None

    def _build_cache(self, config: PipelineConfig) -> EmbeddingCache | None:
        if not config.cache.enabled:
            return None
        context = config.cache_context
        if context is None:  # built without the settings (tests): what this object knows of its model
            encoder = self.encoder
            context = model_context(
                model=encoder.config.name, model_path=None, dtype=str(encoder.dtype), device_type=encoder.device.type,
                preprocess=self.preprocess, exif=config.media.apply_exif_orientation,
            )  # fmt: skip
        if self.decode.gpu is not None:  # GPU-decoded JPEGs differ from the CPU's in rare pixels
            context += "|jpeg=gpu"
        keys = CacheKeys(config.cache.hash, context)
        return EmbeddingCache(config.cache, keys, self.admission, self.delivery, self._encode_uncached)

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self, warmup: bool = True) -> None:
        """Start the runner and run one forward so that the first request pays no lazy set-up."""
        self.decode.pool.start()
        if self.decode.gpu is not None:
            self.decode.gpu.warm_up()
        self.run.runner.start()
        if warmup:
            started = time.monotonic()
            size = self.preprocess.patch_size * 2 * max(self.preprocess.merge_kernel_size)
            self.run.runner.submit([self._blank_image(size, size)]).result(timeout=600)
            logger.info("warm-up forward took %.1f ms", (time.monotonic() - started) * 1000)
            self._capture_graphs(self.config.graph_warmup_sizes)
        self.admission.ready = True

    def _blank_image(self, width: int, height: int) -> PreprocessedImage:
        """A grey image of that size, preprocessed as the decoders hand images to the runner."""
        from PIL import Image

        blank = Image.new("RGB", (width, height), (127, 127, 127))
        return preprocess_image(blank, self.preprocess, normalize=self.decode.pool.config.normalize)

    def _capture_graphs(self, sizes: tuple[tuple[int, int], ...]) -> None:
        """Capture the CUDA graphs of batches of 1..n images of each size now: a capture under load stalls the
        runner (docs/benchmarks/overload.md). n is bounded by the graph cache and the runner's batch bounds."""
        graphs = self.encoder.graphs
        if not sizes or graphs is None or self.encoder.device.type != "cuda":
            return
        started, runner = time.monotonic(), self.config.runner
        for width, height in sizes:
            image = self._blank_image(width, height)
            if image.num_patches > graphs.max_image_patches:
                logger.warning("no CUDA graphs for %dx%d images: over cuda_graph_max_image_patches", width, height)
                continue
            per_batch = min(graphs.max_patches, runner.max_batch_patches) // image.num_patches
            for count in range(1, min(graphs.capacity // len(sizes), per_batch, runner.max_batch_images) + 1):
                for _ in range(graphs.min_hits):  # seen min_hits times: captured
                    self.run.runner.submit([image] * count).result(timeout=600)
        logger.info(
            "%d CUDA graphs captured for %s in %.1f s",
            len(graphs.graphs), ", ".join(f"{w}x{h}" for w, h in sizes), time.monotonic() - started,
        )  # fmt: skip

    def begin_drain(self) -> None:
        """Refuse new requests (UNAVAILABLE); requests already admitted run to completion."""
        self.admission.draining = True

    @property
    def ready(self) -> bool:
        return self.admission.ready

    @property
    def draining(self) -> bool:
        return self.admission.draining

    @property
    def pool(self):  # noqa: ANN201 (an IpcPool: the Session stream and server info of the CUDA IPC transport)
        """The pool transport's pool, or None (serialized only)."""
        return next((p.pool for p in self.delivery.producers.values() if getattr(p, "pool", None)), None)

    @property
    def decode_pool(self) -> DecodePool:
        return self.decode.pool

    @property
    def inflight(self) -> int:
        return self.admission.inflight

    @property
    def queued_images(self) -> int:
        """Images waiting in the encoder's queue."""
        return self.run.runner.queued_images

    @property
    def idle(self) -> bool:
        """Nothing admitted, decoding, queued or counted against the in-flight patch budget."""
        a = self.admission
        return not (a.inflight or a.inflight_patches or self.run.runner.queued_images)

    async def wait_idle(self, timeout: float) -> bool:
        a = self.admission
        deadline = time.monotonic() + timeout
        while (a.inflight or a.cached_requests) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return a.inflight == 0 and a.cached_requests == 0

    def close(self) -> None:
        self.run.runner.stop()
        self.decode.pool.close()
        if self.decode.gpu is not None:
            self.decode.gpu.close()
        self.delivery.close()

    def attach(self, producer: Producer, *, fallback: bool) -> None:
        """Serve requests for a started transport. fallback: with no room in time, reply serialized rather than
        RESOURCE_EXHAUSTED. A pool transport also lends the embedding cache its pool tier."""
        self.delivery.attach(producer, fallback=fallback)
        pool = getattr(producer, "pool", None)
        if pool is not None:
            self.metrics.track_ipc(pool.stats, pool.config.pool_bytes)
            if self.cache is not None:
                self.cache.attach_pool(pool)

    # -- requests -----------------------------------------------------------------------------------

    def check_image_count(self, count: int) -> None:
        self.admission.check_image_count(count)

    def check_door(self, *, sheddable: bool = False) -> None:
        """Refuse now what the door would refuse whatever the request but its priority (Admission.check_door)."""
        self.admission.check_door(sheddable=sheddable)

    async def encode(
        self,
        images: list[bytes],
        request_id: str,
        deadline: float | None = None,
        *,
        via: Via = BY_BYTES,
        readers: int = 1,
        cache: bool = True,
        mm_hashes: Sequence[str] = (),
        lookup_only: bool = False,
    ) -> list[EncodedImage]:
        """Encode all images of one request, or raise a typed mmproc error. `deadline` is time.monotonic().

        Through the embedding cache unless `cache` is False: an empty image with its `mm_hashes` entry is looked
        up (UnknownKeyError, or with `lookup_only` a header-only "miss"). `via` a pool transport: the embeddings
        lie in it for `readers` consumers, with handles."""
        self.admission.check_open()
        check_readers(readers)
        if self.cache is not None and cache:
            with self.admission.cached():
                return await self.cache.encode(
                    images, request_id, deadline, via=via, readers=readers, mm_hashes=mm_hashes,
                    lookup_only=lookup_only,
                )  # fmt: skip
        if any(not data for data in images) and any(mm_hashes):
            raise InvalidRequestError("lookup by mm_hash needs the cache (bypassed or off)", reason=Reason.BAD_REQUEST)
        results = await self._encode_uncached(images, request_id, deadline, via=via, readers=readers)
        if self.cache is None:
            return results
        self.cache.bypassed += len(results)
        return [replace(r, cache="bypass") for r in results]

    async def _encode_uncached(
        self, images: list[bytes], request_id: str, deadline: float | None, *, via: Via, readers: int
    ) -> list[EncodedImage]:
        """The steps themselves, without the cache."""
        admission = self.admission
        patches = admission.check_request(images)
        with admission.admit(patches, len(images), deadline, reserve=len(images)) as admitted:
            prepared = await self.decode.images(images, deadline, admitted)
            admission.decoded(admitted, prepared)
            rows = sum(p.num_tokens for p in prepared)
            destination = await self.delivery.destination(via, rows, deadline, readers)
            admission.handed_over(admitted)  # the run step submits next, with no await in between
            embeddings = await self.run(prepared, deadline, request_id, destination)
            return delivered(destination, prepared, embeddings)

    async def encode_keyed(
        self, images: list[bytes], keys: list[str], request_id: str, deadline: float | None = None
    ) -> list[EncodedImage]:
        """`encode`, keeping each result under its key for a later `fetch`; no lease (a pool slice is reused)."""
        check_keys(keys, len(images), self.keys.config)
        results = await self.encode(images, request_id, deadline)
        out = [replace(result, key=key) for result, key in zip(results, keys)]
        for result in out:
            self.keys.put(result.key, result)
        return out

    async def fetch(
        self, keys: list[str], request_id: str, deadline: float | None = None, *, via: Via = BY_BYTES, readers: int = 1
    ) -> list[EncodedImage]:
        """The results kept under `keys` (UnknownKeyError otherwise); copied into one destination `via` a pool."""
        self.admission.check_open()
        check_readers(readers)
        self.check_image_count(len(keys))
        check_keys(keys, 0, self.keys.config)
        results = self.keys.get(keys)
        rows = [r.num_tokens for r in results]
        destination = await self.delivery.destination(via, sum(rows), deadline, readers)
        output, on_written = destination.output(), destination.on_written()
        if output is None or on_written is None:
            return results

        def copy_in() -> torch.Tensor:  # the current stream is the runner's, so the kept rows are written before this
            whole = output(sum(rows))
            torch.cat([r.embedding.to(whole.device) for r in results], out=whole)  # host cache hits: H2D
            on_written()
            if whole.is_cuda:  # a destination in host memory is written once cat returns
                torch.cuda.current_stream(self.encoder.device).synchronize()
            return whole

        try:
            whole = await asyncio.get_running_loop().run_in_executor(None, copy_in)
        except BaseException:
            destination.abandon()
            raise
        out, row = [], 0
        for result, handle in zip(results, destination.deliver(rows)):
            out.append(replace(result, embedding=whole[row : row + result.num_tokens], handle=handle))
            row += result.num_tokens
        return out

    def _observe_batch(self, stats: BatchStats) -> None:
        self.batches_run += 1
        if self.ready:  # the warm-up forward is not traffic (nor a fair sample of the service rate)
            self.metrics.observe_batch(stats)
            self.overload.forward.observe(stats.forward_s, stats.num_patches, stats.num_images)
