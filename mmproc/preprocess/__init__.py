"""Image preprocessing for MoonViT: resize, pad, normalize and patchify exactly as the released processors.

    cfg = load_preprocess_config(model_dir)           # or PreprocessConfig.kimi_vl() / .kimi_k25()
    out = preprocess_image(rgb_image, cfg)            # PreprocessedImage: (L, 3, p, p) float32, grid, tokens
    grid_h, grid_w = target_grid(width, height, cfg)  # the same grid from the size alone, no pixels

Family rules live in `kimi_vl.py` (KimiVLImageProcessor), `kimi_k25.py` (KimiK25VisionProcessor) and `kimi_k3.py`,
listed in `rules.py`; `patchify.py` holds the pixel work they share, `bounds.py` the per-image patch bound.
"""

from __future__ import annotations

import dataclasses

from PIL import Image

from mmproc.errors import InvalidMediaError, Reason
from mmproc.preprocess.config import PreprocessConfig, load_preprocess_config
from mmproc.preprocess.rules import RULES
from mmproc.types import PreprocessedImage

__all__ = ["RULES", "PreprocessConfig", "load_preprocess_config", "preprocess_image", "target_grid"]


def preprocess_image(image: Image.Image, cfg: PreprocessConfig, *, normalize: bool = True) -> PreprocessedImage:
    """One decoded image -> patches (grid_h * grid_w, 3, p, p) float32 on the CPU, grid and token count.

    normalize=False (for a CUDA encoder): the patches stay uint8 bytes with the family's table in `lut`, and the
    device normalizes them (`mmproc.types.apply_lut`: the same values).

    Raises InvalidMediaError for an image the model cannot take (Kimi-VL: over 511 patches on a side).
    """
    if image.width < 1 or image.height < 1:
        raise InvalidMediaError(f"image is {image.width}x{image.height}", reason=Reason.TOO_SMALL)
    return dataclasses.replace(RULES[cfg.family].run(image, cfg, normalize), image_size=image.size)


def target_grid(width: int, height: int, cfg: PreprocessConfig) -> tuple[int, int]:
    """(grid_h, grid_w) in patches that `preprocess_image` gives a width x height image; no pixels touched.

    Tokens = (grid_h // kh) * (grid_w // kw). Raises InvalidMediaError exactly when `preprocess_image` would.
    """
    if width < 1 or height < 1:
        raise InvalidMediaError(f"image is {width}x{height}", reason=Reason.TOO_SMALL)
    return RULES[cfg.family].plan(width, height, cfg).grid_hw
