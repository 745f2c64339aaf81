"""Pillow's BICUBIC resize of 8-bit images, bit for bit, as torch ops that run on the CPU or on a GPU.

The checkpoints' processors use `PIL.Image.resize(size, BICUBIC)`, so a GPU pipeline must give the same bytes.
As libImaging/Resample.c: two separable passes, each rounding to uint8, in the installed Pillow's order; Keys'
cubic (a = -0.5) widened by max(scale, 1) when shrinking; weights computed in Python floats (C doubles) and made
fixed point with 22 fractional bits; exact int32 accumulation, so order does not matter. No alpha here
(Pillow premultiplies it first).
"""

from __future__ import annotations

import functools
import math

import PIL
import torch
from torch import Tensor

_PRECISION_BITS = 22  # Resample.c: 32 - 8 - 2
_SUPPORT = 2.0  # bicubic
_A = -0.5  # Pillow's bicubic coefficient (torch and OpenCV use -0.75)
_VERTICAL_FIRST_RULE = int(PIL.__version__.split(".")[0]) >= 13
_CHUNK_ELEMENTS = 1 << 25  # bound on the gathered (rows, out, taps, channels) int32 block per pass


def _cubic(x: float) -> float:
    x = abs(x)
    if x < 1.0:
        return ((_A + 2.0) * x - (_A + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * _A
    return 0.0


@functools.lru_cache(maxsize=256)
def pillow_weights(n_in: int, n_out: int) -> tuple[Tensor, Tensor]:
    """(taps (n_out, K) int64 input indices, weights (n_out, K) int32 fixed point) of Pillow's `precompute_coeffs`
    + `normalize_coeffs_8bpc` for a 1-D resize n_in -> n_out; unused taps point at 0 with weight 0. CPU tensors."""
    scale = n_in / n_out
    filterscale = max(scale, 1.0)
    support = _SUPPORT * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    taps = torch.zeros(n_out, ksize, dtype=torch.int64)
    weights = torch.zeros(n_out, ksize, dtype=torch.int32)
    ss = 1.0 / filterscale
    for i in range(n_out):
        center = (i + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), n_in) - xmin
        k = [_cubic((x + xmin - center + 0.5) * ss) for x in range(xmax)]
        total = sum(k)
        if total != 0.0:
            k = [w / total for w in k]
        fixed = [int(-0.5 + w * (1 << _PRECISION_BITS)) if w < 0 else int(0.5 + w * (1 << _PRECISION_BITS)) for w in k]
        taps[i, :xmax] = torch.arange(xmin, xmin + xmax)
        weights[i, :xmax] = torch.tensor(fixed, dtype=torch.int32)
    return taps, weights


def _pass(image: Tensor, n_out: int, dim: int) -> Tensor:
    """One 1-D pass of (H, W, C) uint8 along `dim` (1: width, 0: height) -> uint8 with that side n_out."""
    n_in = image.shape[dim]
    if n_in == n_out:
        return image
    taps, weights = (t.to(image.device, non_blocking=True) for t in pillow_weights(n_in, n_out))
    src = image if dim == 1 else image.transpose(0, 1)  # rows are the untouched axis
    rows, _, channels = src.shape
    out = torch.empty(rows, n_out, channels, dtype=torch.uint8, device=image.device)
    step = max(1, _CHUNK_ELEMENTS // (n_out * taps.shape[1] * channels))
    w = weights[None, :, :, None]  # (1, n_out, K, 1)
    for start in range(0, rows, step):
        block = src[start : start + step, taps].to(torch.int32)  # (r, n_out, K, C)
        acc = (block * w).sum(dim=2) + (1 << (_PRECISION_BITS - 1))
        out[start : start + step] = (acc >> _PRECISION_BITS).clamp_(0, 255).to(torch.uint8)
    return out if dim == 1 else out.transpose(0, 1).contiguous()


def pillow_bicubic(image: Tensor, size: tuple[int, int]) -> Tensor:
    """(H, W, C) uint8 (any device) -> (h, w, C) uint8 equal to Pillow's `resize((w, h), BICUBIC)` of that image
    (modes L and RGB). `size` is (width, height), as Pillow takes it."""
    width, height = size
    if image.dtype != torch.uint8 or image.dim() != 3 or width < 1 or height < 1:
        raise ValueError(f"want an (H, W, C) uint8 image and a positive size, got {image.dtype} {tuple(image.shape)}")
    in_height, in_width = image.shape[0], image.shape[1]
    if _VERTICAL_FIRST_RULE and in_height - height > 0 and in_height - height > (in_width - width) * 2:
        return _pass(_pass(image, height, dim=0), width, dim=1)
    return _pass(_pass(image, width, dim=1), height, dim=0)
