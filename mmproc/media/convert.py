"""Every Pillow mode to 8-bit RGB, deterministically.

The rule (faithfulness to how the model was trained beats prettiness):

- RGB: copied as is.
- L, P, 1, CMYK, YCbCr, LAB, HSV, RGBX and any other mode Pillow converts: `convert("RGB")`. CMYK uses
  Pillow's plain formula (no ICC colour management; no embedded ICC profile is applied for any mode,
  like the reference processors).
- P with a "transparency" entry: `convert("RGBA")` first, then alpha is dropped. The colour channels are
  the palette colours either way; going through RGBA is the path Pillow asks for (a direct P -> RGB with a
  per-index transparency table emits "Palette images with Transparency ... should be converted to RGBA").
- Alpha modes (RGBA, LA, PA): alpha is dropped and the colour stored under transparent pixels is kept,
  exactly what the reference Kimi-VL / Kimi K2.5 processors get from `image.convert("RGB")`; no
  compositing onto white or black. Premultiplied modes (RGBa, La) are un-premultiplied by Pillow first.
- 16-bit integer modes (I;16, I;16L, I;16B, I;16N: 16-bit greyscale PNGs): Pillow's own `convert("RGB")`,
  which clips each value at 255 (Pillow 12.3 and 13.0 alike), because that is what the reference Kimi
  processors and transformers get from `image.convert("RGB")` on the image as opened. Most 16-bit photos
  come out nearly white; matching the training-time pixels beats a prettier rule. (16-bit RGB/RGBA/LA PNGs
  never get here: Pillow's PNG decoder already keeps their high bytes.)
- 32-bit integer I (no allowed format opens as I): clipped to 0..65535, then the high byte, as grey.
- F (32-bit float): NaN -> 0, clipped to 0..255, truncated toward zero (as Pillow's F -> L does), as grey.

`to_rgb_keeping_alpha` is the same rule for a model whose processor composites transparent pixels itself
(Kimi K3): an image with an alpha band or a palette "transparency" entry becomes straight-alpha "RGBA"
(as the reference's `convert("RGBA")`), every other one "RGB" as above.

Pure functions, no shared state: safe from any thread.
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
