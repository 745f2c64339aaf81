"""`VisionConfig`: one frozen dataclass describing a vision tower + patch merger(s) of any family, in the terms of
the blocks in mmproc/layers/ (norm, biases, activation, position table and its resize, RoPE, merge kernel, output
widths). Which tower module is built from it is the family's business (mmproc/models/registry.py): each family
module parses its checkpoints' `config.json` into it and names its presets with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmproc.errors import ConfigError

NORMS = ("layernorm", "rmsnorm")
POS_EMB_MODES = ("bicubic", "bilinear", "bilinear_corners")  # mmproc/layers/pos_emb.py
PROJECTORS = ("pre_norm_mlp", "mlp_post_norm")  # mmproc/layers/projector.py
ACTIVATIONS = ("gelu_tanh", "gelu")


@dataclass(frozen=True, kw_only=True)
class VisionConfig:
    """A pre-norm ViT with 2D RoPE (patch embed + learned position table, blocks), the k x k patch merger and the
    projector to the LLM width, plus optional DeepStack levels.

    family: the registry name of the family that parsed it; its tower module, checkpoint names and preprocessing
        rule follow from it (mmproc/models/registry.py).
    qkv_hidden_size: attention width (3 x it out of wqkv); head_dim = qkv_hidden_size / num_heads. None = hidden.
    norm / norm_eps: the blocks' and final norm; eps None = LayerNorm's 1e-5, or RMSNorm's dtype eps.
    attn_bias / mlp_bias / patch_embed_bias: whether those linears carry a bias (K3: none).
    projector: "pre_norm_mlp" (LayerNorm per sub-token, Linear, GELU, Linear; Kimi-VL, K2.5) or
        "mlp_post_norm" (bias-free Linear, GELU, Linear, then RMSNorm at the LLM width; K3 PatchMergerMLPV2).
    temporal_patch_size: frames one patch spans (Qwen3-VL: 2, a still image is its frame twice); 1 otherwise.
    deepstack_layers: blocks whose output also goes through a merger of its own (Qwen3-VL DeepStack); the
        output is the main merger's rows with each level's concatenated on the last dim (vLLM's layout).
    """

    family: str
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    text_hidden_size: int
    patch_size: int = 14
    pos_emb_height: int = 64
    pos_emb_width: int = 64
    pos_emb_mode: str = "bicubic"
    merge_kernel_size: tuple[int, int] = (2, 2)
    qkv_hidden_size: int | None = None
    norm: str = "layernorm"
    norm_eps: float | None = None
    attn_bias: bool = True
    mlp_bias: bool = True
    patch_embed_bias: bool = True
    activation: str = "gelu_tanh"
    projector: str = "pre_norm_mlp"
    projector_ln_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_max_grid: int = 512
    pos_emb_time: int = 0  # frames per video chunk the time embedding covers; 0: the tower takes no video
    temporal_patch_size: int = 1
    deepstack_layers: tuple[int, ...] = ()
    name: str = "custom"

    def __post_init__(self) -> None:
        for field in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "patch_size",
            "pos_emb_height",
            "pos_emb_width",
            "text_hidden_size",
            "rope_max_grid",
            "temporal_patch_size",
        ):
            check_positive_int(field, getattr(self, field))
        if self.qkv_hidden_size is not None:
            check_positive_int("qkv_hidden_size", self.qkv_hidden_size)
        if self.pos_emb_time:
            check_positive_int("pos_emb_time", self.pos_emb_time)
        object.__setattr__(self, "merge_kernel_size", as_kernel("merge_kernel_size", self.merge_kernel_size))
        for field in ("projector_ln_eps", "rope_theta") + (("norm_eps",) if self.norm_eps is not None else ()):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"{field} must be a positive number, got {value!r}")
        for field, allowed in (
            ("norm", NORMS),
            ("pos_emb_mode", POS_EMB_MODES),
            ("projector", PROJECTORS),
            ("activation", ACTIVATIONS),
        ):
            if getattr(self, field) not in allowed:
                raise ConfigError(f"{field} must be one of {allowed}, got {getattr(self, field)!r}")
        for field in ("attn_bias", "mlp_bias", "patch_embed_bias"):
            if not isinstance(getattr(self, field), bool):
                raise ConfigError(f"{field} must be true or false, got {getattr(self, field)!r}")
        layers = self.deepstack_layers
        if not isinstance(layers, list | tuple) or any(isinstance(i, bool) or not isinstance(i, int) for i in layers):
            raise ConfigError(f"deepstack_layers must be block indexes, got {layers!r}")
        if any(not 0 <= i < self.num_layers for i in layers) or len(set(layers)) != len(layers):
            raise ConfigError(f"deepstack_layers {list(layers)} must be distinct blocks of 0..{self.num_layers - 1}")
        object.__setattr__(self, "deepstack_layers", tuple(layers))
        if self.qkv_width % self.num_heads:
            raise ConfigError(f"attention width {self.qkv_width} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 4:
            # 2D RoPE splits each head into dh/4 column and dh/4 row frequencies (Kimi-VL Rope2DPosEmb).
            raise ConfigError(f"head dim {self.head_dim} (attention width / num_heads) must be divisible by 4")

    @property
    def qkv_width(self) -> int:
        return self.hidden_size if self.qkv_hidden_size is None else self.qkv_hidden_size

    @property
    def head_dim(self) -> int:
        return self.qkv_width // self.num_heads

    @property
    def output_widths(self) -> tuple[int, ...]:
        """Width of each level side by side in one output row: the main merger's, then each DeepStack level's."""
        return (self.text_hidden_size,) * (1 + len(self.deepstack_layers))

    @property
    def output_dim(self) -> int:
        return sum(self.output_widths)

    @property
    def merged_dim(self) -> int:
        """Projector input width: hidden_size * kh * kw."""
        return self.hidden_size * self.merge_kernel_size[0] * self.merge_kernel_size[1]


def check_positive_int(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{field} must be a positive integer, got {value!r}")


def as_kernel(field: str, value: Any) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ConfigError(f"{field} must be two positive integers, got {value!r}")
    for v in value:
        check_positive_int(field, v)
    return (value[0], value[1])
