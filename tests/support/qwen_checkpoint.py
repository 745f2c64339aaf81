"""Small random-weight Qwen3-VL / Qwen3.5 checkpoints in the layout transformers 5.23 writes (`model.visual.*`),
spelled out here from `Qwen3VLVisionModel`'s modules, independently of `mmproc.models`; and a plain per-image
reference forward over those tensors (the rotate-half RoPE, merge-window patch order and Conv3d of the source).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

TINY_QWEN: dict[str, Any] = {
    "depth": 3,
    "hidden_size": 144,
    "num_heads": 2,
    "intermediate_size": 288,
    "out_hidden_size": 64,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [0, 1],
}


def qwen_tensor_shapes(v: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    d, m, p, t = v["hidden_size"], v["intermediate_size"], v["patch_size"], v["temporal_patch_size"]
    merged, out = d * v["spatial_merge_size"] ** 2, v["out_hidden_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.visual.patch_embed.proj.weight": (d, 3, t, p, p),
        "model.visual.patch_embed.proj.bias": (d,),
        "model.visual.pos_embed.weight": (v["num_position_embeddings"], d),
    }
    for i in range(v["depth"]):
        b = f"model.visual.blocks.{i}"
        for norm in ("norm1", "norm2"):
            shapes |= {f"{b}.{norm}.weight": (d,), f"{b}.{norm}.bias": (d,)}
        shapes |= {f"{b}.attn.qkv.weight": (3 * d, d), f"{b}.attn.qkv.bias": (3 * d,)}
        shapes |= {f"{b}.attn.proj.weight": (d, d), f"{b}.attn.proj.bias": (d,)}
        shapes |= {f"{b}.mlp.linear_fc1.weight": (m, d), f"{b}.mlp.linear_fc1.bias": (m,)}
        shapes |= {f"{b}.mlp.linear_fc2.weight": (d, m), f"{b}.mlp.linear_fc2.bias": (d,)}
    mergers = [("model.visual.merger", d)] + [
        (f"model.visual.deepstack_merger_list.{i}", merged) for i in range(len(v["deepstack_visual_indexes"]))
    ]
    for prefix, norm_dim in mergers:
        shapes |= {f"{prefix}.norm.weight": (norm_dim,), f"{prefix}.norm.bias": (norm_dim,)}
        shapes |= {f"{prefix}.linear_fc1.weight": (merged, merged), f"{prefix}.linear_fc1.bias": (merged,)}
        shapes |= {f"{prefix}.linear_fc2.weight": (out, merged), f"{prefix}.linear_fc2.bias": (out,)}
    return shapes


def make_qwen_tensors(v: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in qwen_tensor_shapes(v).items():
        t = torch.randn(shape, generator=gen) * (0.1 if name.endswith("bias") or "norm" in name else 0.05)
        out[name] = t + 1.0 if "norm" in name and name.endswith("weight") else t
    return out


def qwen_config(v: dict[str, Any], model_type: str = "qwen3_vl") -> dict[str, Any]:
    vision_type = {"qwen3_vl": "qwen3_vl_vision", "qwen3_5_moe": "qwen3_5_moe_vision", "qwen3_5": "qwen3_5_vision"}
    vision = {**v, "model_type": vision_type[model_type], "hidden_act": "gelu_pytorch_tanh", "in_channels": 3}
    if model_type != "qwen3_vl":
        vision.pop("deepstack_visual_indexes")
    vision["rope_parameters"] = {"rope_type": "axial", "rope_theta": 10000.0}
    return {
        "model_type": model_type,
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "vision_config": vision,
        "text_config": {"hidden_size": v["out_hidden_size"], "model_type": model_type + "_text"},
    }


PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_convert_rgb": True,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
}


def write_qwen_checkpoint(
    path: Path, v: dict[str, Any] | None = None, *, model_type: str = "qwen3_vl", shards: int = 1, seed: int = 0
) -> dict[str, torch.Tensor]:
    """config.json, preprocessor_config.json, the vision tensors (+ two language-model ones) in `shards` files;
    returns the vision tensors."""
    v = {**TINY_QWEN, **(v or {})}
    if model_type != "qwen3_vl":
        v["deepstack_visual_indexes"] = []
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(qwen_config(v, model_type)))
    (path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    tensors = make_qwen_tensors(v, seed)
    everything = {
        **tensors,
        "model.language_model.embed_tokens.weight": torch.zeros(8, 4),
        "lm_head.weight": torch.zeros(8, 4),
    }
    names = sorted(everything)
    if shards == 1:
        save_file(everything, str(path / "model.safetensors"))
        return tensors
    weight_map = {}
    per = math.ceil(len(names) / shards)
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: everything[n].contiguous() for n in names[i * per : (i + 1) * per]}
        save_file(part, str(path / file))
        weight_map |= dict.fromkeys(part, file)
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tensors


# -- the reference forward ---------------------------------------------------------------------------------------


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def reference_image(
    t: dict[str, torch.Tensor], v: dict[str, Any], patches: torch.Tensor, h: int, w: int
) -> torch.Tensor:
    """One image (or video slice): patches (h*w, 3[, 2], P, P) row-major -> (h/2 * w/2, (1 + levels) * out) float32,
    as the source does it: patches reordered into 2x2 windows, an image's frame twice through Conv3d, align-corners
    position table, rotate-half RoPE, full attention, mergers on consecutive groups of 4 rows."""
    d, heads, m = v["hidden_size"], v["num_heads"], v["spatial_merge_size"]
    dh, side = d // heads, math.isqrt(v["num_position_embeddings"])
    window = torch.arange(h * w).view(h // m, m, w // m, m).permute(0, 2, 1, 3).reshape(-1)  # row-major index
    rows, cols = window // w, window % w
    x = patches[window]  # (L, 3, 2, P, P) a video slice's patches, or (L, 3, P, P): a still image, its frame twice
    x = x if x.dim() == 5 else x[:, :, None].expand(-1, -1, 2, -1, -1)
    x = F.conv3d(x, t["model.visual.patch_embed.proj.weight"], t["model.visual.patch_embed.proj.bias"]).flatten(1)
    table = t["model.visual.pos_embed.weight"].view(side, side, d).permute(2, 0, 1)[None]
    pos = F.interpolate(table, size=(h, w), mode="bilinear", align_corners=True)[0].permute(1, 2, 0)  # (h, w, D)
    x = x + pos[rows, cols]
    inv = 1.0 / (10000.0 ** (torch.arange(0, dh // 2, 2, dtype=torch.float32) / (dh // 2)))
    half = torch.cat((rows[:, None] * inv, cols[:, None] * inv), dim=1)  # (L, dh/2): rows then columns
    cos, sin = torch.cat((half, half), 1).cos()[:, None], torch.cat((half, half), 1).sin()[:, None]
    taps = []
    for i in range(v["depth"]):
        b = f"model.visual.blocks.{i}"
        y = F.layer_norm(x, (d,), t[f"{b}.norm1.weight"], t[f"{b}.norm1.bias"], 1e-6)
        q, k, val = F.linear(y, t[f"{b}.attn.qkv.weight"], t[f"{b}.attn.qkv.bias"]).view(-1, 3, heads, dh).unbind(1)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), val.transpose(0, 1)).transpose(0, 1)
        x = x + F.linear(o.reshape(-1, d), t[f"{b}.attn.proj.weight"], t[f"{b}.attn.proj.bias"])
        y = F.layer_norm(x, (d,), t[f"{b}.norm2.weight"], t[f"{b}.norm2.bias"], 1e-6)
        y = F.gelu(F.linear(y, t[f"{b}.mlp.linear_fc1.weight"], t[f"{b}.mlp.linear_fc1.bias"]), approximate="tanh")
        x = x + F.linear(y, t[f"{b}.mlp.linear_fc2.weight"], t[f"{b}.mlp.linear_fc2.bias"])
        if i in v["deepstack_visual_indexes"]:
            taps.append((x, f"model.visual.deepstack_merger_list.{len(taps)}", True))

    def merge(hidden: torch.Tensor, prefix: str, post: bool) -> torch.Tensor:
        wn, bn = t[f"{prefix}.norm.weight"], t[f"{prefix}.norm.bias"]
        hidden = (
            F.layer_norm(hidden.reshape(-1, d * m * m), wn.shape, wn, bn, 1e-6)
            if post
            else (F.layer_norm(hidden, (d,), wn, bn, 1e-6).reshape(-1, d * m * m))
        )
        hidden = F.gelu(F.linear(hidden, t[f"{prefix}.linear_fc1.weight"], t[f"{prefix}.linear_fc1.bias"]))
        return F.linear(hidden, t[f"{prefix}.linear_fc2.weight"], t[f"{prefix}.linear_fc2.bias"])

    levels = [merge(x, "model.visual.merger", False)] + [merge(*tap) for tap in taps]
    return torch.cat(levels, dim=1)
