"""`bench encoder`'s workloads: their grids by the family's rules, their FLOPs, a seeded batch and encoder."""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence

import torch

from mmproc.models import VisionConfig, VisionEncoder
from mmproc.preprocess import PreprocessConfig, target_grid
from mmproc.types import PackedBatch

MIXED_SIDES = (224, 1536)  # mixed workload: each side drawn uniformly in this range (pixels)


def workload_name(value: str) -> str:
    """argparse type of a workload: SIDExCOUNT or mixedN, both positive (else a one-line usage error)."""
    side, x, count = value.partition("x")
    ok = value[5:].isdigit() and int(value[5:]) > 0 if value.startswith("mixed") else (
        x == "x" and side.isdigit() and count.isdigit() and int(side) > 0 and int(count) > 0
    )  # fmt: skip
    if not ok:
        raise argparse.ArgumentTypeError(f"{value!r} is not a workload: SIDExCOUNT (e.g. 448x64) or mixedN")
    return value


def workload_grids(name: str, seed: int, rules: PreprocessConfig | None = None) -> list[tuple[int, int]]:
    """Patch grids of a workload under the preset family's preprocessing (default Kimi K2.5's): 'SIDExCOUNT'
    (square) or 'mixedN' (seeded)."""
    rules = rules or PreprocessConfig.kimi_k25()
    if name.startswith("mixed"):
        rng = random.Random(seed)
        sizes = [(rng.randint(*MIXED_SIDES), rng.randint(*MIXED_SIDES)) for _ in range(int(name[5:]))]
        return [target_grid(w, h, rules) for w, h in sizes]
    side, count = (int(v) for v in name.split("x"))
    return [target_grid(side, side, rules)] * count


def encoder_flops(config: VisionConfig, grids: Sequence[tuple[int, int]]) -> dict[str, int]:
    """Exact FLOPs of one forward over images with these grids: 2*M*N*K per matmul, 4*L^2*A attention (A the
    attention width: hidden for MoonViT, qkv_hidden_size for K3; the real head dim, never a padded one). One merger
    per output level (Qwen3-VL's DeepStack levels each have one); the patch embedding as computed, over one frame
    (Qwen's temporal patch of 2 is folded into the weight)."""
    d, inter, text, a = config.hidden_size, config.intermediate_size, config.text_hidden_size, config.qkv_width
    levels = len(config.output_widths)
    kk = config.merge_kernel_size[0] * config.merge_kernel_size[1]
    patch_in = 3 * config.patch_size**2
    per_patch_layer = 2 * d * (3 * a + a + 2 * inter)  # wqkv, wo, fc0, fc1
    matmul = attention = 0
    for h, w in grids:
        seq, tokens = h * w, h * w // kk
        matmul += 2 * seq * patch_in * d + config.num_layers * seq * per_patch_layer
        matmul += levels * 2 * tokens * (kk * d) * (kk * d + text)  # each merger's linear_1, linear_2
        attention += config.num_layers * 4 * seq * seq * a  # QK^T and PV
    return {"matmul": matmul, "attention": attention, "total": matmul + attention}


def random_batch(
    grids: Sequence[tuple[int, int]],
    patch: int,
    kernel: tuple[int, int],
    seed: int,
    dtype: torch.dtype = torch.float32,
    pin_memory: bool | None = None,
) -> PackedBatch:
    """(sum L, 3, P, P) pixels uniform in [-1, 1) drawn in float32 and stored in `dtype` (pinned by default when
    CUDA is present), and CPU metadata, as `pack_images(..., dtype=dtype)` builds it: the same values for any
    dtype up to its rounding."""
    offsets = [0]
    for h, w in grids:
        offsets.append(offsets[-1] + h * w)
    gen = torch.Generator().manual_seed(seed)
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    pixels = torch.empty(offsets[-1], 3, patch, patch, dtype=dtype, pin_memory=pin)
    pixels.copy_(torch.rand(pixels.shape, generator=gen).mul_(2).sub_(1))  # float32 math, one rounding
    tokens = tuple((h // kernel[0]) * (w // kernel[1]) for h, w in grids)
    cu = torch.tensor(offsets, dtype=torch.int32)
    return PackedBatch(pixels, tuple(grids), cu, max(h * w for h, w in grids), tokens)


def random_encoder(
    config: VisionConfig, dtype: torch.dtype, seed: int, device: torch.device | str = "cuda"
) -> VisionEncoder:
    """The model with random weights drawn on `device` (std 0.02; LayerNorm weight 1 + noise): seconds, not minutes."""
    with torch.device("meta"):
        model = VisionEncoder(config)
    gen = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, p in model.state_dict().items():
        t = torch.randn(p.shape, device=device, generator=gen).mul_(0.02)
        if "norm" in name and name.endswith(".weight"):
            t.add_(1.0)
        state[name] = t.to(dtype)
    model.load_state_dict(state, strict=True, assign=True)
    return model.requires_grad_(False).eval()
