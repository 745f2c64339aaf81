"""MoonViT3d (Kimi K3): the MoonViT tower with RMSNorm, no biases, an attention width of its own
(`qkv_hidden_size`, so head dim = 1536 / 12 = 128), a bilinearly resized position embedding, and the
PatchMergerMLPV2 projector (no pre-norm; bias-free Linear, exact GELU, Linear, then RMSNorm at the LLM width).

Keys missing from `vision_config` take the K3 config class's defaults (`KimiK3VisionConfig` in SGLang 0.5.23),
not K2.5's. Tensors sit at the top level: `vision_tower.*` (wqkv packed) and `mm_projector.{proj.0,proj.2,
post_norm}`. Images only: t == 1, so the temporal embedding and the temporal pool add nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from mmproc.errors import ConfigError
from mmproc.models.config import VisionConfig, as_kernel
from mmproc.models.family import CheckpointLayout, ModelFamily, build, get_int, require
from mmproc.models.tower import MoonViT, moonvit_head

K3_LAYOUT = CheckpointLayout(
    "kimi_k3",
    keys=(
        ("vision_tower.", "tower."),
        ("mm_projector.proj.0.", "projector.linear_1."),
        ("mm_projector.proj.2.", "projector.linear_2."),
        ("mm_projector.post_norm.", "projector.post_norm."),
    ),
    vision_prefixes=("vision_tower.", "mm_projector."),
)

# KimiK3VisionConfig.__init__ defaults (the integer sizes; the kinds are checked below).
K3_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "patch_size": 14,
        "init_pos_emb_height": 64,
        "init_pos_emb_width": 64,
        "vt_num_attention_heads": 12,
        "vt_num_hidden_layers": 27,
        "vt_hidden_size": 1024,
        "vt_intermediate_size": 4096,
        "qkv_hidden_size": 1536,
        "text_hidden_size": 2304,
    }
)
# KimiK3Config builds a default text config (hidden 4096) when none is given, and its width wins.
K3_DEFAULT_TEXT_HIDDEN = 4096

_NORMS = {"rmsnorm": "rmsnorm", "layernorm": "layernorm"}
_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
_POS_EMB_MODES = {"bilinear": "bilinear", "bicubic": "bicubic"}


def parse_kimi_k3(config: Mapping[str, Any], name: str) -> VisionConfig:
    vision = config.get("vision_config", {})
    if not isinstance(vision, Mapping):
        raise ConfigError("config.json: malformed field 'vision_config'")
    where = "vision_config"

    def size(key: str) -> int:
        return get_int(vision, key, where, default=K3_DEFAULTS[key])

    for key, supported in (
        ("pos_emb_type", "divided_fixed"),
        ("merge_type", "sd2_tpool"),
        ("mm_projector_type", "patchmergerv2"),
        ("projector_hidden_act", "gelu"),
        ("mlp_type", "mlp2"),
    ):
        require(vision.get(key, supported), supported, f"{where}.{key}")
    hidden = size("vt_hidden_size")
    mm_hidden = vision.get("mm_hidden_size") or hidden
    if mm_hidden != hidden:
        raise ConfigError(f"config.json: {where}.mm_hidden_size {mm_hidden!r} != vt_hidden_size {hidden}")
    return build(
        name,
        family="kimi_k3",
        hidden_size=hidden,
        num_layers=size("vt_num_hidden_layers"),
        num_heads=size("vt_num_attention_heads"),
        intermediate_size=size("vt_intermediate_size"),
        qkv_hidden_size=size("qkv_hidden_size"),
        patch_size=size("patch_size"),
        pos_emb_height=size("init_pos_emb_height"),
        pos_emb_width=size("init_pos_emb_width"),
        pos_emb_mode=_choice(vision, "pos_emb_interpolation_mode", "bilinear", _POS_EMB_MODES),
        merge_kernel_size=as_kernel(f"{where}.merge_kernel_size", vision.get("merge_kernel_size", (2, 2))),
        norm=_choice(vision, "norm_type", "rmsnorm", _NORMS),
        norm_eps=None,  # nn.RMSNorm(dim) / nn.LayerNorm(dim) as built by the reference: see add_norm.py
        attn_bias=_flag(vision, "attn_bias"),
        mlp_bias=_flag(vision, "linear_bias"),
        patch_embed_bias=_flag(vision, "patch_embed_proj_bias"),
        activation=_choice(vision, "activation_func", "gelu_pytorch_tanh", _ACTIVATIONS),
        projector="mlp_post_norm",
        projector_ln_eps=vision.get("projector_ln_eps", 1e-5),
        text_hidden_size=_text_hidden(config, vision),
    )


def _choice(vision: Mapping[str, Any], key: str, default: str, allowed: Mapping[str, str]) -> str:
    """The config's spelling of `key` -> ours."""
    value = vision.get(key, default)
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"config.json: vision_config.{key} {value!r} is not supported (one of {sorted(allowed)})")
    return allowed[value]


def _flag(vision: Mapping[str, Any], key: str) -> bool:
    value = vision.get(key, False)  # K3: every linear is bias-free by default
    if not isinstance(value, bool):
        raise ConfigError(f"config.json: vision_config.{key} must be true or false, got {value!r}")
    return value


def _text_hidden(config: Mapping[str, Any], vision: Mapping[str, Any]) -> int:
    text = config.get("text_config")
    if text is not None and not isinstance(text, Mapping):
        raise ConfigError("config.json: malformed field 'text_config'")
    if text is not None and text.get("hidden_size") is not None:
        return get_int(text, "hidden_size", "text_config")
    if vision.get("text_hidden_size") is not None:
        return get_int(vision, "text_hidden_size", "vision_config")
    return K3_DEFAULT_TEXT_HIDDEN


def _k3(name: str, **sizes: int) -> VisionConfig:
    return VisionConfig(
        family="kimi_k3",
        qkv_hidden_size=sizes.pop("qkv_hidden_size"),
        pos_emb_mode="bilinear",
        norm="rmsnorm",
        attn_bias=False,
        mlp_bias=False,
        patch_embed_bias=False,
        projector="mlp_post_norm",
        name=name,
        **sizes,
    )


KIMI_K3 = ModelFamily(
    name="kimi_k3",
    model_types=("kimi_k3", "kimi_k3_vision"),
    parse=parse_kimi_k3,
    tower=MoonViT,
    head=moonvit_head,
    layouts=(K3_LAYOUT,),
    presets=MappingProxyType(
        {
            "kimi-k3": _k3(
                "kimi-k3",
                hidden_size=1024,
                num_layers=27,
                num_heads=12,
                qkv_hidden_size=1536,
                intermediate_size=4096,
                text_hidden_size=K3_DEFAULT_TEXT_HIDDEN,
            ),
            # Head dim 128 as the real tower, on a laptop CPU.
            "tiny-k3": _k3(
                "tiny-k3",
                hidden_size=128,
                num_layers=2,
                num_heads=2,
                qkv_hidden_size=256,
                intermediate_size=256,
                text_hidden_size=256,
            ),
        }
    ),
)
