"""The pixel work both families share: resize -> RGB uint8 -> normalize + pad -> patches.

Normalization is a per-channel 256-entry lookup table built with each reference's exact arithmetic, so the
result is bit-identical for any mean/std; padding is the entry for byte 0 (the references pad black before
normalizing). For a CUDA encoder the patches stay uint8 (a quarter of the bytes) and the device gathers them
through the same table (`mmproc.types.apply_lut`).
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


def pad_patchify(rgb: np.ndarray, pad_wh: tuple[int, int], patch_size: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """Pad an RGB uint8 image right/bottom with black and cut it into patches, still uint8: (L, 3, p, p)
    C-contiguous (the layout of `normalize_pad_patchify`, one byte copy) and the grid (grid_h, grid_w)."""
    grid = _patch_view(_pad(rgb, pad_wh), patch_size)  # (gh, gw, 3, p, p) uint8 view
    gh, gw = grid.shape[:2]
    return torch.from_numpy(np.ascontiguousarray(grid)).view(gh * gw, 3, patch_size, patch_size), (gh, gw)


def _pad(rgb: np.ndarray, pad_wh: tuple[int, int]) -> np.ndarray:
    pad_w, pad_h = pad_wh
    if not (pad_w or pad_h):
        return rgb
    # Both references pad with black bytes before normalizing, so padding = lut[:, 0] after the gather.
    h, w, _ = rgb.shape
    padded = np.zeros((h + pad_h, w + pad_w, 3), dtype=np.uint8)
    padded[:h, :w] = rgb
    return padded


def _patch_view(rgb: np.ndarray, p: int) -> np.ndarray:
    """(H, W, 3) -> (H/p, W/p, 3, p, p) view, no copy: KimiVLImageProcessor.patchify's order and layout."""
    height, width, _ = rgb.shape
    assert height % p == 0 and width % p == 0, (rgb.shape, p)
    return rgb.reshape(height // p, p, width // p, p, 3).transpose(0, 2, 4, 1, 3)


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
    p = patch_size
    grid = _patch_view(_pad(rgb, pad_wh), p)  # (gh, gw, 3, p, p) uint8 view, no copy
    gh, gw = grid.shape[:2]
    out = np.empty((gh, gw, 3, p, p), dtype=np.float32)
    for c in range(3):
        out[:, :, c] = lut[c][grid[:, :, c]]  # gather (gh, gw, p, p) bytes -> float32
    return torch.from_numpy(out).view(gh * gw, 3, p, p), (gh, gw)


def run_plan(
    image: Image.Image,
    plan: ResizePlan,
    lut: np.ndarray,
    patch_size: int,
    kernel: tuple[int, int],
    normalize: bool = True,
) -> PreprocessedImage:
    """Apply a plan to an image: BICUBIC resize (in the image's own mode), RGB, normalize + pad, patchify.

    Returns patches (grid_h * grid_w, 3, p, p) on the CPU: float32, or with normalize=False the uint8 bytes
    and `lut` (see `finish`).
    """
    if plan.resize_to is not None and plan.resize_to != image.size:
        image = image.resize(plan.resize_to, Image.Resampling.BICUBIC)
    if image.mode != "RGB":
        image = image.convert("RGB")
    return finish(np.asarray(image), plan, lut, patch_size, kernel, normalize)


def finish(
    rgb: np.ndarray,
    plan: ResizePlan,
    lut: np.ndarray,
    patch_size: int,
    kernel: tuple[int, int],
    normalize: bool,
) -> PreprocessedImage:
    """(h, w, 3) uint8 at the planned size -> padded patches: normalized float32, or (normalize=False) the
    uint8 bytes with the family's table for the device to apply."""
    if normalize:
        patches, grid_hw = normalize_pad_patchify(rgb, lut, plan.pad_wh, patch_size)
        table = None
    else:
        patches, grid_hw = pad_patchify(rgb, plan.pad_wh, patch_size)
        table = torch.from_numpy(lut)
    assert grid_hw == plan.grid_hw, (grid_hw, plan)
    kh, kw = kernel
    tokens = (grid_hw[0] // kh) * (grid_hw[1] // kw)
    return PreprocessedImage(patches=patches, grid_hw=grid_hw, num_tokens=tokens, lut=table)
