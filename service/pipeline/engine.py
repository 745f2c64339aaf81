"""The request pipeline, free of gRPC/HTTP: bytes -> validate/decode -> preprocess -> runner -> embeddings.

Both front ends (gRPC and HTTP) call `Engine.encode`. Decoding and preprocessing run off the event loop
in the decode pool (isolated worker processes or threads, service/pipeline/decode_pool.py); the model runs on the
runner's single thread that owns the device.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import torch

from mmproc.batching import pixel_transfer_dtype
from mmproc.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    Reason,
    ResourceExhaustedError,
    StaleSessionError,
    UnavailableError,
)
from mmproc.media import MediaLimits
from mmproc.models import VisionEncoder
from mmproc.preprocess import PreprocessConfig, preprocess_image
from mmproc.runner import BatchStats, Runner, RunnerConfig
from mmproc.transport.ipc_pool import IpcPool, SliceDescriptor
from mmproc.transport.leases import MAX_READERS, Lease, UnknownSessionError
from mmproc.types import PreprocessedImage
from service.cache.cache_key import CacheKeys, model_context
from service.cache.cached_encode import EmbeddingCache
from service.cache.embedding_cache import CacheConfig
from service.pipeline.admission import check_patch_budget
from service.pipeline.decode_config import DecodePoolConfig
from service.pipeline.decode_pool import DecodePool
from service.pipeline.key_store import KeyStore, KeyStoreConfig, check_keys
from service.pipeline.overload import OverloadConfig, OverloadGuard
from service.pipeline.request_limits import RequestLimits
from service.process.metrics import Metrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EncodedImage:
    """One image's result. `embedding` is (num_tokens, hidden) on the encoder's device, in its dtype;
    `descriptor` is set when it lies in the IPC pool (then `embedding` is a view of the pool)."""

    index: int
    grid_hw: tuple[int, int]
    num_tokens: int
    embedding: torch.Tensor
    descriptor: SliceDescriptor | None = None
    image_size: tuple[int, int] = (0, 0)  # (width, height) as decoded, after EXIF orientation
    key: str = ""  # the request's key for this image (EncodeImagesRequest.keys), if any
    cache: str = ""  # hit | miss | coalesced | bypass, or "" without a cache (service/cache/cached_encode.py)
    mm_hash: str = ""  # the raw bytes' hash (service/cache/cache_key.py): sent back, a client may ask by it later
    lease: Lease | None = None  # the pool lease `descriptor` lies in (IPC)


def check_deadline(deadline: float | None, where: str) -> None:
    """DEADLINE_EXCEEDED when `deadline` (time.monotonic()) has passed: work for it would be thrown away."""
    if deadline is not None and time.monotonic() >= deadline:
        raise DeadlineExceededError(f"deadline passed {where}")


def check_readers(readers: int) -> None:
    """A request's reader count (1 unless it fans out to tensor-parallel ranks) must be in 1..MAX_READERS."""
    if not 1 <= readers <= MAX_READERS:
        raise InvalidRequestError(f"readers must be in 1..{MAX_READERS}, got {readers}", reason=Reason.BAD_REQUEST)


class Engine:
    def __init__(
        self,
        encoder: VisionEncoder,
        preprocess: PreprocessConfig,
        media_limits: MediaLimits,
        request_limits: RequestLimits,
        runner_config: RunnerConfig,
        *,
        preprocess_workers: int = 2,
        max_inflight_requests: int = 256,
        max_inflight_patches: int = 2_097_152,
        metrics: Metrics | None = None,
        decode: DecodePoolConfig | None = None,
        key_store: KeyStoreConfig | None = None,
        cache: CacheConfig | None = None,
        cache_context: str | None = None,
        overload: OverloadConfig | None = None,
    ) -> None:
        self.encoder = encoder
        self.preprocess = preprocess
        self.media_limits = media_limits
        self.request_limits = request_limits
        decode = decode or DecodePoolConfig(workers=preprocess_workers)
        if encoder.device.type != "cuda":  # only a CUDA encoder normalizes the bytes itself (mmproc/preprocess)
            decode = replace(decode, normalize=True)
        self.decode_pool = DecodePool(media_limits, preprocess, decode)
        self._runner = Runner(
            encoder,
            runner_config,
            max_patches_per_image=preprocess.max_patches_per_image,
            merge_kernel_size=preprocess.merge_kernel_size,
            pin_memory=encoder.device.type == "cuda",
            pixel_dtype=pixel_transfer_dtype(encoder.device, encoder.dtype),
            observer=self._observe_batch,
            company_expected=lambda: self._arriving > 0,
            on_dropped=self._count_dropped,
            batch_patches=lambda: self.overload.batch_patches(),
        )
        patch_bytes = 3 * preprocess.patch_size**2 * 4  # float32 patches, as decode workers ship them
        self.overload = OverloadGuard(
            replace(overload or OverloadConfig(), bytes_per_patch=patch_bytes), queue_wait=self._runner.oldest_wait_s
        )
        self._max_inflight = max_inflight_requests
        self._inflight = 0
        # Patches (from the headers) of the requests in flight: bounds the decoded pixels held at once.
        self._max_inflight_patches = max_inflight_patches
        self._inflight_patches = 0
        self._max_queued_images = runner_config.max_queued_images
        self._decoding_images = 0  # admitted, not yet queued: counted against the runner queue's limit
        self._arriving = 0  # requests admitted and not yet handed to the runner (a batch waits only for these)
        self.keys = KeyStore(key_store or KeyStoreConfig())
        cache = cache or CacheConfig()
        if cache_context is None:  # built without the settings (tests): what this object knows of its model
            cache_context = model_context(
                model=encoder.config.name, model_path=None, dtype=str(encoder.dtype), device_type=encoder.device.type,
                preprocess=preprocess, exif=media_limits.apply_exif_orientation,
            )  # fmt: skip
        self.cache = EmbeddingCache(self, cache, CacheKeys(cache.hash, cache_context)) if cache.enabled else None
        self._cached_requests = 0  # requests in the cache's path (a pure hit never enters `_inflight`)
        self.pool: IpcPool | None = None
        self.ipc_fallbacks = 0
        self.ipc_status = "IPC not set up: serialized only"
        self.ready = False
        self.draining = False
        self.batches_run = 0
        self.videos = (
            None  # service.pipeline.video_engine.VideoService for a model that takes video (service/process/app.py)
        )
        self.metrics = metrics or Metrics()
        self.metrics.track(queue_images=lambda: self._runner.queued_images, inflight_requests=lambda: self._inflight)
        self.metrics.track_decode(lambda: self.decode_pool)
        if self.cache is not None:
            self.metrics.track_cache(self.cache.snapshot)
        self.metrics.track_overload(
            pending_bytes=lambda: self.overload.pending_bytes,
            estimated_wait=self.overload.ahead_s,
            worker_pids=self.decode_pool.worker_pids,
        )

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self, warmup: bool = True) -> None:
        """Start the runner and run one forward so that the first request pays no lazy set-up."""
        self.decode_pool.start()
        self._runner.start()
        if warmup:
            started = time.monotonic()
            size = self.preprocess.patch_size * 2 * max(self.preprocess.merge_kernel_size)
            from PIL import Image

            blank = Image.new("RGB", (size, size), (127, 127, 127))
            image = preprocess_image(blank, self.preprocess, normalize=self.decode_pool.config.normalize)
            self._runner.submit([image]).result(timeout=600)
            logger.info("warm-up forward took %.1f ms", (time.monotonic() - started) * 1000)
        self.ready = True

    def begin_drain(self) -> None:
        """Refuse new requests (UNAVAILABLE); requests already admitted run to completion."""
        self.draining = True

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def queued_images(self) -> int:
        """Images waiting in the encoder's queue."""
        return self._runner.queued_images

    @property
    def idle(self) -> bool:
        """Nothing admitted, decoding, queued or counted against the in-flight patch budget."""
        return not (self._inflight or self._inflight_patches or self._runner.queued_images)

    async def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while (self._inflight or self._cached_requests) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return self._inflight == 0 and self._cached_requests == 0

    def close(self) -> None:
        self._runner.stop()
        self.decode_pool.close()
        if self.pool is not None:
            self._lease_waiters.shutdown(wait=True, cancel_futures=True)
            self.pool.close()

    # -- requests -----------------------------------------------------------------------------------

    def check_image_count(self, count: int) -> None:
        if count == 0:
            raise InvalidRequestError("request has no images", reason=Reason.BAD_REQUEST)
        if count > self.request_limits.max_images:
            raise InvalidRequestError(
                f"{count} images in one request, limit {self.request_limits.max_images}", reason=Reason.TOO_MANY_IMAGES
            )

    def check_request(self, images: list[bytes]) -> int:
        """Request-level limits, checked before any image is decoded; returns the patches the headers ask for."""
        limits = self.request_limits
        self.check_image_count(len(images))
        total = sum(len(data) for data in images)
        if total > limits.max_request_bytes:
            raise InvalidRequestError(
                f"request carries {total} bytes of images, limit {limits.max_request_bytes}",
                reason=Reason.REQUEST_TOO_LARGE,
            )
        return check_patch_budget(images, self.preprocess, limits.max_patches)

    async def encode(
        self,
        images: list[bytes],
        request_id: str,
        deadline: float | None = None,
        *,
        ipc_session: str | None = None,
        readers: int = 1,
        cache: bool = True,
        mm_hashes: Sequence[str] = (),
        lookup_only: bool = False,
    ) -> list[EncodedImage]:
        """Encode all images of one request, or raise a typed mmproc error. `deadline` is time.monotonic().

        Through the embedding cache unless `cache` is False (the request's bypass) or the server has none: an
        image may then be sent as empty bytes with its `mm_hashes` entry to be looked up (UnknownKeyError when not
        cached; with `lookup_only`, a header-only "miss" result instead).
        """
        if not self.ready or self.draining:
            raise UnavailableError("server is draining" if self.draining else "server is not ready")
        check_readers(readers)
        if self.cache is not None and cache:
            self._cached_requests += 1
            try:
                return await self.cache.encode(
                    images, request_id, deadline, ipc_session=ipc_session, readers=readers, mm_hashes=mm_hashes,
                    lookup_only=lookup_only,
                )  # fmt: skip
            finally:
                self._cached_requests -= 1
        if any(not data for data in images) and any(mm_hashes):
            raise InvalidRequestError("lookup by mm_hash needs the cache (bypassed or off)", reason=Reason.BAD_REQUEST)
        results = await self._encode_uncached(images, request_id, deadline, ipc_session=ipc_session, readers=readers)
        if self.cache is None:
            return results
        self.cache.bypassed += len(results)
        return [replace(r, cache="bypass") for r in results]

    async def _encode_uncached(
        self,
        images: list[bytes],
        request_id: str,
        deadline: float | None,
        *,
        ipc_session: str | None,
        readers: int,
    ) -> list[EncodedImage]:
        """The pipeline itself (decode, lease, run), without the cache.

        With `ipc_session` (and a pool attached) the embeddings are written into a pool lease owned by that
        consumer session and carry descriptors; without a lease they come back as plain device tensors.
        `readers`: consumer processes (tensor-parallel ranks) that will read the lease, each acking its own
        word; validated here for every request (1..MAX_READERS), used only for a lease.
        """
        if not self.ready or self.draining:
            raise UnavailableError("server is draining" if self.draining else "server is not ready")
        check_readers(readers)
        patches = self.check_request(images)
        check_deadline(deadline, "before admission")
        if self._inflight >= self._max_inflight:
            raise ResourceExhaustedError(f"too many requests in flight (limit {self._max_inflight})")
        if self._inflight_patches and self._inflight_patches + patches > self._max_inflight_patches:
            raise ResourceExhaustedError(
                f"too many patches in flight ({self._inflight_patches} + {patches}, limit {self._max_inflight_patches})"
            )
        ticket = self.overload.admit(patches, len(images), deadline)  # early refusal, before any work
        try:
            self._reserve_queue(len(images))
        except BaseException:
            self.overload.release(ticket)
            raise
        self._inflight += 1
        self._inflight_patches += patches
        self._arriving += 1
        try:
            try:
                prepared = await self._prepare_all(images, deadline)
                total_patches = sum(p.num_patches for p in prepared)
                if total_patches > self.request_limits.max_patches:
                    raise InvalidRequestError(
                        f"request needs {total_patches} patches, limit {self.request_limits.max_patches}",
                        reason=Reason.TOO_MANY_PATCHES,
                    )
                unannounced = self._admit_decoded(total_patches - patches)
                patches += unannounced
                self.overload.decoded(ticket, total_patches, sum(p.patches.nbytes for p in prepared))
                lease = await self._lease(ipc_session, prepared, deadline, readers) if ipc_session else None
            finally:
                self._arriving -= 1  # _run hands it to the runner next, with no await in between
            try:
                embeddings = await self._run(prepared, deadline, request_id, lease)
            except BaseException:
                if lease is not None:  # the runner's writes to it are stream-ordered before any later lease's
                    self.pool.leases.abandon(lease)
                raise
            descriptors = self._descriptors(prepared, lease) if lease is not None else [None] * len(prepared)
            return [
                EncodedImage(i, p.grid_hw, p.num_tokens, e, d, p.image_size, lease=lease)
                for i, (p, e, d) in enumerate(zip(prepared, embeddings, descriptors))
            ]
        finally:
            self._inflight -= 1
            self._inflight_patches -= patches
            self.overload.release(ticket)

    async def encode_keyed(
        self, images: list[bytes], keys: list[str], request_id: str, deadline: float | None = None
    ) -> list[EncodedImage]:
        """`encode`, keeping each result under its key (service/pipeline/key_store.py) for a later `fetch`. No lease:
        what is kept must be a plain tensor (a pool slice is reused once its reader acked)."""
        check_keys(keys, len(images), self.keys.config)
        results = await self.encode(images, request_id, deadline)
        out = [replace(result, key=key) for result, key in zip(results, keys)]
        for result in out:
            self.keys.put(result.key, result)
        return out

    async def fetch(
        self,
        keys: list[str],
        request_id: str,
        deadline: float | None = None,
        *,
        ipc_session: str | None = None,
        readers: int = 1,
    ) -> list[EncodedImage]:
        """The results kept under `keys`, without encoding (UnknownKeyError for a key not kept). With
        `ipc_session` they are copied (device to device) into one pool lease, as `encode` would write them."""
        if not self.ready or self.draining:
            raise UnavailableError("server is draining" if self.draining else "server is not ready")
        check_readers(readers)
        self.check_image_count(len(keys))
        check_keys(keys, 0, self.keys.config)
        results = self.keys.get(keys)
        if ipc_session is None or self.pool is None:
            return results
        rows = [r.num_tokens for r in results]
        lease = await self._lease_bytes(ipc_session, sum(rows), deadline, readers)
        if lease is None:
            return results
        pool, hidden, dtype = self.pool, self.encoder.output_dim, self.encoder.dtype

        def copy_in() -> None:  # the current stream is the runner's, so the kept rows are written before this
            destination = pool.destination(lease, sum(rows), hidden, dtype)
            torch.cat([r.embedding.to(destination.device) for r in results], out=destination)  # host cache hits: H2D
            pool.mark_ready(lease)
            torch.cuda.current_stream(self.encoder.device).synchronize()

        try:
            await asyncio.get_running_loop().run_in_executor(self._lease_waiters, copy_in)
        except BaseException:
            pool.leases.abandon(lease)
            raise
        row_bytes = hidden * dtype.itemsize
        out, row = [], 0
        for result in results:
            view = pool.destination(lease, sum(rows), hidden, dtype)[row : row + result.num_tokens]
            desc = pool.descriptor(lease, row, result.num_tokens, row_bytes)
            out.append(replace(result, embedding=view, descriptor=desc))
            row += result.num_tokens
        return out

    async def _run(
        self, prepared: list[PreprocessedImage], deadline: float | None, request_id: str, lease: Lease | None
    ) -> list[torch.Tensor]:
        output = on_written = None
        written: list[torch.cuda.Event] = []
        if lease is not None:
            pool, hidden, dtype = self.pool, self.encoder.output_dim, self.encoder.dtype
            output = lambda rows: pool.destination(lease, rows, hidden, dtype)  # noqa: E731

            def on_written() -> None:  # runner thread, right after the request's last forward was enqueued
                pool.mark_ready(lease)
                written.append(torch.cuda.Event(blocking=True))  # its waiter sleeps, not spins (a core each)
                written[0].record()

        if deadline is not None and time.monotonic() >= deadline:  # before batching: never queued
            self._count_dropped("batching", len(prepared))
            raise DeadlineExceededError(f"request {request_id}: deadline passed before it reached the encoder")
        future = self._runner.submit(prepared, deadline, output=output, on_written=on_written)
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            embeddings = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
            if written:
                # Reply once the slice is written, so the consumer's wait on the ready word never stalls its
                # stream on our compute; the ready word stays the stream-ordered guarantee.
                await asyncio.get_running_loop().run_in_executor(self._lease_waiters, written[0].synchronize)
        except asyncio.TimeoutError:
            raise DeadlineExceededError(f"request {request_id} did not finish before its deadline") from None
        if deadline is not None and time.monotonic() >= deadline:  # before delivery: nobody waits for it
            self._count_dropped("delivery", len(prepared))
            raise DeadlineExceededError(f"request {request_id} finished after its deadline; not delivered")
        return embeddings

    # -- IPC ----------------------------------------------------------------------------------------

    def attach_ipc_pool(self, pool: IpcPool, *, fallback: bool) -> None:
        """Serve IPC requests from `pool`. fallback: when the pool stays full, reply serialized instead of
        RESOURCE_EXHAUSTED."""
        self.pool = pool
        self._ipc_fallback = fallback
        self.metrics.track_ipc(pool.stats, pool.config.pool_bytes)
        if self.cache is not None:
            self.cache.attach_pool(pool)
        self._lease_waiters = ThreadPoolExecutor(max_workers=8, thread_name_prefix="mmproc-lease")

    async def _lease(
        self, session: str, prepared: list[PreprocessedImage], deadline: float | None, readers: int
    ) -> Lease | None:
        """A pool lease for the whole request, read by `readers` consumers, or None to reply serialized.

        Waits for space at most half of the time left before the deadline (the other half is for the work),
        off the event loop; then falls back (counted, logged once) or refuses, as configured.
        """
        return await self._lease_bytes(session, sum(p.num_tokens for p in prepared), deadline, readers)

    async def _lease_bytes(self, session: str, rows: int, deadline: float | None, readers: int) -> Lease | None:
        if self.pool is None:
            return None
        nbytes = rows * self.encoder.output_dim * self.encoder.dtype.itemsize
        now = time.monotonic()
        wait_until = now + (deadline - now) / 2 if deadline is not None else now + 1.0
        loop = asyncio.get_running_loop()
        try:
            lease = await loop.run_in_executor(
                self._lease_waiters,
                lambda: self.pool.leases.acquire(session, nbytes, deadline=wait_until, readers=readers),
            )
        except UnknownSessionError:
            raise StaleSessionError(f"IPC session {session} is unknown or closed; open a new one") from None
        if lease is not None:
            return lease
        if not self._ipc_fallback:
            raise ResourceExhaustedError(f"IPC pool full: no {nbytes}-byte slice freed in time")
        self.ipc_fallbacks += 1
        self.metrics.ipc_fallbacks.inc()
        if self.ipc_fallbacks == 1:
            logger.warning("IPC pool full past the wait: replying serialized (counted in ipc fallbacks; logged once)")
        return None

    def _descriptors(self, prepared: list[PreprocessedImage], lease: Lease) -> list[SliceDescriptor]:
        """One descriptor per image, all in the request's one lease (same ready word and reader ack words)."""
        row_bytes = self.encoder.output_dim * self.encoder.dtype.itemsize
        out, row = [], 0
        for image in prepared:
            out.append(self.pool.descriptor(lease, row, image.num_tokens, row_bytes))
            row += image.num_tokens
        return out

    def _admit_decoded(self, extra: int) -> int:
        """Patches the headers did not announce (a header the peek could not size, or one that lied) join the
        in-flight count once decoded, before any of them reaches the runner: RESOURCE_EXHAUSTED when that
        passes `max_inflight_patches`. Returns what was added (0 when the headers told all)."""
        if extra <= 0:
            return 0
        if self._inflight_patches + extra > self._max_inflight_patches:
            raise ResourceExhaustedError(
                f"too many patches in flight ({self._inflight_patches} + {extra} found by decoding, "
                f"limit {self._max_inflight_patches})"
            )
        self._inflight_patches += extra
        return extra

    def _reserve_queue(self, count: int) -> None:
        """Refuse before decoding when the runner queue could not take the images anyway (fast 429), counting
        images still being decoded for admitted requests; released by `_prepare_all`."""
        queued = self._runner.queued_images + self._decoding_images
        if queued + count > self._max_queued_images:
            limit = self._max_queued_images
            raise ResourceExhaustedError(f"encoder queue full ({queued} images queued or decoding, limit {limit})")
        self._decoding_images += count

    async def _prepare_all(self, images: list[bytes], deadline: float | None) -> list[PreprocessedImage]:
        try:
            results = await self.decode_pool.prepare_all(images, deadline)  # the first bad image, by position
        except DeadlineExceededError:
            self._count_dropped("decode", len(images))
            raise
        finally:
            self._decoding_images -= len(images)
        decode, preprocess = self.metrics.stage("decode"), self.metrics.stage("preprocess")
        for result in results:
            decode.observe(result.decode_s)
            preprocess.observe(result.preprocess_s)
        return [result.image for result in results]

    def _observe_batch(self, stats: BatchStats) -> None:
        self.batches_run += 1
        if self.ready:  # the warm-up forward is not traffic (nor a fair sample of the service rate)
            self.metrics.observe_batch(stats)
            self.overload.forward.observe(stats.forward_s, stats.num_patches)

    def _count_dropped(self, stage: str, images: int) -> None:
        """Images of expired or cancelled requests dropped unencoded (or undelivered), by stage. Any thread."""
        self.metrics.dropped_images.labels(stage).inc(images)
