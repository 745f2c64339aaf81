"""Vision tower + projector configuration: one frozen dataclass, named presets, and the parser for the two
Hugging Face `config.json` layouts (Kimi-VL and Kimi K2.5).

Sizes always come from here; nothing in `mmproc.model` hard-codes 1152 / 27 / 16.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from mmproc.errors import ConfigError

logger = logging.getLogger(__name__)

LAYOUTS = ("kimi_vl", "kimi_k25")


@dataclass(frozen=True, kw_only=True)
class VisionConfig:
    """MoonViT tower + patch merger + projector.

    layout: "kimi_vl" (projector `multi_modal_projector.*`, text width from text_config) or "kimi_k25"
    (projector `mm_projector.pre_norm/proj.0/proj.2`, `vt_*` vision keys). The tower is the same in both.
    """

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    patch_size: int = 14
    pos_emb_height: int = 64
    pos_emb_width: int = 64
    merge_kernel_size: tuple[int, int] = (2, 2)
    text_hidden_size: int
    projector_ln_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_max_grid: int = 512
    layout: str = "kimi_vl"
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
        ):
            _check_positive_int(field, getattr(self, field))
        kernel = _as_kernel("merge_kernel_size", self.merge_kernel_size)
        object.__setattr__(self, "merge_kernel_size", kernel)
        for field in ("projector_ln_eps", "rope_theta"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"{field} must be a positive number, got {value!r}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 4:
            # 2D RoPE splits each head into dh/4 column and dh/4 row frequencies (Kimi-VL Rope2DPosEmb).
            raise ConfigError(f"head dim {self.head_dim} (hidden_size / num_heads) must be divisible by 4")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def merged_dim(self) -> int:
        """Projector input width: hidden_size * kh * kw."""
        return self.hidden_size * self.merge_kernel_size[0] * self.merge_kernel_size[1]

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], *, name: str | None = None) -> VisionConfig:
        """Parse a Kimi-VL or Kimi K2.5 `config.json` (as a dict). Bad or missing fields -> ConfigError."""
        if not isinstance(config, Mapping):
            raise ConfigError("config.json must hold a JSON object")
        vision = config.get("vision_config")
        if not isinstance(vision, Mapping):
            raise ConfigError("config.json: missing or malformed field 'vision_config'")
        layout = _detect_layout(config, vision)
        if layout == "kimi_k25":
            return _parse_k25(config, vision, name or "kimi-k2.5")
        return _parse_kimi_vl(config, vision, name or "kimi-vl")


def _check_positive_int(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{field} must be a positive integer, got {value!r}")


def _as_kernel(field: str, value: Any) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ConfigError(f"{field} must be two positive integers, got {value!r}")
    for v in value:
        _check_positive_int(field, v)
    return (value[0], value[1])


def _detect_layout(config: Mapping[str, Any], vision: Mapping[str, Any]) -> str:
    model_type = config.get("model_type")
    by_keys = "kimi_k25" if any(str(k).startswith("vt_") for k in vision) else "kimi_vl"
    if model_type in LAYOUTS:
        if model_type != by_keys:
            raise ConfigError(
                f"config.json: model_type {model_type!r} does not match vision_config keys (looks like {by_keys!r})"
            )
        return model_type
    return by_keys


def _get(section: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in section or section[key] is None:
        raise ConfigError(f"config.json: missing field '{where}.{key}'")
    return section[key]


def _get_int(section: Mapping[str, Any], key: str, where: str) -> int:
    value = _get(section, key, where)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"config.json: field '{where}.{key}' must be a positive integer, got {value!r}")
    return value


def _build(name: str, where: str, **fields: Any) -> VisionConfig:
    try:
        return VisionConfig(name=name, **fields)
    except ConfigError as exc:
        raise ConfigError(f"config.json ({where}): {exc}") from None


def _parse_kimi_vl(config: Mapping[str, Any], vision: Mapping[str, Any], name: str) -> VisionConfig:
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        raise ConfigError("config.json: missing or malformed field 'text_config'")
    return _build(
        name,
        "vision_config",
        hidden_size=_get_int(vision, "hidden_size", "vision_config"),
        num_layers=_get_int(vision, "num_hidden_layers", "vision_config"),
        num_heads=_get_int(vision, "num_attention_heads", "vision_config"),
        intermediate_size=_get_int(vision, "intermediate_size", "vision_config"),
        patch_size=_get_int(vision, "patch_size", "vision_config"),
        pos_emb_height=_get_int(vision, "init_pos_emb_height", "vision_config"),
        pos_emb_width=_get_int(vision, "init_pos_emb_width", "vision_config"),
        merge_kernel_size=_as_kernel("vision_config.merge_kernel_size", vision.get("merge_kernel_size", (2, 2))),
        text_hidden_size=_get_int(text, "hidden_size", "text_config"),
        layout="kimi_vl",
    )


def _parse_k25(config: Mapping[str, Any], vision: Mapping[str, Any], name: str) -> VisionConfig:
    hidden = _get_int(vision, "vt_hidden_size", "vision_config")
    # Images only: t == 1 adds no time embedding (divided_fixed) and the temporal pool of sd2_tpool is a no-op.
    for key, supported in (("pos_emb_type", "divided_fixed"), ("merge_type", "sd2_tpool")):
        if vision.get(key, supported) != supported:
            raise ConfigError(f"config.json: vision_config.{key} {vision[key]!r} is not supported (want {supported!r})")
    mm_hidden = vision.get("mm_hidden_size", config.get("mm_hidden_size", hidden))
    if mm_hidden != hidden:
        raise ConfigError(f"config.json: vision_config.mm_hidden_size {mm_hidden!r} != vt_hidden_size {hidden}")
    text_hidden, where = _k25_text_hidden(config, vision)
    if isinstance(text_hidden, bool) or not isinstance(text_hidden, int) or text_hidden <= 0:
        raise ConfigError(f"config.json: field '{where}' must be a positive integer, got {text_hidden!r}")
    eps = vision.get("projector_ln_eps", config.get("projector_ln_eps", 1e-5))
    return _build(
        name,
        "vision_config",
        hidden_size=hidden,
        num_layers=_get_int(vision, "vt_num_hidden_layers", "vision_config"),
        num_heads=_get_int(vision, "vt_num_attention_heads", "vision_config"),
        intermediate_size=_get_int(vision, "vt_intermediate_size", "vision_config"),
        patch_size=_get_int(vision, "patch_size", "vision_config"),
        pos_emb_height=_get_int(vision, "init_pos_emb_height", "vision_config"),
        pos_emb_width=_get_int(vision, "init_pos_emb_width", "vision_config"),
        merge_kernel_size=_as_kernel("vision_config.merge_kernel_size", vision.get("merge_kernel_size", (2, 2))),
        text_hidden_size=text_hidden,
        projector_ln_eps=eps,
        layout="kimi_k25",
    )


def _k25_text_hidden(config: Mapping[str, Any], vision: Mapping[str, Any]) -> tuple[Any, str]:
    """K2.5 puts the LLM width in vision_config.text_hidden_size (preferred), top-level, or text_config."""
    if vision.get("text_hidden_size") is not None:
        return vision["text_hidden_size"], "vision_config.text_hidden_size"
    if config.get("text_hidden_size") is not None:
        return config["text_hidden_size"], "text_hidden_size"
    text = config.get("text_config")
    if isinstance(text, Mapping) and text.get("hidden_size") is not None:
        return text["hidden_size"], "text_config.hidden_size"
    raise ConfigError("config.json: missing field 'vision_config.text_hidden_size' (or text_config.hidden_size)")


# Read-only: presets are shared by every caller.
PRESETS: Mapping[str, VisionConfig] = MappingProxyType(
    {
        # Same head dim (72) as the real tower, so RoPE / kernels see realistic shapes on a laptop CPU.
        "tiny": VisionConfig(
            hidden_size=144, num_layers=2, num_heads=2, intermediate_size=288, text_hidden_size=256, name="tiny"
        ),
        "kimi-vl": VisionConfig(
            hidden_size=1152, num_layers=27, num_heads=16, intermediate_size=4304, text_hidden_size=2048, name="kimi-vl"
        ),
        "kimi-k2.5": VisionConfig(
            hidden_size=1152,
            num_layers=27,
            num_heads=16,
            intermediate_size=4304,
            text_hidden_size=7168,
            layout="kimi_k25",
            name="kimi-k2.5",
        ),
    }
)
