"""An independent float64 Kimi K3 pipeline (MoonViT3d + PatchMergerMLPV2 and its image processing), written from
SGLang 0.5.23's `kimi_k3_vl.py`, `configs/kimi_k3.py` and `kimi_k3_image_processing.py`: per-image loops, a
complex RoPE table, `F.interpolate` for the position table, plain RMSNorm formulas, the NaViT resize rule, and
the transparent-background blend after the resize.

It must not import `mmproc`: it is the yardstick for it. Slow by design; tests only.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

# nn.RMSNorm(dim) without eps computes a float32 input with float32's eps (the server's float32 model).
TOWER_EPS = float(np.finfo(np.float32).eps)


def navit_size(width: int, height: int, cfg: dict) -> tuple[int, int, int, int]:
    """(new_w, new_h, pad_w, pad_h) of `navit_resize_config`."""
    p, m = cfg["patch_size"], cfg["merge_kernel_size"]
    limit, side = cfg["in_patch_limit"], cfg["patch_limit_on_one_side"]
    scale = min(
        1.0, math.sqrt(limit / (max(1.0, width // p) * max(1.0, height // p))), side * p / width, side * p / height
    )
    new_w = min(max(1, int(width * scale)), side * p)
    new_h = min(max(1, int(height * scale)), side * p)
    f = m * p
    return new_w, new_h, (f - new_w % f) % f, (f - new_h % f) % f


def preprocess(image: Image.Image, cfg: dict) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """A decoded image (RGB, or RGBA when transparent) -> float64 patches (L, 3, p, p) and grid (t, h, w)."""
    new_w, new_h, pad_w, pad_h = navit_size(image.width, image.height, cfg)
    if (new_w, new_h) != image.size:
        image = image.resize((new_w, new_h), Image.Resampling.BICUBIC)
    pixels = np.asarray(image).astype(np.float64)
    if pixels.shape[2] == 4:
        bg = cfg.get("transparent_bg_config")
        if bg is None:
            pixels = pixels[..., :3]
        else:
            size = bg.get("chessboard_square_size", 16)
            parity = (np.arange(new_h)[:, None] // size + np.arange(new_w)[None, :] // size) % 2
            gray_where = 1 if bg.get("chessboard_square_on_top_left", True) else 0
            back = np.where(
                parity == gray_where, bg.get("chessboard_gray_value", 200), bg.get("chessboard_white_value", 255)
            )
            # In float32 as SGLang computes it: floor() of a blend that lands on an integer in float64 can fall
            # one level lower in float32, and float32 is what the model's processor does.
            px = pixels.astype(np.float32)
            alpha = px[..., 3:] / np.float32(255.0)
            blend = alpha * px[..., :3] + (np.float32(1.0) - alpha) * back[..., None].astype(np.float32)
            pixels = np.floor(np.clip(blend, 0, 255)).astype(np.float64)
    padded = np.zeros((new_h + pad_h, new_w + pad_w, 3))
    padded[:new_h, :new_w] = pixels
    x = (padded / 255.0 - np.array(cfg["image_mean"])) / np.array(cfg["image_std"])
    p = cfg["patch_size"]
    gh, gw = padded.shape[0] // p, padded.shape[1] // p
    chw = torch.from_numpy(x).permute(2, 0, 1)
    patches = chw.reshape(3, gh, p, gw, p).permute(1, 3, 0, 2, 4).reshape(gh * gw, 3, p, p)
    return patches.contiguous(), (1, gh, gw)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope_table(head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """(512, 512, head_dim/2) complex: per position (y, x), frequencies interleaved as (x_0, y_0, x_1, y_1, ...)."""
    n = 512
    pos = torch.arange(n * n, dtype=torch.float64)
    xs, ys = pos % n, pos // n
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 4, dtype=torch.float64)[: head_dim // 4] / head_dim)
    x_cis = torch.polar(torch.ones(n * n, head_dim // 4, dtype=torch.float64), torch.outer(xs, freqs))
    y_cis = torch.polar(torch.ones(n * n, head_dim // 4, dtype=torch.float64), torch.outer(ys, freqs))
    return torch.stack([x_cis, y_cis], dim=-1).reshape(n, n, head_dim // 2)


def _rotate(x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
    # x (L, H, dh), cis (L, dh/2): consecutive element pairs are complex numbers
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * cis[:, None]).flatten(-2)


class ReferenceKimiK3:
    """Tower + projector from checkpoint-named tensors; `vision` uses the keys of tests/support/checkpoints.py."""

    def __init__(self, vision: dict, tensors: dict[str, torch.Tensor], projector_eps: float = 1e-5) -> None:
        self.v = vision
        self.t = {k: t.double() for k, t in tensors.items()}
        self.heads = vision["num_heads"]
        self.head_dim = vision["qkv_hidden_size"] // self.heads
        self.rope = _rope_table(self.head_dim)
        self.projector_eps = projector_eps

    def image(self, patches: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """One image's patches (L, 3, p, p) -> embeddings (h*w/4, text_hidden) float64."""
        t, h, w = grid
        assert t == 1
        g = self.t
        d, p = self.v["hidden_size"], self.v["patch_size"]
        x = F.conv2d(patches, g["vision_tower.patch_embed.proj.weight"], stride=p).view(-1, d)
        table = g["vision_tower.patch_embed.pos_emb.weight"]
        if (h, w) != tuple(table.shape[:2]):
            table = F.interpolate(table.permute(2, 0, 1)[None], size=(h, w), mode="bilinear")[0].permute(1, 2, 0)
        x = x + table.reshape(h * w, d)
        cis = self.rope[:h, :w].reshape(h * w, -1)
        for i in range(self.v["num_layers"]):
            b = f"vision_tower.encoder.blocks.{i}"
            qkv = _rms(x, g[f"{b}.norm0.weight"], TOWER_EPS) @ g[f"{b}.wqkv.weight"].T
            q, k, v = qkv.view(h * w, 3, self.heads, self.head_dim).unbind(1)
            q, k = _rotate(q, cis), _rotate(k, cis)
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.head_dim)
            attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(h * w, -1)
            x = x + attn @ g[f"{b}.wo.weight"].T
            hidden = _rms(x, g[f"{b}.norm1.weight"], TOWER_EPS) @ g[f"{b}.mlp.fc0.weight"].T
            x = x + F.gelu(hidden, approximate="tanh") @ g[f"{b}.mlp.fc1.weight"].T
        x = _rms(x, g["vision_tower.encoder.final_layernorm.weight"], TOWER_EPS)
        merged = x.view(h // 2, 2, w // 2, 2, d).permute(0, 2, 1, 3, 4).reshape(h * w // 4, 4 * d)
        y = F.gelu(merged @ g["mm_projector.proj.0.weight"].T) @ g["mm_projector.proj.2.weight"].T
        return _rms(y, g["mm_projector.post_norm.weight"], self.projector_eps)
