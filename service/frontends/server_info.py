"""The ServerInfo reply (model, preprocessing, limits, transports, prompt framing, key store, video, cache), built
once at start-up from the settings and the engine."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import mmproc
from mmproc.prompt import FRAMINGS, framing, placeholder_token_id
from mmproc.units import MiB
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire import NAME_TO_PB
from service.pipeline.engine import Engine
from service.pipeline.video_engine import video_info
from service.process.settings import ServerSettings

logger = logging.getLogger(__name__)


def build_server_info(settings: ServerSettings, engine: Engine) -> pb.ServerInfo:
    encoder, pre, media, req = engine.encoder, engine.preprocess, engine.media_limits, engine.request_limits
    cfg = encoder.config
    return pb.ServerInfo(
        version=mmproc.__version__,
        model_name=cfg.name,
        model_layout=cfg.family,  # deprecated alias of family (protos/mmproc/v1/encoder.proto)
        hidden_size=encoder.output_dim,
        vision_hidden_size=cfg.hidden_size,
        dtype=NAME_TO_PB[settings.torch_dtype_name],
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
        transports=[pb.TRANSPORT_SERIALIZED] + ([pb.TRANSPORT_IPC] if engine.pool is not None else []),
        ipc_status=engine.ipc_status,
        max_message_bytes=settings.max_message_mb * MiB,
        stream_chunk_bytes=settings.stream_chunk_bytes,
        family=pre.family,
        prompt=prompt_info(pre.family, settings.model_path),
        key_store=pb.KeyStoreInfo(
            max_bytes=engine.keys.config.max_bytes, ttl_s=engine.keys.config.ttl_s, max_keys=engine.keys.config.max_keys
        ),
        video=video_info(engine.videos),
        cache=cache_info(engine),
    )


def cache_info(engine: Engine) -> pb.CacheInfo:
    cache = engine.cache
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
