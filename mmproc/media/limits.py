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
    """Per-image limits, checked cheapest first (see `decode_image`).

    max_image_bytes: encoded size of one image; default 32 MiB.
    max_pixels: width * height as declared by the header; default 40_000_000 (a 40 MP photo, 120 MB as
        RGB). Must be in 1..89_000_000, below Pillow's decompression-bomb threshold; cannot be disabled.
    min_side: shortest side in pixels; default 1 (zero-sized images are always refused).
    max_aspect_ratio: long side / short side; default 200.0 (Qwen2-VL's `smart_resize` refuses
        the same); extreme strips waste patches on padding.
    allowed_formats: formats by magic bytes, a subset of {"jpeg", "png", "webp", "gif", "bmp"}; default all.
        Given as any iterable of names (case-insensitive); stored as a frozenset.

    Work multipliers, counted from the bytes before decoding (`cost.check_cost`, docs/reliability.md):
    max_jpeg_scans: SOS segments of one JPEG; default 100 (libjpeg writes 10 for a progressive colour image;
        each scan is a pass over every coefficient block, so a scan bomb costs scans x pixels).
    max_chunks: marker segments of a JPEG, chunks of a PNG, extension blocks and sub-blocks before a GIF's
        first image; default 65_536 (real files have tens to a few thousand; Pillow parses each in Python).
    max_rle_ratio: declared pixels per byte of a BMP's RLE4/RLE8 data; default 256 (a run codes at most 255
        pixels in 2 bytes); past it the rows are mostly end-of-line padding, which Pillow fills pixel by pixel.

    apply_exif_orientation: turn JPEG/PNG/WebP images upright from their EXIF orientation; default True (what
        the Kimi-VL and K2.5 processors see after `exif_transpose`; SGLang's K3 path leaves them as stored).
    """

    max_image_bytes: int = 32 * MiB
    max_pixels: int = 40_000_000
    min_side: int = 1
    max_aspect_ratio: float = 200.0
    allowed_formats: frozenset[str] = SUPPORTED_FORMATS
    max_jpeg_scans: int = 100
    max_chunks: int = 65_536
    max_rle_ratio: int = 256
    apply_exif_orientation: bool = True

    def __post_init__(self) -> None:
        for name in ("max_jpeg_scans", "max_chunks", "max_rle_ratio"):
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
