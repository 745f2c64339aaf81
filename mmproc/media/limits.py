"""Limits every image must meet before its raster is decoded.

Built once at the edge (CLI / settings) and passed to `decode_image`; frozen, so one instance is shared by
every worker thread without locks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from mmproc.errors import ConfigError
from mmproc.media.formats import SUPPORTED_FORMATS
from mmproc.units import MiB

# Pillow warns at 89_478_485 pixels (Image.MAX_IMAGE_PIXELS) and refuses at twice that. Our own limit must
# stay below the warning so that our check, not a warning someone may have silenced, is what guards us.
PILLOW_SAFE_MAX_PIXELS = 89_000_000


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class MediaLimits:
    """Per-image limits, checked cheapest first (see `decode_image`); the work multipliers are counted from the
    bytes before decoding (`cost.check_cost`, docs/reliability.md)."""

    max_image_bytes: int = 32 * MiB  # encoded size of one image
    max_pixels: int = 40_000_000  # width * height as declared; at most PILLOW_SAFE_MAX_PIXELS, never disabled
    min_side: int = 1  # zero-sized images are always refused
    max_aspect_ratio: float = 200.0  # as Qwen2-VL's `smart_resize`: extreme strips waste patches on padding
    allowed_formats: frozenset[str] = SUPPORTED_FORMATS  # any iterable of names (case-insensitive)
    max_jpeg_scans: int = 100  # libjpeg writes 10 for progressive colour; each scan passes over every block
    max_jpeg_passes: int = 16  # blocks decoded over all scans / blocks of the frame: libjpeg's progression ~5.3-6
    max_chunks: int = 65_536  # JPEG segments, PNG chunks, GIF blocks before frame 0: Pillow parses each in Python
    max_rle_ratio: int = 256  # declared pixels per byte of BMP RLE data (a run codes at most 255 in 2 bytes)
    apply_exif_orientation: bool = True  # what the Kimi-VL / K2.5 processors see after `exif_transpose`

    def __post_init__(self) -> None:
        for name in ("max_jpeg_scans", "max_jpeg_passes", "max_chunks", "max_rle_ratio"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ConfigError(f"MediaLimits.{name} must be an int >= 1, got {value!r}")
        if not _is_int(self.max_image_bytes) or self.max_image_bytes <= 0:
            raise ConfigError(f"MediaLimits.max_image_bytes must be a positive int, got {self.max_image_bytes!r}")
        if not _is_int(self.max_pixels) or not 0 < self.max_pixels <= PILLOW_SAFE_MAX_PIXELS:
            raise ConfigError(
                f"MediaLimits.max_pixels must be an int in 1..{PILLOW_SAFE_MAX_PIXELS} "
                f"(below Pillow's decompression-bomb threshold), got {self.max_pixels!r}"
            )
        if not _is_int(self.min_side) or self.min_side < 1:
            raise ConfigError(f"MediaLimits.min_side must be an int >= 1, got {self.min_side!r}")
        ratio = self.max_aspect_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not math.isfinite(ratio) or ratio < 1:
            raise ConfigError(f"MediaLimits.max_aspect_ratio must be a finite number >= 1, got {ratio!r}")
        object.__setattr__(self, "max_aspect_ratio", float(ratio))
        object.__setattr__(self, "allowed_formats", _normalize_formats(self.allowed_formats))


def _normalize_formats(value: Iterable[str]) -> frozenset[str]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigError(f"MediaLimits.allowed_formats must be a collection of format names, got {value!r}")
    names = []
    for name in value:
        if not isinstance(name, str):
            raise ConfigError(f"MediaLimits.allowed_formats holds a non-string {name!r}")
        names.append(name.strip().lower())
    formats = frozenset(names)
    unknown = sorted(formats - SUPPORTED_FORMATS)
    if unknown:
        raise ConfigError(
            f"MediaLimits.allowed_formats has unknown formats {unknown}; supported: {sorted(SUPPORTED_FORMATS)}"
        )
    if not formats:
        raise ConfigError("MediaLimits.allowed_formats must not be empty")
    return formats
