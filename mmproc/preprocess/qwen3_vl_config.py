"""The Qwen3-VL image-processor settings (`Qwen2VLImageProcessor` keys with the Qwen3 checkpoints' values), parsed
into `PreprocessConfig` fields (mmproc/preprocess/config.py), and the limits they imply.

transformers' class defaults are Qwen2-VL's (patch 14, CLIP mean/std, 3,136-1,003,520 pixels); a Qwen3 file
always writes its own, so a file missing one of the keys that size an image is refused (ConfigError naming the
key) rather than served with a Qwen2-VL value. Resizing is always BICUBIC; rescale 1/255 and normalize always on.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from mmproc.errors import ConfigError

# Qwen3-VL-8B-Instruct / Qwen3.6-35B-A3B preprocessor_config.json (the presets' rules).
QWEN3_VL_VALUES: dict[str, Any] = {
    "patch_size": 16,
    "merge_kernel_size": (2, 2),
    "image_mean": (0.5, 0.5, 0.5),
    "image_std": (0.5, 0.5, 0.5),
    "min_pixels": 65_536,
    "max_pixels": 16_777_216,
}
MAX_ASPECT_RATIO = 200  # smart_resize raises above it: the request gets a 400
_RESCALE = 1 / 255
_BICUBIC = 3  # PILImageResampling.BICUBIC


class _Settings(Protocol):
    patch_size: int
    merge_kernel_size: tuple[int, int]
    min_pixels: int | None
    max_pixels: int | None
    in_token_limit: int | None
    in_patch_limit: int | None
    transparent_bg: object


def qwen3_vl_fields(data: dict[str, Any]) -> dict[str, Any]:
    """`PreprocessConfig` keyword fields from a Qwen2VLImageProcessor object (min_pixels / max_pixels override
    `size`, as its __init__ does)."""
    for key in ("patch_size", "merge_size", "image_mean", "image_std"):
        if key not in data:
            raise ConfigError(f"preprocess config: missing '{key}' (Qwen2VLImageProcessor's default is Qwen2-VL's)")
    size = data.get("size") or {}
    if not isinstance(size, dict):
        raise ConfigError(f"preprocess config: size must be an object, got {size!r}")
    min_pixels = data.get("min_pixels", size.get("shortest_edge"))
    max_pixels = data.get("max_pixels", size.get("longest_edge"))
    if min_pixels is None or max_pixels is None:
        raise ConfigError("preprocess config: missing 'size.shortest_edge' / 'size.longest_edge' (or min/max_pixels)")
    for key, want in (("do_resize", True), ("do_rescale", True), ("do_normalize", True), ("resample", _BICUBIC)):
        if data.get(key, want) != want:
            raise ConfigError(f"preprocess config: {key} {data[key]!r} is not supported (want {want!r})")
    factor = data.get("rescale_factor", _RESCALE)
    if not isinstance(factor, int | float) or not math.isclose(factor, _RESCALE, rel_tol=1e-12):
        raise ConfigError(f"preprocess config: rescale_factor {factor!r} is not supported (want 1/255)")
    merge = data["merge_size"]
    return {
        "patch_size": data["patch_size"],
        "merge_kernel_size": (merge, merge),
        "image_mean": data["image_mean"],
        "image_std": data["image_std"],
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
    }


def check_qwen3_vl(cfg: _Settings) -> None:
    for name in ("min_pixels", "max_pixels"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"preprocess config: {name} must be a positive integer, got {value!r}")
    assert cfg.min_pixels is not None and cfg.max_pixels is not None
    if cfg.min_pixels > cfg.max_pixels:
        raise ConfigError(f"preprocess config: min_pixels {cfg.min_pixels} > max_pixels {cfg.max_pixels}")
    kh, kw = cfg.merge_kernel_size
    if kh != kw:
        raise ConfigError(f"preprocess config: merge_size must be one number for Qwen3-VL, got {(kh, kw)}")
    if cfg.in_token_limit is not None or cfg.in_patch_limit is not None or cfg.transparent_bg is not None:
        raise ConfigError("preprocess config: Kimi settings in a Qwen3-VL file")


def qwen3_vl_max_grid_side(cfg: _Settings) -> tuple[int, int]:
    """A bound on either grid side, in patches: an image of aspect <= 200 within the budget (with the rounding of
    smart_resize, a factor per side) is at most sqrt(400 * pixels) pixels long."""
    assert cfg.min_pixels is not None and cfg.max_pixels is not None
    factor = cfg.patch_size * cfg.merge_kernel_size[0]
    longest = math.isqrt(4 * MAX_ASPECT_RATIO * max(cfg.max_pixels, cfg.min_pixels)) + 2 * factor
    side = longest // factor * cfg.merge_kernel_size[0]
    return (side, side)


def qwen3_vl_max_patches(cfg: _Settings) -> int:
    """Upper bound of grid_h * grid_w: smart_resize stays within max_pixels, except where a side is clamped to one
    factor (at most factor * sqrt(200 * max_pixels)) or the min_pixels path rounds both sides up."""
    assert cfg.min_pixels is not None and cfg.max_pixels is not None
    f, lo, hi = cfg.patch_size * cfg.merge_kernel_size[0], cfg.min_pixels, cfg.max_pixels
    clamped = f * (math.isqrt(MAX_ASPECT_RATIO * hi) + 1)
    rounded_up = lo + f * (math.isqrt(MAX_ASPECT_RATIO * lo) + math.isqrt(lo) + 2) + f * f
    return max(hi, clamped, rounded_up) // (cfg.patch_size * cfg.patch_size)
