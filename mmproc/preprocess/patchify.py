"""The pixel work both families share: resize -> RGB uint8 -> normalize + pad -> patches.

Normalization goes through a per-channel 256-entry lookup table. Both reference processors normalize
uint8 pixels elementwise, so every output value is a function of (channel, byte) only; each family builds
its table with exactly the reference's arithmetic (dtype, order of operations, float64 vs float32), which
makes the result bit-identical to the reference for any mean/std while costing one gather per value.
The padding is the table's entry for byte 0: both references pad with black bytes *before* normalizing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from mmproc.types import PreprocessedImage


@dataclass(frozen=True)
class ResizePlan:
    """What one image becomes, decided from its size alone (pure int arithmetic).

    resize_to: (width, height) for one BICUBIC resize, or None to keep the pixels as they are.
    pad_wh: zero pixels added on the right and at the bottom after the resize.
    grid_hw: the padded image in patches, (height // p, width // p).
    """

    resize_to: tuple[int, int] | None
    pad_wh: tuple[int, int]
    grid_hw: tuple[int, int]


def normalize_pad_patchify(
    rgb: np.ndarray, lut: np.ndarray, pad_wh: tuple[int, int], patch_size: int
) -> tuple[torch.Tensor, tuple[int, int]]:
    """Pad an RGB uint8 image right/bottom with black, normalize it and cut it into patches.

    rgb: (h, w, 3) uint8. lut: (3, 256) float32, lut[c, v] = normalized value of byte v in channel c.
    Returns patches (L, 3, p, p) float32, C-contiguous, L = grid_h * grid_w, and the grid (grid_h, grid_w).

    Patch order and layout are those of KimiVLImageProcessor.patchify / media_utils.navit_patchify: the
    (3, H, W) image reshaped to (3, H/p, p, W/p, p), permuted (1, 3, 0, 2, 4), grid axes flattened row-major.
    The permutation is done on the uint8 pixels as a view and the float32 output is written once, in its
    final layout, by the gather: no float32 image is ever materialized in (3, H, W).
    """
    h, w, _ = rgb.shape
    pad_w, pad_h = pad_wh
    if pad_w or pad_h:
        # Both references pad with black bytes before normalizing, so padding = lut[:, 0] after the gather.
        padded = np.zeros((h + pad_h, w + pad_w, 3), dtype=np.uint8)
        padded[:h, :w] = rgb
        rgb = padded
    p = patch_size
    height, width, _ = rgb.shape
    assert height % p == 0 and width % p == 0, (rgb.shape, p)
    gh, gw = height // p, width // p
    grid = rgb.reshape(gh, p, gw, p, 3).transpose(0, 2, 4, 1, 3)  # (gh, gw, 3, p, p) uint8 view, no copy
    out = np.empty((gh, gw, 3, p, p), dtype=np.float32)
    for c in range(3):
        out[:, :, c] = lut[c][grid[:, :, c]]  # gather (gh, gw, p, p) bytes -> float32
    return torch.from_numpy(out).view(gh * gw, 3, p, p), (gh, gw)


def run_plan(
    image: Image.Image, plan: ResizePlan, lut: np.ndarray, patch_size: int, kernel: tuple[int, int]
) -> PreprocessedImage:
    """Apply a plan to an image: BICUBIC resize (in the image's own mode), RGB, normalize + pad, patchify.

    Returns patches (grid_h * grid_w, 3, p, p) float32 on the CPU.
    """
    if plan.resize_to is not None and plan.resize_to != image.size:
        image = image.resize(plan.resize_to, Image.Resampling.BICUBIC)
    if image.mode != "RGB":
        image = image.convert("RGB")
    rgb = np.asarray(image)  # (h, w, 3) uint8
    patches, grid_hw = normalize_pad_patchify(rgb, lut, plan.pad_wh, patch_size)
    assert grid_hw == plan.grid_hw, (grid_hw, plan)
    kh, kw = kernel
    return PreprocessedImage(patches=patches, grid_hw=grid_hw, num_tokens=(grid_hw[0] // kh) * (grid_hw[1] // kw))
