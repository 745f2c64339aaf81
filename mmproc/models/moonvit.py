"""MoonViT (Kimi-VL, Kimi K2.5): LayerNorm blocks with biases, head dim = hidden / heads, bicubic position
embedding, projector LayerNorm -> Linear -> GELU -> Linear.

Checkpoints: Kimi-VL (`multi_modal_projector.*`, vision keys named as in `MoonViTConfig`), K2.5 as Moonshot
released it (`vt_*` vision keys, `mm_projector.pre_norm/proj.0/proj.2`) and K2.5 as transformers (>= 5.23)
writes it with `save_pretrained` (`Kimi_K25VisionConfig` keys; tensors under `model.`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from mmproc.errors import ConfigError
from mmproc.models.config import VisionConfig, as_kernel
from mmproc.models.family import CheckpointLayout, ModelFamily, build, first_key, get_int, require
from mmproc.models.tower import MoonViT, moonvit_head

KIMI_VL_LAYOUT = CheckpointLayout(
    "kimi_vl",
    keys=(("vision_tower.", "tower."), ("multi_modal_projector.", "projector.")),  # pre_norm, linear_1, linear_2
    vision_prefixes=("vision_tower.", "multi_modal_projector."),
)
K25_LAYOUT = CheckpointLayout(
    "kimi_k25",
    keys=(
        ("vision_tower.", "tower."),
        ("mm_projector.pre_norm.", "projector.pre_norm."),
        ("mm_projector.proj.0.", "projector.linear_1."),  # proj = Sequential(Linear, GELU, Linear)
        ("mm_projector.proj.2.", "projector.linear_2."),
    ),
    vision_prefixes=("vision_tower.", "mm_projector."),
)
# transformers >= 5.23 `save_pretrained`: its reverse renames turn two of the release's names into
# `vision_tower.encoder.patch_embed.proj.*` and `model.mm_projector.pre_norm.*`; the rest (wqkv in the release's
# interleaved-RoPE order included) is written as released.
K25_TRANSFORMERS_LAYOUT = CheckpointLayout(
    "kimi_k25 (transformers)",
    keys=(
        ("vision_tower.encoder.patch_embed.proj.", "tower.patch_embed.proj."),
        ("vision_tower.", "tower."),
        ("model.mm_projector.pre_norm.", "projector.pre_norm."),
        ("mm_projector.proj.0.", "projector.linear_1."),
        ("mm_projector.proj.2.", "projector.linear_2."),
    ),
    vision_prefixes=("vision_tower.", "mm_projector.", "model.mm_projector."),
)


def parse_kimi_vl(config: Mapping[str, Any], name: str) -> VisionConfig:
    vision = _section(config, "vision_config")
    text = _section(config, "text_config")
    where = "vision_config"
    return build(
        name,
        family="kimi_vl",
        hidden_size=get_int(vision, "hidden_size", where),
        num_layers=get_int(vision, "num_hidden_layers", where),
        num_heads=get_int(vision, "num_attention_heads", where),
        intermediate_size=get_int(vision, "intermediate_size", where),
        patch_size=get_int(vision, "patch_size", where),
        pos_emb_height=get_int(vision, "init_pos_emb_height", where),
        pos_emb_width=get_int(vision, "init_pos_emb_width", where),
        merge_kernel_size=as_kernel(f"{where}.merge_kernel_size", vision.get("merge_kernel_size", (2, 2))),
        text_hidden_size=get_int(text, "hidden_size", "text_config"),
    )


# One concept, two spellings: Moonshot's release (vt_*) and transformers' Kimi_K25VisionConfig.
_K25_KEYS = {
    "hidden_size": ("vt_hidden_size", "hidden_size"),
    "num_layers": ("vt_num_hidden_layers", "num_hidden_layers"),
    "num_heads": ("vt_num_attention_heads", "num_attention_heads"),
    "intermediate_size": ("vt_intermediate_size", "intermediate_size"),
    "pos_emb_height": ("init_pos_emb_height", "pos_emb_height"),
    "pos_emb_width": ("init_pos_emb_width", "pos_emb_width"),
}


def parse_kimi_k25(config: Mapping[str, Any], name: str) -> VisionConfig:
    vision = _section(config, "vision_config")
    where = "vision_config"
    sizes = {field: get_int(vision, first_key(vision, keys, where), where) for field, keys in _K25_KEYS.items()}
    # divided_fixed: a fixed sinusoidal time embedding per frame of a video chunk (none for t == 1); sd2_tpool:
    # the frames of a chunk averaged after the 2x2 merge (mmproc/layers/temporal.py).
    for key, supported in (("pos_emb_type", "divided_fixed"), ("merge_type", "sd2_tpool")):
        require(vision.get(key, supported), supported, f"vision_config.{key}")
    for where_key, mm_hidden in (
        ("vision_config.mm_hidden_size", vision.get("mm_hidden_size", config.get("mm_hidden_size"))),
        ("projection_hidden_size", config.get("projection_hidden_size")),  # transformers: the pre_norm width
    ):
        if mm_hidden is not None and mm_hidden != sizes["hidden_size"]:
            raise ConfigError(f"config.json: {where_key} {mm_hidden!r} != vision hidden size {sizes['hidden_size']}")
    eps = vision.get("projector_ln_eps", config.get("projector_ln_eps", config.get("projection_layer_norm_eps", 1e-5)))
    return build(
        name,
        family="kimi_k25",
        **sizes,
        patch_size=get_int(vision, "patch_size", where, default=14),
        merge_kernel_size=as_kernel(f"{where}.merge_kernel_size", vision.get("merge_kernel_size", (2, 2))),
        text_hidden_size=text_hidden_size(config, vision),
        projector_ln_eps=eps,
        pos_emb_time=get_int(vision, _time_key(vision), where, default=4),  # transformers' default
    )


def _time_key(vision: Mapping[str, Any]) -> str:
    return "pos_emb_time" if "pos_emb_time" in vision else "init_pos_emb_time"  # transformers / the release


def text_hidden_size(config: Mapping[str, Any], vision: Mapping[str, Any]) -> int:
    """The LLM width: vision_config.text_hidden_size (preferred), top level, or text_config.hidden_size."""
    for section, key, where in (
        (vision, "text_hidden_size", "vision_config.text_hidden_size"),
        (config, "text_hidden_size", "text_hidden_size"),
        (config.get("text_config"), "hidden_size", "text_config.hidden_size"),
    ):
        if isinstance(section, Mapping) and section.get(key) is not None:
            value = section[key]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"config.json: field '{where}' must be a positive integer, got {value!r}")
            return value
    raise ConfigError("config.json: missing field 'vision_config.text_hidden_size' (or text_config.hidden_size)")


def _section(config: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    section = config.get(key)
    if not isinstance(section, Mapping):
        raise ConfigError(f"config.json: missing or malformed field '{key}'")
    return section


_MOONVIT = dict(hidden_size=1152, num_layers=27, num_heads=16, intermediate_size=4304)

KIMI_VL = ModelFamily(
    name="kimi_vl",
    model_types=("kimi_vl", "moonvit"),
    parse=parse_kimi_vl,
    tower=MoonViT,
    head=moonvit_head,
    layouts=(KIMI_VL_LAYOUT,),
    presets=MappingProxyType(
        {
            # Same head dim (72) as the real tower, so RoPE / kernels see realistic shapes on a laptop CPU.
            "tiny": VisionConfig(
                family="kimi_vl",
                hidden_size=144,
                num_layers=2,
                num_heads=2,
                intermediate_size=288,
                text_hidden_size=256,
                name="tiny",
            ),
            "kimi-vl": VisionConfig(family="kimi_vl", **_MOONVIT, text_hidden_size=2048, name="kimi-vl"),
        }
    ),
)

KIMI_K25 = ModelFamily(
    name="kimi_k25",
    model_types=("kimi_k25", "kimi_k25_vision"),
    parse=parse_kimi_k25,
    tower=MoonViT,
    head=moonvit_head,
    layouts=(K25_LAYOUT, K25_TRANSFORMERS_LAYOUT),
    presets=MappingProxyType(
        {
            # The tiny preset's shapes with K2.5's rules (video included): CPU tests and `bench serve` videos.
            "tiny-k2.5": VisionConfig(
                family="kimi_k25",
                hidden_size=144,
                num_layers=2,
                num_heads=2,
                intermediate_size=288,
                text_hidden_size=256,
                pos_emb_time=4,
                name="tiny-k2.5",
            ),
            "kimi-k2.5": VisionConfig(
                family="kimi_k25", **_MOONVIT, text_hidden_size=7168, pos_emb_time=4, name="kimi-k2.5"
            ),
        }
    ),
)
