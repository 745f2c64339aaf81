"""Small random-weight checkpoints in the REAL Hugging Face layouts of Kimi-VL, Kimi K2.5 and Kimi K3, for tests.

`write_checkpoint(dir, family=...)` writes config.json, preprocessor_config.json and safetensors (one file, or
three shards with model.safetensors.index.json), optionally with language-model tensors that a loader must
skip, and returns the vision tower + projector tensors it wrote (checkpoint names). Names and shapes are
spelled out here from the published modules, independently of `mmproc.models`.

`vision` takes: hidden_size, num_layers, num_heads, intermediate_size, patch_size, pos_emb_height,
pos_emb_width, merge_kernel_size (defaults: the tiny preset's sizes), and for K3 qkv_hidden_size (default
TINY_K3_VISION: head dim 128 as the real K3 tower).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

TINY_VISION: dict[str, Any] = {
    "hidden_size": 144,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 288,
    "patch_size": 14,
    "pos_emb_height": 64,
    "pos_emb_width": 64,
    "merge_kernel_size": (2, 2),
}
TINY_K3_VISION: dict[str, Any] = {**TINY_VISION, "hidden_size": 128, "intermediate_size": 256, "qkv_hidden_size": 256}
PROJECTOR_NAMES = {  # (pre_norm, first linear, second linear) checkpoint prefixes
    "kimi_vl": ("multi_modal_projector.pre_norm", "multi_modal_projector.linear_1", "multi_modal_projector.linear_2"),
    "kimi_k25": ("mm_projector.pre_norm", "mm_projector.proj.0", "mm_projector.proj.2"),
}


def vision_spec(vision: dict[str, Any] | None = None, family: str = "kimi_vl") -> dict[str, Any]:
    spec = dict(TINY_K3_VISION if family == "kimi_k3" else TINY_VISION)
    spec.update(vision or {})
    return spec


def k3_tensor_shapes(vision: dict[str, Any] | None = None, text_hidden: int = 256) -> dict:
    """Kimi K3 (SGLang 0.5.23 kimi_k3_vl.py): no biases, RMSNorm weights only, wqkv (3 * qkv, D), wo (D, qkv),
    projector mm_projector.proj.0 / proj.2 / post_norm."""
    v = vision_spec(vision, "kimi_k3")
    d, p, m, q = v["hidden_size"], v["patch_size"], v["intermediate_size"], v["qkv_hidden_size"]
    kh, kw = v["merge_kernel_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "vision_tower.patch_embed.proj.weight": (d, 3, p, p),
        "vision_tower.patch_embed.pos_emb.weight": (v["pos_emb_height"], v["pos_emb_width"], d),
    }
    for i in range(v["num_layers"]):
        b = f"vision_tower.encoder.blocks.{i}"
        shapes.update({f"{b}.norm0.weight": (d,), f"{b}.norm1.weight": (d,)})
        shapes.update({f"{b}.wqkv.weight": (3 * q, d), f"{b}.wo.weight": (d, q)})
        shapes.update({f"{b}.mlp.fc0.weight": (m, d), f"{b}.mlp.fc1.weight": (d, m)})
    shapes["vision_tower.encoder.final_layernorm.weight"] = (d,)
    merged = d * kh * kw
    shapes.update({"mm_projector.proj.0.weight": (merged, merged), "mm_projector.proj.2.weight": (text_hidden, merged)})
    shapes["mm_projector.post_norm.weight"] = (text_hidden,)
    return shapes


def vision_tensor_shapes(family: str, vision: dict[str, Any] | None = None, text_hidden: int = 256) -> dict:
    """Checkpoint name -> shape for the tower and projector of `family`."""
    if family == "kimi_k3":
        return k3_tensor_shapes(vision, text_hidden)
    v = vision_spec(vision)
    d, p, m = v["hidden_size"], v["patch_size"], v["intermediate_size"]
    kh, kw = v["merge_kernel_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "vision_tower.patch_embed.proj.weight": (d, 3, p, p),
        "vision_tower.patch_embed.proj.bias": (d,),
        "vision_tower.patch_embed.pos_emb.weight": (v["pos_emb_height"], v["pos_emb_width"], d),
    }
    for i in range(v["num_layers"]):
        b = f"vision_tower.encoder.blocks.{i}"
        for norm in ("norm0", "norm1"):
            shapes[f"{b}.{norm}.weight"] = shapes[f"{b}.{norm}.bias"] = (d,)
        shapes.update({f"{b}.wqkv.weight": (3 * d, d), f"{b}.wqkv.bias": (3 * d,)})
        shapes.update({f"{b}.wo.weight": (d, d), f"{b}.wo.bias": (d,)})
        shapes.update({f"{b}.mlp.fc0.weight": (m, d), f"{b}.mlp.fc0.bias": (m,)})
        shapes.update({f"{b}.mlp.fc1.weight": (d, m), f"{b}.mlp.fc1.bias": (d,)})
    shapes["vision_tower.encoder.final_layernorm.weight"] = (d,)
    shapes["vision_tower.encoder.final_layernorm.bias"] = (d,)
    norm, lin1, lin2 = PROJECTOR_NAMES[family]
    merged = d * kh * kw
    shapes.update({f"{norm}.weight": (d,), f"{norm}.bias": (d,)})
    shapes.update({f"{lin1}.weight": (merged, merged), f"{lin1}.bias": (merged,)})
    shapes.update({f"{lin2}.weight": (text_hidden, merged), f"{lin2}.bias": (text_hidden,)})
    return shapes


def make_vision_tensors(
    family: str = "kimi_vl",
    vision: dict[str, Any] | None = None,
    text_hidden: int = 256,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Random tower + projector tensors with checkpoint names. Weights ~ N(0, 1/fan_in) so that attention is
    sharp and position bugs change the output; LayerNorm weights 1 + noise; biases and pos table noisy."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in vision_tensor_shapes(family, vision, text_hidden).items():
        if "norm" in name and name.endswith(".weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith("pos_emb.weight"):
            t = 0.5 * torch.randn(shape, generator=gen)
        else:
            fan_in = 1
            for s in shape[1:]:
                fan_in *= s
            t = torch.randn(shape, generator=gen) / fan_in**0.5
        out[name] = t.to(dtype).contiguous()
    return out


def language_model_tensors(family: str, text_hidden: int, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A few LLM tensors (one 2048x2048) that an encoder loader must never read."""
    gen = torch.Generator().manual_seed(seed + 1)
    attn = "q_proj" if family == "kimi_vl" else "q_a_proj"
    shapes = {
        "language_model.model.embed_tokens.weight": (512, text_hidden),
        f"language_model.model.layers.0.self_attn.{attn}.weight": (2048, 2048),
        "language_model.model.layers.0.mlp.gate_proj.weight": (384, text_hidden),
        "language_model.model.norm.weight": (text_hidden,),
        "language_model.lm_head.weight": (512, text_hidden),
    }
    tensors = {k: torch.randn(s, generator=gen).to(dtype) for k, s in shapes.items()}
    if family != "kimi_vl":  # the release packs LLM experts as int4 in int32 words: not a float tensor
        key = "language_model.model.layers.1.mlp.experts.0.down_proj.weight_packed"
        tensors[key] = torch.randint(0, 1 << 30, (64, 32), generator=gen, dtype=torch.int32)
    return tensors


def hf_config(family: str, vision: dict[str, Any] | None = None, text_hidden: int = 256) -> dict[str, Any]:
    """config.json as the released checkpoints spell it."""
    v = vision_spec(vision, family)
    common = {
        "patch_size": v["patch_size"],
        "init_pos_emb_height": v["pos_emb_height"],
        "init_pos_emb_width": v["pos_emb_width"],
        "merge_kernel_size": list(v["merge_kernel_size"]),
    }
    if family == "kimi_vl":
        return {
            "architectures": ["KimiVLForConditionalGeneration"],
            "model_type": "kimi_vl",
            "media_placeholder_token_id": 163605,
            "torch_dtype": "bfloat16",
            "vision_config": {
                "model_type": "moonvit",
                "hidden_size": v["hidden_size"],
                "num_hidden_layers": v["num_layers"],
                "num_attention_heads": v["num_heads"],
                "intermediate_size": v["intermediate_size"],
                **common,
            },
            "text_config": {"model_type": "deepseek_v3", "hidden_size": text_hidden, "vocab_size": 512},
        }
    if family == "kimi_k3":  # every key of KimiK3VisionConfig, as a real config.json spells them
        return {
            "architectures": ["KimiK3ForConditionalGeneration"],
            "model_type": "kimi_k3",
            "media_placeholder_token_id": 163605,
            "vision_config": {
                "model_type": "kimi_k3_vision",
                "vt_hidden_size": v["hidden_size"],
                "vt_num_hidden_layers": v["num_layers"],
                "vt_num_attention_heads": v["num_heads"],
                "vt_intermediate_size": v["intermediate_size"],
                "qkv_hidden_size": v["qkv_hidden_size"],
                "init_pos_emb_time": 4,
                "pos_emb_type": "divided_fixed",
                "pos_emb_interpolation_mode": "bilinear",
                "merge_type": "sd2_tpool",
                "video_attn_type": "spatial_temporal",
                "mm_projector_type": "patchmergerv2",
                "projector_hidden_act": "gelu",
                "projector_ln_eps": 1e-5,
                "norm_type": "rmsnorm",
                "attn_bias": False,
                "patch_embed_proj_bias": False,
                "mlp_type": "mlp2",
                "linear_bias": False,
                "activation_func": "gelu_pytorch_tanh",
                "text_hidden_size": text_hidden,
                **common,
            },
            "text_config": {"model_type": "kimi_linear", "hidden_size": text_hidden, "vocab_size": 512},
        }
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "media_placeholder_token_id": 163605,
        "vision_config": {
            "vt_hidden_size": v["hidden_size"],
            "vt_num_hidden_layers": v["num_layers"],
            "vt_num_attention_heads": v["num_heads"],
            "vt_intermediate_size": v["intermediate_size"],
            "init_pos_emb_time": 4,
            "pos_emb_type": "divided_fixed",
            "merge_type": "sd2_tpool",
            "video_attn_type": "spatial_temporal",
            "mm_projector_type": "patchmerger",
            "mm_hidden_size": v["hidden_size"],
            "projector_hidden_act": "gelu",
            "projector_ln_eps": 1e-5,
            "text_hidden_size": text_hidden,
            **common,
        },
        "text_config": {"model_type": "kimi_k2", "hidden_size": text_hidden, "vocab_size": 512},
    }


def preprocessor_config(family: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """preprocessor_config.json of the release; `overrides` is deep-merged (K2.5 keys live in media_proc_cfg)."""
    if family == "kimi_vl":
        base: dict[str, Any] = {
            "image_processor_type": "KimiVLImageProcessor",
            "patch_size": 14,
            "pad_input": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "in_token_limit": 4096,
            "merge_kernel_size": [2, 2],
        }
    else:
        base = {
            "media_proc_cfg": {
                "in_patch_limit": 16384,
                "patch_size": 14,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "merge_kernel_size": 2,
                "fixed_output_tokens": None,
                "patch_limit_on_one_side": 512,
            }
        }
        if family == "kimi_k3":
            base["media_proc_cfg"]["transparent_bg_config"] = {
                "pattern": "chessboard",
                "chessboard_square_size": 16,
                "chessboard_white_value": 255,
                "chessboard_gray_value": 200,
                "chessboard_square_on_top_left": True,
                "transparent_bg_fill_stage": "after_resize",
            }
    return deep_merge(base, overrides or {})


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def write_checkpoint(
    dir: Path | str,  # noqa: A002 - the name other tests use
    family: str = "kimi_vl",
    vision: dict[str, Any] | None = None,
    text_hidden: int = 256,
    sharded: bool = True,
    with_language_model: bool = True,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    preprocessor: dict[str, Any] | None = None,
    config_overrides: dict[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """Write a checkpoint directory; return the vision + projector tensors written (checkpoint names).

    Sharded: three shards — the first holds LLM tensors and the first half of the tower, the second the rest
    of the tower and the projector, the third ONLY language-model tensors (a loader must never open it).
    """
    path = Path(dir)
    path.mkdir(parents=True, exist_ok=True)
    vision_tensors = make_vision_tensors(family, vision, text_hidden, seed, dtype)
    lm = language_model_tensors(family, text_hidden, seed, dtype) if with_language_model else {}
    config = deep_merge(hf_config(family, vision, text_hidden), config_overrides or {})
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "preprocessor_config.json").write_text(json.dumps(preprocessor_config(family, preprocessor), indent=2))
    if not sharded:
        save_file({**lm, **vision_tensors}, str(path / "model.safetensors"), metadata={"format": "pt"})
        return vision_tensors
    names = list(vision_tensors)
    half = len(names) // 2
    lm_names = list(lm)
    shards = [
        {**{k: lm[k] for k in lm_names[:1]}, **{k: vision_tensors[k] for k in names[:half]}},
        {**{k: vision_tensors[k] for k in names[half:]}, **{k: lm[k] for k in lm_names[1:2]}},
        {k: lm[k] for k in lm_names[2:]} or {"language_model.model.norm.bias": torch.zeros(text_hidden, dtype=dtype)},
    ]
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / file), metadata={"format": "pt"})
        for key, t in shard.items():
            weight_map[key] = file
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return vision_tensors
