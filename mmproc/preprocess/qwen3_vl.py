"""Qwen3-VL image rules (Qwen3-VL, Qwen3.5, Qwen3.6): transformers 5.23's `Qwen2VLImageProcessor` with its default
backend (torchvision's), the one the engines use, reproduced:

- transparency composited onto white (transformers' `convert_to_rgb`), then RGB;
- `smart_resize`: each side rounded to a multiple of patch * merge with Python's round (ties to even), then scaled
  into [min_pixels, max_pixels] keeping the aspect ratio; an aspect ratio over 200 is refused;
- BICUBIC with antialias on the uint8 (3, H, W) tensor (torch's `interpolate`, as `tvF.resize` calls it on a CPU),
  skipped when the size is unchanged;
- (x - 255 * mean) / (255 * std) in float32 (the backend folds the 1/255 into mean and std);
- (h/p * w/p) patches; the reference's 2x2-window order and doubled frame are the tower's business
  (mmproc/models/qwen3_vl_tower.py), so the patches here are row-major, one frame.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from mmproc.errors import InvalidMediaError, Reason
from mmproc.preprocess.config import PreprocessConfig
from mmproc.preprocess.patchify import ResizePlan, finish
from mmproc.preprocess.qwen3_vl_config import MAX_ASPECT_RATIO
from mmproc.types import PreprocessedImage


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) of the resized image, multiples of `factor` (Qwen2-VL `smart_resize`, same expressions)."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise InvalidMediaError(
            f"image is {width}x{height}: aspect ratio over {MAX_ASPECT_RATIO}", reason=Reason.ASPECT_RATIO
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def plan_qwen3_vl(width: int, height: int, cfg: PreprocessConfig) -> ResizePlan:
    assert cfg.min_pixels is not None and cfg.max_pixels is not None
    p = cfg.patch_size
    h, w = smart_resize(height, width, p * cfg.merge_kernel_size[0], cfg.min_pixels, cfg.max_pixels)
    return ResizePlan(resize_to=None if (w, h) == (width, height) else (w, h), pad_wh=(0, 0), grid_hw=(h // p, w // p))


def qwen3_vl_lut(cfg: PreprocessConfig) -> np.ndarray:
    """(3, 256) float32: byte v of channel c as the torchvision backend normalizes it: `tvF.normalize` of the
    float32 byte with mean and std multiplied by 1 / rescale_factor (float32 tensors)."""
    scale = 1.0 / (1 / 255)
    mean = torch.tensor(cfg.image_mean) * scale  # (3,) float32
    std = torch.tensor(cfg.image_std) * scale
    values = torch.arange(256, dtype=torch.float32)
    return np.ascontiguousarray(((values[None, :] - mean[:, None]) / std[:, None]).numpy())


def to_rgb_on_white(image: Image.Image) -> Image.Image:
    """RGB; an image with alpha is composited onto opaque white first (transformers' `convert_to_rgb`)."""
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def bicubic_antialias(rgb: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(H, W, 3) uint8 on any device -> (h, w, 3) uint8 for size (w, h), as `tvF.resize` does it: on a CPU torch's
    bicubic with antialias on the (1, 3, H, W) uint8 tensor; elsewhere in float32, clamped and rounded."""
    width, height = size
    chw = rgb.permute(2, 0, 1).contiguous()[None]  # (1, 3, H, W) uint8
    if rgb.device.type == "cpu":
        out = F.interpolate(chw, size=(height, width), mode="bicubic", align_corners=False, antialias=True)
    else:
        out = F.interpolate(chw.float(), size=(height, width), mode="bicubic", align_corners=False, antialias=True)
        out = out.clamp_(0, 255).round_().to(torch.uint8)
    return out[0].permute(1, 2, 0).contiguous()


def preprocess_qwen3_vl(image: Image.Image, cfg: PreprocessConfig, normalize: bool = True) -> PreprocessedImage:
    """One decoded image (RGB, or RGBA when it has transparency) -> (L, 3, p, p) float32 patches, row-major (uint8
    bytes and their table with normalize=False)."""
    rgb = to_rgb_on_white(image)
    plan = plan_qwen3_vl(rgb.width, rgb.height, cfg)
    if plan.resize_to is None:
        pixels = np.asarray(rgb)  # (h, w, 3) uint8, read-only view
    else:  # a writable copy for torch, which the resize reads once
        pixels = bicubic_antialias(torch.from_numpy(np.array(rgb)), plan.resize_to).numpy()
    return finish(pixels, plan, qwen3_vl_lut(cfg), cfg.patch_size, cfg.merge_kernel_size, normalize)
