"""The settings that choose the model and how it runs (checkpoint or preset, device, dtype, CUDA graphs, attention
kernel, GPU preprocessing and decoding): a base of `ServerSettings` (settings.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from service.app.limit_settings import LimitSettings
from service.pipeline.config import PipelineConfig


def image_sizes(text: str) -> tuple[tuple[int, int], ...]:
    """'448x448,1024x768' -> ((448, 448), (1024, 768)): (width, height) pairs, each side 1..65535."""
    sizes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        width, sep, height = item.lower().partition("x")
        sides = (width, height) if sep else ()
        if not sides or not all(side.isdigit() and 0 < int(side) < 65536 for side in sides):
            raise ValueError(f"image sizes are WxH, comma-separated (e.g. 448x448), got {item!r}")
        sizes.append((int(width), int(height)))
    return tuple(sizes)


class ModelSettings(LimitSettings):
    # Model
    model_path: Path | None = Field(
        None,
        description="Local Hugging Face checkpoint directory to serve (config.json, *.safetensors); nothing is downloaded",
    )
    model: str = Field("tiny", description="Embedded preset (random weights) served when no --model-path is given")
    device: str = Field("cpu", description="Where the encoder runs: cpu, cuda or cuda:N")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="Weights and activations dtype; float32 on cpu and bfloat16 on cuda when not given"
    )
    quantization: Literal["none", "fp8"] = Field(
        "none",
        description="fp8: the linear layers run FP8 e4m3 matmuls (weights per channel, activations per token), the "
        "rest in dtype; needs a GPU of compute capability >= 8.9 and dtype bfloat16 (docs/benchmarks/fp8.md)",
    )
    cuda_graphs: int = Field(
        8,
        ge=0,
        le=64,
        description="How many CUDA graphs to keep for batches of small images whose exact sizes repeat (0: none)",
    )
    cuda_graph_max_patches: int = Field(
        4096,
        ge=1,
        le=1 << 20,
        description="Largest batch, in patches, captured as a CUDA graph; bigger ones run eagerly (one output "
        "buffer of this many patches' tokens is shared by all graphs)",
    )
    cuda_graph_max_image_patches: int = Field(
        2048,
        ge=1,
        le=1 << 20,
        description="Batches with an image of more patches run eagerly: a large image's forward is bound by the "
        "GPU's math, not by kernel launches (448² is 1,024 patches, 1024² 5,476)",
    )
    cuda_graph_warmup_sizes: str = Field(
        "",
        description="Image sizes WxH, comma-separated (e.g. 448x448), whose batches of 1..n images are captured as "
        "CUDA graphs at start-up (n within cuda_graphs and cuda_graph_max_patches): traffic of those sizes replays "
        "graphs from its first batch, where a capture under load would stall the runner",
    )
    attention_backend: Literal["auto", "flash_attn_cute", "flash_attn", "torch_varlen", "sdpa"] = Field(
        "auto",
        description="Attention kernel: auto tries flash_attn_cute (FlashAttention 4 on Hopper/Blackwell, the fa4 "
        "extra), flash_attn, torch_varlen, then SDPA per image; a named one falls back to SDPA where it cannot run; "
        "the choice is logged at start-up",
    )
    gpu_preprocess: bool = Field(
        True,
        description="With a CUDA model, normalize pixels on the GPU: decode workers ship uint8 bytes, a quarter of "
        "the float32 bytes, and skip their costliest pass (docs/benchmarks/preprocess.md)",
    )
    gpu_decode: Literal["auto", "on", "off"] = Field(
        PipelineConfig.gpu_decode,
        description="With a CUDA model and gpu_preprocess, decode JPEGs on the GPU (nvImageCodec; auto: when it "
        "loads, on: refuse to start without it); other images and GPU failures take the decode workers",
    )

    @field_validator("cuda_graph_warmup_sizes")
    @classmethod
    def _image_sizes(cls, value: str) -> str:
        image_sizes(value)
        return value

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if value != "cpu" and value != "cuda" and not (value.startswith("cuda:") and value[5:].isdigit()):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {value!r}")
        return value
