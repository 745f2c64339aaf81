"""Every Pillow mode to 8-bit RGB, deterministically, as the reference processors' `convert("RGB")` does.

Alpha is dropped, not composited; 16-bit greyscale clips at 255 like Pillow; `to_rgb_keeping_alpha` keeps
straight alpha for a family that composites itself (Kimi K3). The rule per mode: docs/media.md. Pure functions.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

_PREMULTIPLIED_TO_STRAIGHT = {"La": "LA", "RGBa": "RGBA"}


def to_rgb(image: Image.Image) -> Image.Image:
    """A new, fully loaded mode-"RGB" image from `image` (any mode), following the module rule.

    Never returns `image` itself, so the result holds no reference to a file or a decoder.
    Raises ValueError for a mode Pillow cannot convert.
    """
    mode = image.mode
    if mode == "RGB":
        return image.copy()
    if mode in ("I", "F"):
        return _grey_to_rgb(_to_uint8_grey(image))
    if mode == "P" and "transparency" in image.info:
        return image.convert("RGBA").convert("RGB")
    if mode in _PREMULTIPLIED_TO_STRAIGHT:
        return image.convert(_PREMULTIPLIED_TO_STRAIGHT[mode]).convert("RGB")
    return image.convert("RGB")


def to_rgb_keeping_alpha(image: Image.Image) -> Image.Image:
    """A new, fully loaded "RGBA" image when `image` has transparency, else `to_rgb(image)`."""
    has_alpha = "A" in image.getbands() or "a" in image.getbands() or "transparency" in image.info
    if not has_alpha:
        return to_rgb(image)
    if image.mode in _PREMULTIPLIED_TO_STRAIGHT:
        image = image.convert(_PREMULTIPLIED_TO_STRAIGHT[image.mode])
    return image.copy() if image.mode == "RGBA" else image.convert("RGBA")


def _to_uint8_grey(image: Image.Image) -> np.ndarray:
    """(H, W) uint8 from a single-channel 32-bit integer or float image, per the module rule."""
    values = np.asarray(image)  # (H, W): int32 or float32
    if image.mode == "F":
        values = np.nan_to_num(values, nan=0.0, posinf=255.0, neginf=0.0)
        return np.clip(values, 0.0, 255.0).astype(np.uint8)  # astype truncates toward zero
    values = np.clip(values, 0, 0xFFFF)
    return (values.astype(np.uint32) >> 8).astype(np.uint8)


def _grey_to_rgb(grey: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(grey)).convert("RGB")  # (H, W) uint8 -> "L" -> "RGB"
