"""Kimi-VL image rules: KimiVLImageProcessor (image_processing_kimi_vl.py of Kimi-VL-A3B), reproduced exactly.

One deliberate difference: with `pad_input: false` the reference center-crops to the patch size, which can
leave a grid the merger cannot divide; we resize down to a multiple of the kernel instead. Released checkpoints
use `pad_input: true`, where we match exactly.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image

from mmproc.errors import InvalidMediaError, Reason
from mmproc.preprocess.config import KIMI_VL_MAX_GRID_SIDE, PreprocessConfig
from mmproc.preprocess.patchify import ResizePlan, run_plan
from mmproc.types import PreprocessedImage


def plan_kimi_vl(width: int, height: int, cfg: PreprocessConfig) -> ResizePlan:
    """KimiVLImageProcessor.rescale as arithmetic on the size.

    Raises InvalidMediaError when the grid would reach 512 patches on a side (the reference's
    "Exceed pos emb"): only a sliver-shaped image can, since larger ones are shrunk to the token limit.
    """
    p = cfg.patch_size
    kh, kw = cfg.merge_kernel_size
    limit = cfg.in_token_limit
    assert limit is not None and cfg.pad_input is not None
    new_w, new_h = width, height
    coarse = (width // p) * (height // p)
    if coarse > limit:
        scale = math.sqrt(limit / coarse)
        new_w, new_h = int(width * scale), int(height * scale)

    step_w, step_h = kw * p, kh * p
    if cfg.pad_input:
        pad_w = (step_w - new_w % step_w) % step_w
        pad_h = (step_h - new_h % step_h) % step_h
        final_w, final_h = new_w + pad_w, new_h + pad_h
        resize_to = (new_w, new_h)
    else:
        # Our rule (see the module docstring): resize down to whole kernels, at least one.
        pad_w = pad_h = 0
        final_w, final_h = max(step_w, new_w - new_w % step_w), max(step_h, new_h - new_h % step_h)
        resize_to = (final_w, final_h)

    grid_h, grid_w = final_h // p, final_w // p
    if grid_h > KIMI_VL_MAX_GRID_SIDE or grid_w > KIMI_VL_MAX_GRID_SIDE:
        both = grid_h > KIMI_VL_MAX_GRID_SIDE and grid_w > KIMI_VL_MAX_GRID_SIDE
        raise InvalidMediaError(
            f"{width}x{height} image gives a {grid_h}x{grid_w} patch grid; Kimi-VL allows at most "
            f"{KIMI_VL_MAX_GRID_SIDE} patches per side",
            reason=Reason.TOO_MANY_PIXELS if both else Reason.ASPECT_RATIO,
        )
    # A side can only shrink to 0 pixels when the other side is far over the limit, which was refused above.
    assert new_w > 0 and new_h > 0, (width, height, new_w, new_h)
    return ResizePlan(
        resize_to=None if resize_to == (width, height) else resize_to,
        pad_wh=(pad_w, pad_h),
        grid_hw=(grid_h, grid_w),
    )


def kimi_vl_lut(cfg: PreprocessConfig) -> np.ndarray:
    """(3, 256) float32: byte v of channel c normalized with torchvision's arithmetic.

    TF.to_tensor: `img.to(float32).div(255)`; TF.normalize: `tensor.sub_(mean).div_(std)` with float32
    mean/std. Same torch ops on the 256 possible bytes, so each entry is bit-identical to the reference.
    """
    x = torch.arange(256, dtype=torch.uint8).to(torch.float32).div(255)
    x = x.unsqueeze(0).repeat(3, 1)  # (3, 256)
    mean = torch.as_tensor(cfg.image_mean, dtype=torch.float32).view(-1, 1)
    std = torch.as_tensor(cfg.image_std, dtype=torch.float32).view(-1, 1)
    return x.sub_(mean).div_(std).numpy()


def preprocess_kimi_vl(image: Image.Image, cfg: PreprocessConfig, normalize: bool = True) -> PreprocessedImage:
    """KimiVLImageProcessor._preprocess for one image: rescale, to_tensor, normalize, patchify.

    As in the reference the resize runs in the image's own mode and RGB conversion comes after it; the
    padding is black even for a palette image, where the reference would pad with palette entry 0 (media
    delivers RGB, so this only matters for direct callers). Returns (L, 3, p, p) float32 patches (uint8 bytes and
    their table with normalize=False).
    """
    plan = plan_kimi_vl(image.width, image.height, cfg)
    return run_plan(image, plan, kimi_vl_lut(cfg), cfg.patch_size, cfg.merge_kernel_size, normalize)
