"""The Qwen3-VL vision family: Qwen3-VL (with DeepStack), Qwen3.5 and Qwen3.6 (dense and MoE; no DeepStack).
One tower (mmproc/models/qwen3_vl_tower.py), one image rule (mmproc/preprocess/qwen3_vl.py).

`config.json`: the top level is `qwen3_vl`, `qwen3_5` or `qwen3_5_moe`; `vision_config` is transformers'
`Qwen3VLVisionConfig` / `Qwen3_5VisionConfig` / `Qwen3_5MoeVisionConfig` (older files say `qwen3_vl` there too).
Keys a file leaves out take those classes' defaults (Qwen3.5's have no DeepStack; Qwen3-VL's default to
[8, 16, 24]). Tensors: `model.visual.*` as transformers writes them and as released (sharded, index file); an FP8
release keeps the vision tower in bf16 (`quantization_config.modules_to_not_convert`), which loads as is; an FP8
vision tensor is refused by the loader, naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from mmproc.errors import ConfigError
from mmproc.models.config import VisionConfig
from mmproc.models.family import CheckpointLayout, ModelFamily, build, get_int, require
from mmproc.models.qwen3_vl_tower import DeepStackHead, Qwen3VLTower

QWEN3_VL_LAYOUT = CheckpointLayout(
    "qwen3_vl",
    keys=(
        ("model.visual.merger.", "projector.merger."),
        ("model.visual.deepstack_merger_list.", "projector.deepstack_merger_list."),
        ("model.visual.", "tower."),
    ),
    vision_prefixes=("model.visual.",),
)
# The same tensors at the top level (`visual.*`): checkpoints saved from vLLM's module tree and Qwen2-VL-era tools.
QWEN3_VL_BARE_LAYOUT = CheckpointLayout(
    "qwen3_vl (visual.*)",
    keys=(
        ("visual.merger.", "projector.merger."),
        ("visual.deepstack_merger_list.", "projector.deepstack_merger_list."),
        ("visual.", "tower."),
    ),
    vision_prefixes=("visual.",),
)

DEEPSTACK_VISION_TYPES = ("qwen3_vl_vision", "qwen3_vl")  # Qwen3VLVisionConfig: DeepStack by default
DEFAULT_DEEPSTACK = (8, 16, 24)
ROPE_MAX_GRID = 8192  # patches per side: covers every image of the 16,777,216-pixel budget at aspect <= 200

# Qwen3VLVisionConfig / Qwen3_5(Moe)VisionConfig defaults, transformers 5.23.
_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "depth": 27,
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_heads": 16,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 3584,
        "num_position_embeddings": 2304,
    }
)
_ALIASES = {"depth": "num_hidden_layers", "num_heads": "num_attention_heads"}  # PreTrainedConfig.attribute_map


def parse_qwen3_vl(config: Mapping[str, Any], name: str) -> VisionConfig:
    vision = config.get("vision_config", {})
    if not isinstance(vision, Mapping):
        raise ConfigError("config.json: malformed field 'vision_config'")
    where = "vision_config"

    def size(key: str) -> int:
        spelled = key if key in vision or key not in _ALIASES else _ALIASES[key]
        return get_int(vision, spelled, where, default=_DEFAULTS[key])

    require(vision.get("hidden_act", "gelu_pytorch_tanh"), "gelu_pytorch_tanh", f"{where}.hidden_act")
    require(size("in_channels"), 3, f"{where}.in_channels")
    positions = size("num_position_embeddings")
    side = math.isqrt(positions)
    if side * side != positions:
        raise ConfigError(f"config.json: {where}.num_position_embeddings {positions} is not a square")
    merge = size("spatial_merge_size")
    rope = vision.get("rope_parameters") or {}
    if not isinstance(rope, Mapping):
        raise ConfigError(f"config.json: malformed field '{where}.rope_parameters'")
    require(rope.get("rope_type", "axial"), "axial", f"{where}.rope_parameters.rope_type")
    default_levels = DEFAULT_DEEPSTACK if vision.get("model_type", "qwen3_vl_vision") in DEEPSTACK_VISION_TYPES else ()
    levels = vision.get("deepstack_visual_indexes", default_levels)
    if not isinstance(levels, list | tuple):
        raise ConfigError(f"config.json: {where}.deepstack_visual_indexes must be a list, got {levels!r}")
    return build(
        name,
        family="qwen3_vl",
        hidden_size=size("hidden_size"),
        num_layers=size("depth"),
        num_heads=size("num_heads"),
        intermediate_size=size("intermediate_size"),
        text_hidden_size=size("out_hidden_size"),
        patch_size=size("patch_size"),
        temporal_patch_size=size("temporal_patch_size"),
        merge_kernel_size=(merge, merge),
        pos_emb_height=side,
        pos_emb_width=side,
        deepstack_layers=tuple(levels),
        rope_theta=rope.get("rope_theta", 10000.0),
        **_TOWER,
    )


# What every Qwen3-VL tower is, in VisionConfig's terms (the checkpoint has no say in these).
_TOWER: Mapping[str, Any] = MappingProxyType(
    {
        "pos_emb_mode": "bilinear_corners",
        "norm": "layernorm",
        "norm_eps": 1e-6,
        "activation": "gelu_tanh",
        "projector": "pre_norm_mlp",  # the main merger: LayerNorm, shuffle, fc1, erf GELU, fc2
        "projector_ln_eps": 1e-6,
        "rope_max_grid": ROPE_MAX_GRID,
    }
)


def _qwen(name: str, **sizes: Any) -> VisionConfig:
    fields = {"patch_size": 16, "temporal_patch_size": 2, "pos_emb_height": 48, "pos_emb_width": 48, **sizes}
    return VisionConfig(family="qwen3_vl", name=name, **_TOWER, **fields)


_FULL = dict(hidden_size=1152, num_layers=27, num_heads=16, intermediate_size=4304)
_TINY = dict(hidden_size=144, num_heads=2, intermediate_size=288, text_hidden_size=256)  # head dim 72 as real

QWEN3_VL = ModelFamily(
    name="qwen3_vl",
    model_types=(
        "qwen3_vl",
        "qwen3_vl_vision",
        "qwen3_5",
        "qwen3_5_vision",
        "qwen3_5_moe",
        "qwen3_5_moe_vision",
    ),
    parse=parse_qwen3_vl,
    tower=Qwen3VLTower,
    head=DeepStackHead,
    layouts=(QWEN3_VL_LAYOUT, QWEN3_VL_BARE_LAYOUT),
    presets=MappingProxyType(
        {
            "tiny-qwen3-vl": _qwen("tiny-qwen3-vl", **_TINY, num_layers=3, deepstack_layers=(0, 1)),
            "tiny-qwen3.6": _qwen("tiny-qwen3.6", **_TINY, num_layers=2),
            "qwen3-vl-8b": _qwen("qwen3-vl-8b", **_FULL, text_hidden_size=4096, deepstack_layers=(8, 16, 24)),
            "qwen3.6-35b-a3b": _qwen("qwen3.6-35b-a3b", **_FULL, text_hidden_size=2048),
        }
    ),
)
