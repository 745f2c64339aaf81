"""The image rules on torch tensors, on whatever device the pixels are (a GPU when JPEGs are decoded there): the
same resize plan, Pillow's BICUBIC bit for bit (resize.py), black padding, the family's normalization table and
the patch layout, so an opaque image gives the same patches as `preprocess_image` on the CPU.

Opaque images only: an image with alpha keeps the CPU path (Pillow premultiplies before resizing; K3 composites).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from mmproc.errors import InvalidMediaError, Reason
from mmproc.preprocess.config import PreprocessConfig
from mmproc.preprocess.resize import pillow_bicubic
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
    if rgb.dtype != torch.uint8 or rgb.dim() != 3 or rgb.shape[2] != 3:
        raise ValueError(f"want an (H, W, 3) uint8 image, got {rgb.dtype} {tuple(rgb.shape)}")
    height, width = rgb.shape[0], rgb.shape[1]
    if width < 1 or height < 1:
        raise InvalidMediaError(f"image is {width}x{height}", reason=Reason.TOO_SMALL)
    rule = RULES[cfg.family]
    plan = rule.plan(width, height, cfg)
    if plan.resize_to is not None and plan.resize_to != (width, height):
        rgb = pillow_bicubic(rgb, plan.resize_to)
    pad_w, pad_h = plan.pad_wh
    p = cfg.patch_size
    gh, gw = plan.grid_hw
    padded = torch.zeros(gh * p, gw * p, 3, dtype=torch.uint8, device=rgb.device)  # black bytes, as the references
    padded[: rgb.shape[0], : rgb.shape[1]] = rgb
    assert padded.shape[0] == rgb.shape[0] + pad_h and padded.shape[1] == rgb.shape[1] + pad_w, (plan, rgb.shape)
    grid = padded.view(gh, p, gw, p, 3).permute(0, 2, 4, 1, 3)  # (gh, gw, 3, p, p) uint8 view
    kh, kw = cfg.merge_kernel_size
    tokens, size = (gh // kh) * (gw // kw), (width, height)
    if not normalize:
        patches = grid.reshape(gh * gw, 3, p, p)  # one copy, into the layout `pad_patchify` gives
        return PreprocessedImage(patches, (gh, gw), tokens, image_size=size, lut=_cpu_lut(cfg))
    lut = _device_lut(cfg, rgb.device)  # (3, 256) float32
    channel = torch.arange(3, device=rgb.device).view(1, 1, 3, 1, 1)
    patches = lut[channel, grid.long()]  # gather: (gh, gw, 3, p, p) float32
    return PreprocessedImage(patches.reshape(gh * gw, 3, p, p), (gh, gw), tokens, image_size=size)
