"""Settings -> the frozen configs the core takes. Every core config the server uses is built here, once, at the
edge; the defaults live in the dataclasses themselves and the settings take theirs from them (service/app/settings.py,
tests/service/app/test_config_defaults.py)."""

from __future__ import annotations

from mmproc.media.limits import MediaLimits
from mmproc.media.video_limits import VideoLimits
from mmproc.runner_config import RunnerConfig
from mmproc.transport.cuda_ipc.config import PoolConfig
from mmproc.transport.nixl.config import NAME as NIXL
from mmproc.transport.nixl.config import NixlConfig
from mmproc.units import MiB
from service.app.model_settings import image_sizes
from service.app.settings import ServerSettings
from service.pipeline.cache.store import CacheConfig
from service.pipeline.config import PipelineConfig
from service.pipeline.decode.config import DecodePoolConfig
from service.pipeline.key_store import KeyStoreConfig
from service.pipeline.overload import CPU_BATCH_SHARE, OverloadConfig
from service.pipeline.reply_budget import ReplyBudgetConfig
from service.pipeline.request_limits import InflightLimits, RequestLimits, VideoRequestLimits


def media_limits(s: ServerSettings) -> MediaLimits:
    return MediaLimits(
        max_image_bytes=s.max_image_mb * MiB,
        max_pixels=s.max_pixels,
        max_aspect_ratio=s.max_aspect_ratio,
        max_jpeg_scans=s.max_jpeg_scans,
        max_jpeg_passes=s.max_jpeg_passes,
        max_chunks=s.max_chunks,
        max_rle_ratio=s.max_rle_ratio,
        apply_exif_orientation=s.apply_exif_orientation,
    )


def request_limits(s: ServerSettings) -> RequestLimits:
    return RequestLimits(
        max_images=s.max_images_per_request,
        max_request_bytes=s.max_request_mb * MiB,
        max_patches=s.max_patches_per_request,
    )


def inflight_limits(s: ServerSettings) -> InflightLimits:
    return InflightLimits(max_requests=s.max_inflight_requests, max_patches=s.max_inflight_patches)


def video_limits(s: ServerSettings) -> VideoLimits:
    return VideoLimits(
        max_video_bytes=min(s.max_video_mb, s.max_request_mb) * MiB,  # a video is one request at most
        max_duration_s=s.max_video_duration_s,
        max_fps=s.max_video_fps,
        max_pixels=s.max_video_pixels,
        max_sampled_frames=s.max_sampled_frames_per_video,
        max_decode_megapixels=s.max_video_decode_megapixels,
        decode_cpu_s=s.video_decode_cpu_s,
        max_sample_fps=s.max_video_sample_fps,
    )


def video_request_limits(s: ServerSettings) -> VideoRequestLimits:
    return VideoRequestLimits(
        max_videos=s.max_videos_per_request,
        max_request_bytes=s.max_request_mb * MiB,
        max_sampled_frames=s.max_sampled_frames_per_request,
    )


def decode_config(s: ServerSettings) -> DecodePoolConfig:
    memory_mb = s.decode_worker_memory_mb
    if memory_mb is None:  # peak measured at ~11.5 B per decoded pixel (docs/reliability.md); 2x margin
        memory_mb = (24 * s.max_pixels) // MiB + 128
    return DecodePoolConfig(
        isolation=s.decode_isolation,
        workers=s.decode_workers,
        worker_memory_mb=memory_mb,
        timeout_s=s.decode_timeout_s,
        budget_base_s=s.decode_budget_base_s,
        budget_per_mp_s=s.decode_budget_per_mp_s,
        request_cpu_s=s.decode_request_cpu_s,
        request_megapixels=s.decode_request_megapixels,
        log_level=s.log_level,
        log_json=s.log_json,
        normalize=not (s.gpu_preprocess and s.device.startswith("cuda")),
    )


def runner_config(s: ServerSettings, image_patches: int = 0) -> RunnerConfig:
    """`image_patches`: the most one image of the model may have. A batch must hold one, so unless
    max_batch_patches was set, it follows the model (Qwen3-VL's pixel budget allows 65,536 patches an image)."""
    batch = (
        s.max_batch_patches if "max_batch_patches" in s.model_fields_set else max(s.max_batch_patches, image_patches)
    )
    return RunnerConfig(
        max_batch_patches=batch,
        max_batch_images=s.max_batch_images,
        max_wait_ms=s.max_wait_ms,
        max_queued_images=s.max_queued_images,
        queue_discipline=s.queue_discipline,
        lifo_after_ms=s.lifo_after_ms,
    )


def overload_config(s: ServerSettings) -> OverloadConfig:
    return OverloadConfig(
        max_queue_delay_s=s.max_queue_delay_ms / 1000,
        max_pending_bytes=s.max_pending_mb * MiB,
        batch_share=CPU_BATCH_SHARE if s.device == "cpu" else OverloadConfig.batch_share,
    )


def reply_budget_config(s: ServerSettings) -> ReplyBudgetConfig:
    return ReplyBudgetConfig(max_bytes=s.max_reply_mb * MiB, pinned_bytes=s.pinned_reply_bytes)


def key_store_config(s: ServerSettings) -> KeyStoreConfig:
    return KeyStoreConfig(max_bytes=s.key_store_mb * MiB, ttl_s=s.key_store_ttl_s, max_keys=s.key_store_max_keys)


def cache_config(s: ServerSettings) -> CacheConfig:
    if s.cache_mb == 0:  # --cache-mb 0: no cache at all
        return CacheConfig(host_bytes=0, pool_bytes=0)
    return CacheConfig(
        host_bytes=s.cache_mb * MiB,
        pool_bytes=s.cache_ipc_mb * MiB,
        policy=s.cache_policy,
        hash=s.cache_hash,
        invalid_ttl_s=s.cache_invalid_ttl_s,
    )


def ipc_pool_config(s: ServerSettings) -> PoolConfig:
    return PoolConfig(pool_bytes=s.ipc_pool_mb * MiB, num_word_slots=s.ipc_word_slots, ttl_s=s.ipc_ttl_s)


def transport_configs(s: ServerSettings) -> dict[str, object]:
    """Each transport's own config, by its name in the table (mmproc/wire/transports.py)."""
    return {"ipc": ipc_pool_config(s), NIXL: nixl_config(s)}


def nixl_config(s: ServerSettings) -> NixlConfig:
    return NixlConfig(
        enabled=s.nixl or s.transport == NIXL, net_devices=s.nixl_net_devices, ucx_tls=s.nixl_ucx_tls, port_range=s.nixl_port_range,
        pool_bytes=s.nixl_pool_mb * MiB, ttl_s=s.nixl_ttl_s, transfer_timeout_s=s.nixl_transfer_timeout_s,
    )  # fmt: skip


def pipeline_config(s: ServerSettings, *, cache_context: str, image_patches: int = 0) -> PipelineConfig:
    """Everything the pipeline takes besides its model; `cache_context` and `image_patches` (the most one image
    has) need the loaded model (service/app/build.py)."""
    return PipelineConfig(
        media=media_limits(s),
        request=request_limits(s),
        inflight=inflight_limits(s),
        runner=runner_config(s, image_patches),
        decode=decode_config(s),
        key_store=key_store_config(s),
        cache=cache_config(s),
        overload=overload_config(s),
        replies=reply_budget_config(s),
        cache_context=cache_context,
        gpu_decode=s.gpu_decode,
        graph_warmup_sizes=image_sizes(s.cuda_graph_warmup_sizes),
    )
