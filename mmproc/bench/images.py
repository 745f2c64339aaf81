"""Seeded benchmark images: the same bytes for the same (seed, request index, image index), in every process.

A PCG64 generator per image; smooth value noise plus tint and grain, so encoded sizes look like photos."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from PIL import Image

FORMATS = ("png", "jpeg", "webp")
ORDERS = ("cycle", "random")
# (cell size in pixels, amplitude in 8-bit levels): large blobs, medium texture, fine detail.
OCTAVES = ((128, 70.0), (32, 35.0), (8, 14.0))
CHROMA = 30.0  # amplitude of the per-channel coarse tint (colour varies slower than brightness)
GRAIN = 4.0  # std of per-pixel noise, 8-bit levels (sensor-like grain; keeps PNGs from compressing to nothing)
MAX_SIDE = 16384


@dataclass(frozen=True)
class ImageSpec:
    """What every generated image looks like: sizes (width, height), drawn in `order`, encoded as `fmt`."""

    resolutions: tuple[tuple[int, int], ...] = ((448, 448),)
    order: str = "cycle"  # "cycle": image k of the run gets resolutions[k % n]; "random": drawn with its seed
    fmt: str = "jpeg"
    quality: int = 90  # JPEG / WebP quality (PNG is lossless, compress_level 6)

    def __post_init__(self) -> None:
        if not self.resolutions:
            raise ValueError("at least one resolution is needed")
        for w, h in self.resolutions:
            if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
                raise ValueError(f"resolution {w}x{h} out of range 1..{MAX_SIDE}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.fmt not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {self.fmt!r}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be in 1..100, got {self.quality}")


def parse_resolutions(text: str) -> tuple[tuple[int, int], ...]:
    """'448x448,1024x768' -> ((448, 448), (1024, 768)) as (width, height)."""
    out = []
    for item in text.split(","):
        w, sep, h = item.strip().lower().partition("x")
        if not sep or not w.isdigit() or not h.isdigit():
            raise ValueError(f"bad resolution {item!r}: expected WIDTHxHEIGHT, e.g. 1024x768")
        out.append((int(w), int(h)))
    return tuple(out)


def image_rng(seed: int, request_index: int, image_index: int) -> np.random.Generator:
    """The generator of one image; independent of every other (seed, request, image)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, request_index, image_index])))


def _upsampled(rng: np.random.Generator, width: int, height: int, cell: int) -> np.ndarray:
    """(H, W) float32: standard-normal noise on a grid of `cell`-pixel cells, upsampled bicubically."""
    gw, gh = max(2, -(-width // cell) + 1), max(2, -(-height // cell) + 1)
    coarse = rng.standard_normal((gh, gw), dtype=np.float32)
    return np.asarray(Image.fromarray(coarse, mode="F").resize((width, height), Image.Resampling.BICUBIC))


def smooth_pixels(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """(H, W, 3) uint8 RGB: base colour + shared luminance octaves + coarse per-channel tint + grain, clipped."""
    luma = np.zeros((height, width), dtype=np.float32)
    for cell, amplitude in OCTAVES:
        luma += amplitude * _upsampled(rng, width, height, cell)
    base = rng.uniform(60.0, 196.0, size=3).astype(np.float32)
    out = np.empty((height, width, 3), dtype=np.float32)
    for c in range(3):
        tint = CHROMA * _upsampled(rng, width, height, OCTAVES[0][0])
        out[:, :, c] = base[c] + luma + tint + GRAIN * rng.standard_normal((height, width), dtype=np.float32)
    return np.clip(out, 0.0, 255.0).round().astype(np.uint8)


def encode(pixels: np.ndarray, fmt: str, quality: int) -> bytes:
    """(H, W, 3) uint8 -> file bytes. Fixed encoder settings so equal pixels give equal bytes."""
    buffer = io.BytesIO()
    image = Image.fromarray(pixels, mode="RGB")
    if fmt == "png":
        image.save(buffer, "PNG", compress_level=6)
    elif fmt == "jpeg":
        image.save(buffer, "JPEG", quality=quality, subsampling="4:2:0")
    else:
        image.save(buffer, "WEBP", quality=quality, method=4)
    return buffer.getvalue()


def _resolution(spec: ImageSpec, rng: np.random.Generator, ordinal: int) -> tuple[int, int]:
    if spec.order == "random":
        return spec.resolutions[int(rng.integers(len(spec.resolutions)))]
    return spec.resolutions[ordinal % len(spec.resolutions)]


def request_images(seed: int, request_index: int, count: int, spec: ImageSpec) -> tuple[bytes, ...]:
    """The `count` encoded images of request `request_index`: a pure function of its arguments."""
    images = []
    for j in range(count):
        rng = image_rng(seed, request_index, j)
        width, height = _resolution(spec, rng, request_index * count + j)
        images.append(encode(smooth_pixels(rng, width, height), spec.fmt, spec.quality))
    return tuple(images)


def generate_requests(
    seed: int, indices: Sequence[int], count: int, spec: ImageSpec, *, max_bytes: int, workers: int | None = None
) -> list[tuple[bytes, ...]]:
    """Every request's images, in `indices` order (threads: Pillow and numpy release the GIL).

    Raises ValueError as soon as the payloads pass `max_bytes` in total (pre-generation is bounded)."""
    workers = workers or min(8, os.cpu_count() or 1)
    out: list[tuple[bytes, ...]] = []
    total = 0
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench-images") as pool:
        for images in pool.map(lambda i: request_images(seed, i, count, spec), indices):
            total += sum(len(b) for b in images)
            if total > max_bytes:
                pool.shutdown(wait=False, cancel_futures=True)
                raise ValueError(f"request payloads exceed {max_bytes / 2**20:.0f} MiB; use fewer/smaller requests")
            out.append(images)
    return out
