"""The pipeline built from the settings: the model loaded (or a preset), checked before any port is bound, the
transports and video started, and what server info needs of the settings."""

from __future__ import annotations

from pathlib import Path

import torch

from mmproc.errors import ConfigError
from mmproc.models import PRESETS, VisionEncoder, load_encoder
from mmproc.models.loader import check_checkpoint, read_config
from mmproc.models.quantize import apply_quantization, check_fp8_device
from mmproc.preprocess import PreprocessConfig, load_preprocess_config
from mmproc.units import MiB
from mmproc.wire.transports import Table
from service.app import configs
from service.app.settings import ServerSettings
from service.app.transports import start_transports
from service.app.video_setup import build_video_pipeline
from service.frontends.server_info import ServedAs
from service.observe.metrics import Metrics
from service.pipeline.cache.keys import model_context
from service.pipeline.requests import RequestPipeline


def load_model(settings: ServerSettings) -> tuple[VisionEncoder, PreprocessConfig]:
    dtype = getattr(torch, settings.torch_dtype_name)
    encoder = load_encoder(settings.model_path, preset=settings.model, device=settings.device, dtype=dtype)
    apply_quantization(encoder, settings.quantization)  # before any CUDA graph is captured
    encoder.tower.set_options(attention_backend=settings.attention_backend)
    # Small batches are launch-bound on a GPU: replayed graphs (docs/benchmarks/encoder.md). A no-op on the CPU.
    encoder.use_cuda_graphs(
        settings.cuda_graphs, settings.cuda_graph_max_patches, max_image_patches=settings.cuda_graph_max_image_patches
    )
    family = encoder.config.family
    if settings.model_path is not None:
        preprocess = load_preprocess_config(settings.model_path, family)
    else:
        preprocess = PreprocessConfig.default_for(family)
    return encoder, preprocess


def build_pipeline(
    settings: ServerSettings, metrics: Metrics | None = None, transports: Table | None = None
) -> RequestPipeline:
    """The pipeline of `settings`' model, with the transports of `transports` (default: the table's) started."""
    encoder, preprocess = load_model(settings)
    context = model_context(
        model=settings.model,
        model_path=settings.model_path,
        dtype=settings.torch_dtype_name,
        quantization=settings.quantization,
        device_type=encoder.device.type,
        preprocess=preprocess,
        exif=settings.apply_exif_orientation,
    )
    table = transports or Table()
    pipeline = RequestPipeline(
        encoder,
        preprocess,
        configs.pipeline_config(settings, cache_context=context, image_patches=preprocess.max_patches_per_image),
        metrics,
        table,
    )
    pipeline.ipc_status = start_transports(settings, pipeline, table)
    pipeline.videos = build_video_pipeline(settings, pipeline)
    return pipeline


def check_model_before_binding(settings: ServerSettings) -> None:
    """The model's configuration and tensor headers, checked before any port is bound (the weights load later): an
    unknown preset, a missing, truncated or incomplete checkpoint, a config of no known family, or a quantization
    this device cannot run fails at once."""
    if settings.quantization != "none":  # a CPU or an older GPU: refused before the weights load
        check_fp8_device(settings.device, getattr(torch, settings.torch_dtype_name))
    if settings.model_path is None:
        if settings.model not in PRESETS:
            raise ConfigError(f"unknown preset {settings.model!r} (--model); choose one of {sorted(PRESETS)}")
        return
    config = read_config(Path(settings.model_path))
    load_preprocess_config(settings.model_path, config.family)
    check_checkpoint(Path(settings.model_path), config)  # headers only: a missing or truncated file fails here


def served_as(settings: ServerSettings) -> ServedAs:
    return ServedAs(
        dtype_name=settings.torch_dtype_name,
        quantization=settings.quantization,
        max_message_bytes=settings.max_message_mb * MiB,
        stream_chunk_bytes=settings.stream_chunk_bytes,
        model_path=settings.model_path,
    )
