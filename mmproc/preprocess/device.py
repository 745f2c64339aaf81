"""The image rules on torch tensors, on whatever device the pixels are (a GPU when JPEGs are decoded there): the
same resize plan, the family's resize (`Rule.resize_tensor`; Kimi: Pillow's BICUBIC bit for bit, resize.py), black
padding, the family's normalization table and the patch layout, so an opaque image gives the same patches as
`preprocess_image` on the CPU (Qwen3-VL off the CPU: torchvision's float path there, which may differ by one level).

Opaque images only: an image with alpha keeps the CPU path (Pillow premultiplies before resizing; K3 composites).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from mmproc.errors import InvalidMediaError, Reason
from mmproc.preprocess.config import PreprocessConfig
from mmproc.preprocess.rules import RULES
from mmproc.types import PreprocessedImage


@functools.lru_cache(maxsize=16)
def _cpu_lut(cfg: PreprocessConfig) -> Tensor:
    """The family's table as the CPU path ships it: one tensor per config, so a batch shares it by identity."""
    with torch.inference_mode(False):
        return torch.from_numpy(RULES[cfg.family].lut(cfg))


@functools.lru_cache(maxsize=16)
def _device_lut(cfg: PreprocessConfig, device: torch.device) -> Tensor:
    """The family's normalization table on `device`, copied there once per config (not once per image)."""
    with torch.inference_mode(False):
        return _cpu_lut(cfg).to(device)


def preprocess_tensor(rgb: Tensor, cfg: PreprocessConfig, normalize: bool = True) -> PreprocessedImage:
    """(H, W, 3) uint8 on any device -> patches (grid_h * grid_w, 3, p, p) float32 on that device, grid, tokens;
    with normalize=False the uint8 patches and the family's (CPU) table, as `preprocess_image` gives them."""
    return preprocess_same_size([rgb], cfg, normalize)[0]


def preprocess_same_size(
    rgbs: Sequence[Tensor], cfg: PreprocessConfig, normalize: bool = True
) -> list[PreprocessedImage]:
    """`preprocess_tensor` of each of `rgbs`, images of one (H, W) on one device: one plan, and padding, patch
    layout and normalization each one op over the whole stack. Why: a thread short of the GIL (the server's GPU
    decoder, beside a busy event loop) pays per Python step, not per pixel (docs/benchmarks/preprocess.md,
    session 12). The patches of image i are a view of the stack's: the stack lives until the last is freed."""
    first = rgbs[0]
    if first.dtype != torch.uint8 or first.dim() != 3 or first.shape[2] != 3:
        raise ValueError(f"want (H, W, 3) uint8 images, got {first.dtype} {tuple(first.shape)}")
    if any(rgb.shape != first.shape for rgb in rgbs):
        raise ValueError("images of one size only")
    height, width = first.shape[0], first.shape[1]
    if width < 1 or height < 1:
        raise InvalidMediaError(f"image is {width}x{height}", reason=Reason.TOO_SMALL)
    rule = RULES[cfg.family]
    plan = rule.plan(width, height, cfg)
    if plan.resize_to is not None and plan.resize_to != (width, height):
        rgbs = [rule.resize_tensor(rgb, plan.resize_to) for rgb in rgbs]  # large images: their device work dominates
    stack = torch.stack(rgbs) if len(rgbs) > 1 else rgbs[0].unsqueeze(0)  # (N, h, w, 3)
    n, p = len(rgbs), cfg.patch_size
    gh, gw = plan.grid_hw
    pad_w, pad_h = plan.pad_wh
    # Black bytes right and below, as the references; no copy for an image that fills its grid (the view below
    # only splits dimensions, so a rotated JPEG's strided pixels do too)
    padded = F.pad(stack, (0, 0, 0, pad_w, 0, pad_h)) if pad_w or pad_h else stack
    assert padded.shape[1:3] == (gh * p, gw * p), (plan, stack.shape)
    grid = padded.view(n, gh, p, gw, p, 3).permute(0, 1, 3, 5, 2, 4)  # (N, gh, gw, 3, p, p) uint8 view
    kh, kw = cfg.merge_kernel_size
    tokens, size = (gh // kh) * (gw // kw), (width, height)
    if normalize:
        lut = _device_lut(cfg, first.device)  # (3, 256) float32
        channel = torch.arange(3, device=first.device).view(1, 1, 1, 3, 1, 1)
        patches, table = lut[channel, grid.long()], None  # gather: (N, gh, gw, 3, p, p) float32
    else:
        patches, table = grid, _cpu_lut(cfg)
    each = patches.reshape(n * gh * gw, 3, p, p).split(gh * gw)  # one copy, into the layout `pad_patchify` gives
    return [PreprocessedImage(image, (gh, gw), tokens, image_size=size, lut=table) for image in each]
