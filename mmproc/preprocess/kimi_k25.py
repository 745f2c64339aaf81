"""Kimi K2.5 image rules: KimiK25VisionProcessor + media_utils (kimi_k25_vision_processing.py), reproduced exactly.

Reference pipeline for an image: `_to_pil` (convert to RGB), `navit_resize_image` (size arithmetic),
`image_to_np(..., "resize")` (always a BICUBIC resize), `np.pad` with zeros right/bottom in uint8,
`normalize` (numpy: `(x / 255.0).astype(float32)`, `x -= mean`, `x *= 1.0 / std`), `navit_patchify`.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from mmproc.preprocess.config import PreprocessConfig
from mmproc.preprocess.patchify import ResizePlan, run_plan
from mmproc.types import PreprocessedImage


def plan_kimi_k25(width: int, height: int, cfg: PreprocessConfig) -> ResizePlan:
    """media_utils.navit_resize_image for one image (fixed_output_tokens is refused at config time).

    Every image is accepted: the scale keeps both sides under `patch_limit_on_one_side`.
    """
    p = cfg.patch_size
    merge = cfg.merge_kernel_size[0]  # square, checked by the config
    in_patch_limit = cfg.in_patch_limit
    side_limit = cfg.patch_limit_on_one_side
    assert in_patch_limit is not None and side_limit is not None

    # Same expressions, in the same order, as the reference (float results must match bit for bit).
    s1 = math.sqrt(in_patch_limit / (max(1.0, width // p) * max(1.0, height // p)))
    s2 = side_limit * p / width
    s3 = side_limit * p / height
    scale = min(1.0, s1, s2, s3)
    new_w = min(max(1, int(width * scale)), side_limit * p)
    new_h = min(max(1, int(height * scale)), side_limit * p)

    factor = merge * p
    pad_w = (factor - new_w % factor) % factor
    pad_h = (factor - new_h % factor) % factor
    token_h, token_w = (new_h + pad_h) // factor, (new_w + pad_w) // factor
    # The reference asserts these; with side_limit a multiple of the kernel (config check) they always hold.
    assert token_h * merge <= side_limit and token_w * merge <= side_limit, (width, height, token_h, token_w)
    return ResizePlan(
        # The reference always resizes; Pillow returns a plain copy when the size is unchanged, so skip it.
        resize_to=None if (new_w, new_h) == (width, height) else (new_w, new_h),
        pad_wh=(pad_w, pad_h),
        grid_hw=(token_h * merge, token_w * merge),
    )


def kimi_k25_lut(cfg: PreprocessConfig) -> np.ndarray:
    """(3, 256) float32: byte v of channel c normalized with media_utils.normalize's arithmetic.

    The reference divides in float64, casts to float32, then subtracts a float64 mean and multiplies by a
    float64 `1.0 / std` in place (numpy computes in float64 and rounds to float32 each time). The same
    numpy ops on the 256 possible bytes give bit-identical entries.
    """
    x = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)  # (256, 3), channels last as in the reference
    x = (x / 255.0).astype(np.float32)
    x -= np.array(cfg.image_mean)
    x *= 1.0 / np.array(cfg.image_std)
    return np.ascontiguousarray(x.T)


def preprocess_kimi_k25(image: Image.Image, cfg: PreprocessConfig, normalize: bool = True) -> PreprocessedImage:
    """KimiK25VisionProcessor.preprocess for one image. Returns (L, 3, p, p) float32 patches (uint8 bytes and
    their table with normalize=False)."""
    if image.mode != "RGB":
        image = image.convert("RGB")  # media_utils._to_pil converts before anything else
    plan = plan_kimi_k25(image.width, image.height, cfg)
    return run_plan(image, plan, kimi_k25_lut(cfg), cfg.patch_size, cfg.merge_kernel_size, normalize)
