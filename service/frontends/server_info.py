"""The ServerInfo reply (model, preprocessing, limits, transports, prompt framing, key store, video, cache), built
once at start-up from the settings and the pipeline."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import mmproc
from mmproc.prompt import FRAMINGS, VIDEO_FRAMINGS, framing, placeholder_token_id
from mmproc.transport.cuda_ipc.node import node_identity
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.dtypes import NAME_TO_PB
from service.pipeline.requests import RequestPipeline
from service.pipeline.videos import VideoPipeline

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedAs:
    """What the settings decided about the reply that the pipeline does not know: handed down by the app."""

    dtype_name: str
    quantization: str
    max_message_bytes: int
    stream_chunk_bytes: int
    model_path: Path | None


def build_server_info(served: ServedAs, pipeline: RequestPipeline) -> pb.ServerInfo:
    encoder, pre, media, req = pipeline.encoder, pipeline.preprocess, pipeline.media_limits, pipeline.request_limits
    cfg = encoder.config
    names, by_name = pipeline.delivery.transports, pipeline.transports.by_name
    return pb.ServerInfo(
        version=mmproc.__version__,
        model_name=cfg.name,
        model_layout=cfg.family,  # deprecated alias of family (protos/mmproc/v1/encoder.proto)
        hidden_size=encoder.output_dim,
        vision_hidden_size=cfg.hidden_size,
        dtype=NAME_TO_PB[served.dtype_name],
        quantization=served.quantization,
        device=str(encoder.device),
        preprocess=pb.PreprocessInfo(
            family=pre.family,
            patch_size=pre.patch_size,
            merge_h=pre.merge_kernel_size[0],
            merge_w=pre.merge_kernel_size[1],
            max_patches_per_image=pre.max_patches_per_image,
            rules={k: json.dumps(v) for k, v in pre.to_public_dict().items()},
        ),
        limits=pb.RequestLimits(
            max_image_bytes=media.max_image_bytes,
            max_pixels=media.max_pixels,
            max_images_per_request=req.max_images,
            max_request_bytes=req.max_request_bytes,
            max_patches_per_request=req.max_patches,
            max_aspect_ratio=media.max_aspect_ratio,
            formats=sorted(media.allowed_formats),
        ),
        transports=[by_name[t].wire for t in names if by_name[t].wire != pb.TRANSPORT_AUTO],
        transport_names=names,
        node_boot_id=node_identity()[1],
        ipc_status=pipeline.ipc_status,
        max_message_bytes=served.max_message_bytes,
        stream_chunk_bytes=served.stream_chunk_bytes,
        family=pre.family,
        prompt=prompt_info(pre.family, served.model_path),
        key_store=pb.KeyStoreInfo(
            max_bytes=pipeline.keys.config.max_bytes,
            ttl_s=pipeline.keys.config.ttl_s,
            max_keys=pipeline.keys.config.max_keys,
        ),
        video=video_info(pipeline.videos),
        cache=cache_info(pipeline),
    )


def cache_info(pipeline: RequestPipeline) -> pb.CacheInfo:
    cache = pipeline.cache
    if cache is None:
        return pb.CacheInfo()
    config = cache.config
    return pb.CacheInfo(
        host_max_bytes=cache.host.max_bytes,
        pool_max_bytes=cache.pool_store.max_bytes if cache.pool_store is not None else 0,
        policy=config.policy,
        hash=config.hash,
        invalid_ttl_s=config.invalid_ttl_s,
    )


def prompt_info(family: str, model_path: Path | None) -> pb.PromptFraming:
    """The family's prompt framing (mmproc.prompt) and the placeholder's id from the checkpoint's config.json;
    empty for a family mmproc.prompt does not list yet (engines then need their own framing)."""
    if family not in FRAMINGS:
        logger.warning("no prompt framing for family %s in mmproc.prompt: ServerInfo.prompt is empty", family)
        return pb.PromptFraming()
    frame = framing(family)
    info = pb.PromptFraming(
        image_header=frame.image_header, placeholder=frame.placeholder, image_footer=frame.image_footer
    )
    config_file = None if model_path is None else model_path / "config.json"
    if config_file is not None and config_file.is_file():
        token_id = placeholder_token_id(json.loads(config_file.read_text()))
        if token_id is not None:
            info.placeholder_token_id = token_id
    return info


def video_info(videos: VideoPipeline | None) -> pb.VideoInfo:
    """ServerInfo.video: what a client may send and how its prompt frames the chunks."""
    if videos is None:
        return pb.VideoInfo(supported=False)
    rules, limits, request = videos.rules, videos.limits, videos.request_limits
    framing = VIDEO_FRAMINGS[videos.pipeline.encoder.config.family]
    return pb.VideoInfo(
        supported=True,
        fps=rules.fps,
        temporal_patch_size=rules.temporal_patch_size,
        max_patches_per_frame=rules.max_patches,
        max_videos_per_request=request.max_videos,
        max_video_bytes=limits.max_video_bytes,
        max_duration_s=limits.max_duration_s,
        max_fps=limits.max_fps,
        max_pixels=limits.max_pixels,
        max_sampled_frames_per_video=limits.max_sampled_frames,
        max_sampled_frames_per_request=request.max_sampled_frames,
        max_sample_fps=limits.max_sample_fps,
        containers=sorted(limits.allowed_containers),
        codecs=sorted(limits.allowed_codecs),
        chunk_header=framing.chunk_header,
        placeholder=framing.placeholder,
        chunk_footer=framing.chunk_footer,
    )
