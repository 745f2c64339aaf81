"""Kimi K3 image rules: the K2.5 NaViT resize arithmetic and normalization, but transparent images keep their
alpha through the BICUBIC resize and are composited AFTER it onto the background that preprocessor_config.json
describes (`transparent_bg_config`, `transparent_bg_fill_stage: "after_resize"`), e.g. a chessboard anchored at
the resized image's top-left corner.

Compositing (SGLang 0.5.23 `kimi_k3_image_processing.fill_transparent_bg`), in float32 per pixel:
    a = A / 255;  out = floor(clamp(a * rgb + (1 - a) * background, 0, 255))
Then zero padding right/bottom, normalization and patches as K2.5 (mmproc/preprocess/kimi_k25.py).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from mmproc.preprocess.config import PreprocessConfig, TransparentBackground
from mmproc.preprocess.kimi_k25 import kimi_k25_lut, plan_kimi_k25
from mmproc.preprocess.patchify import finish
from mmproc.types import PreprocessedImage

plan_kimi_k3 = plan_kimi_k25  # the same navit_resize_config


def background(bg: TransparentBackground, height: int, width: int) -> np.ndarray:
    """(height, width) float32 grey levels of the background (the same value in R, G and B)."""
    if bg.pattern == "chessboard":
        ys = np.arange(height)[:, None] // bg.square_size
        xs = np.arange(width)[None, :] // bg.square_size
        gray_parity = 1 if bg.square_on_top_left else 0
        return np.where((ys + xs) % 2 == gray_parity, np.float32(bg.gray_value), np.float32(bg.white_value))
    return np.full((height, width), np.float32(bg.fill_value), dtype=np.float32)


def composite(rgba: np.ndarray, bg: TransparentBackground) -> np.ndarray:
    """(h, w, 4) uint8 -> (h, w, 3) uint8, the alpha blend above."""
    alpha = rgba[..., 3:4].astype(np.float32) / np.float32(255.0)
    back = background(bg, rgba.shape[0], rgba.shape[1])[..., None]
    blended = alpha * rgba[..., :3].astype(np.float32) + (np.float32(1.0) - alpha) * back
    return np.floor(np.clip(blended, 0.0, 255.0)).astype(np.uint8)


def preprocess_kimi_k3(image: Image.Image, cfg: PreprocessConfig, normalize: bool = True) -> PreprocessedImage:
    """One decoded image (mode RGB, or RGBA when it has transparency) -> (L, 3, p, p) float32 patches (uint8
    bytes and their table with normalize=False)."""
    has_alpha = image.mode == "RGBA"
    if image.mode not in ("RGB", "RGBA"):
        image = image.convert("RGB")
    plan = plan_kimi_k3(image.width, image.height, cfg)
    if plan.resize_to is not None:
        image = image.resize(plan.resize_to, Image.Resampling.BICUBIC)  # RGBA: Pillow premultiplies alpha
    pixels = np.asarray(image)  # (h, w, 3 or 4) uint8
    if has_alpha:
        # Without a configured background the reference keeps the colour channels as they are.
        pixels = composite(pixels, cfg.transparent_bg) if cfg.transparent_bg is not None else pixels[..., :3]
    rgb = np.ascontiguousarray(pixels)
    return finish(rgb, plan, kimi_k25_lut(cfg), cfg.patch_size, cfg.merge_kernel_size, normalize)
