"""Everything `RequestPipeline` is built from besides its model, torch-free (built from the settings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mmproc.media.limits import MediaLimits
from mmproc.runner_config import RunnerConfig
from service.pipeline.cache.store import CacheConfig
from service.pipeline.decode.config import DecodePoolConfig
from service.pipeline.key_store import KeyStoreConfig
from service.pipeline.overload import OverloadConfig
from service.pipeline.reply_budget import ReplyBudgetConfig
from service.pipeline.request_limits import InflightLimits, RequestLimits


@dataclass(frozen=True)
class PipelineConfig:
    """cache_context: what the cache key binds besides the bytes (None: derived from the model).
    gpu_decode: "auto", "on" (or the pipeline does not start), "off".
    graph_warmup_sizes: (width, height) of images whose CUDA graphs are captured before serving."""

    media: MediaLimits = field(default_factory=MediaLimits)
    request: RequestLimits = field(default_factory=RequestLimits)
    inflight: InflightLimits = field(default_factory=InflightLimits)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    decode: DecodePoolConfig = field(default_factory=DecodePoolConfig)
    key_store: KeyStoreConfig = field(default_factory=KeyStoreConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    overload: OverloadConfig = field(default_factory=OverloadConfig)
    replies: ReplyBudgetConfig = field(default_factory=ReplyBudgetConfig)
    cache_context: str | None = None
    gpu_decode: Literal["auto", "on", "off"] = "auto"
    graph_warmup_sizes: tuple[tuple[int, int], ...] = ()
