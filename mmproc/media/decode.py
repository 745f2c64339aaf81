"""Bytes -> validated, upright RGB image: every check that can refuse an image runs before its raster is decoded.

Cheapest first: size, magic bytes (Pillow then tries that one format only), the header's declared size, work
multipliers (`cost`), Pillow's header, the first frame, EXIF orientation, RGB. The order and each refusal's
reason: docs/media.md. No `warnings.catch_warnings()` (it is not thread-safe): our pixel cap sits below Pillow's
warning threshold, and Pillow's globals are never written. No module state: safe from any thread.
"""

from __future__ import annotations

import io
import logging
import struct
from collections.abc import Iterator
from contextlib import contextmanager

from PIL import Image

from mmproc.errors import InvalidMediaError, Reason
from mmproc.media.convert import to_rgb, to_rgb_keeping_alpha
from mmproc.media.cost import check_cost
from mmproc.media.formats import (
    JPEG,
    PILLOW_FORMAT,
    PNG,
    WEBP,
    looks_truncated,
    peek_size,
    sniff_format,
)
from mmproc.media.limits import MediaLimits
from mmproc.media.orientation import apply_orientation, read_orientation
from mmproc.types import DecodedImage

logger = logging.getLogger(__name__)

_EXIF_FORMATS = frozenset({JPEG, PNG, WEBP})
_BOMB_ERRORS = (Image.DecompressionBombError, Image.DecompressionBombWarning)


def decode_image(data: bytes, limits: MediaLimits, *, keep_alpha: bool = False) -> DecodedImage:
    """Validate and decode one image; the order of checks: docs/media.md.

    Returns a `DecodedImage` whose `image` is a fully loaded mode-"RGB" image (or "RGBA" for a transparent
    image when `keep_alpha`: see `convert.to_rgb_keeping_alpha`), upright, without metadata,
    holding no reference to `data`; `source_size` is (width, height) as stored, before EXIF orientation.
    Raises `InvalidMediaError` (index -1) for anything that is the client's fault; a `MemoryError` is left
    alone (the limits bound allocations, so running out is the server's problem, not a bad request).
    """
    fmt, data = _check_before_open(data, limits)
    image = _open(fmt, data, limits)
    with image:
        source_size = image.size
        with _decoder_errors(fmt, data, "decode"):
            image.seek(0)  # first frame only; a no-op for a freshly opened file, stated for the reader
            image.load()
        use_exif = limits.apply_exif_orientation and fmt in _EXIF_FORMATS
        orientation = read_orientation(image) if use_exif else 1
        with _decoder_errors(fmt, data, "convert"):
            rgb = to_rgb_keeping_alpha(image) if keep_alpha else to_rgb(image)
    upright = apply_orientation(rgb, orientation)
    upright.info = {}  # stale EXIF (orientation!), ICC, transparency: none of it describes the output
    return DecodedImage(image=upright, source_format=fmt, source_size=source_size)


def read_header(data: bytes, limits: MediaLimits) -> tuple[str, Image.Image]:
    """Every check `decode_image` makes before the raster, with the same refusals; returns the format and the
    image as Pillow opened it (header parsed, no pixel decoded; the caller closes it)."""
    fmt, data = _check_before_open(data, limits)
    return fmt, _open(fmt, data, limits)


def _check_before_open(data: bytes, limits: MediaLimits) -> tuple[str, bytes]:
    """Container, header size and work multipliers; returns the format and the data as bytes."""
    fmt = _check_container(data, limits)
    if not isinstance(data, bytes):  # bytearray / memoryview: one copy, after the size check
        data = bytes(data)
    peeked = peek_size(fmt, data)
    if peeked is not None:
        _check_size(*peeked, limits, _pixel_limit(limits))
    check_cost(fmt, data, limits)
    return fmt, data


def _open(fmt: str, data: bytes, limits: MediaLimits) -> Image.Image:
    """Pillow's header parse of `data` (no raster decoded), its size checked again."""
    with _decoder_errors(fmt, data, "open"):
        image = Image.open(io.BytesIO(data), formats=[PILLOW_FORMAT[fmt]])
    try:
        _check_size(*image.size, limits, _pixel_limit(limits))
    except InvalidMediaError:
        image.close()
        raise
    return image


def _check_container(data: bytes, limits: MediaLimits) -> str:
    """EMPTY, TOO_LARGE, UNSUPPORTED_FORMAT; returns the sniffed format."""
    size = len(data)
    if size == 0:
        raise InvalidMediaError("image data is empty", reason=Reason.EMPTY)
    if size > limits.max_image_bytes:
        raise InvalidMediaError(
            f"image is {size} bytes, over the limit of {limits.max_image_bytes}", reason=Reason.TOO_LARGE
        )
    fmt = sniff_format(data)
    if fmt is None or fmt not in limits.allowed_formats:
        allowed = ", ".join(sorted(limits.allowed_formats))
        what = "not a recognised image format" if fmt is None else f"format {fmt} is not allowed"
        raise InvalidMediaError(f"{what}; allowed: {allowed}", reason=Reason.UNSUPPORTED_FORMAT)
    return fmt


def _pixel_limit(limits: MediaLimits) -> int:
    """Our limit, or Pillow's warning threshold when an operator lowered it: never accept what Pillow flags."""
    pillow_limit = Image.MAX_IMAGE_PIXELS
    return limits.max_pixels if pillow_limit is None else min(limits.max_pixels, int(pillow_limit))


def _check_pixels(width: int, height: int, pixel_limit: int) -> None:
    if width * height > pixel_limit:
        raise InvalidMediaError(
            f"image is {width}x{height} = {width * height} pixels, over the limit of {pixel_limit}",
            reason=Reason.TOO_MANY_PIXELS,
        )


def _check_size(width: int, height: int, limits: MediaLimits, pixel_limit: int) -> None:
    """TOO_SMALL, TOO_MANY_PIXELS, ASPECT_RATIO from the header's size, in that order."""
    if min(width, height) < limits.min_side:
        raise InvalidMediaError(
            f"image is {width}x{height}, a side is under the minimum of {limits.min_side} pixels",
            reason=Reason.TOO_SMALL,
        )
    _check_pixels(width, height, pixel_limit)
    ratio = max(width, height) / min(width, height)
    if ratio > limits.max_aspect_ratio:
        raise InvalidMediaError(
            f"image is {width}x{height}, aspect ratio {ratio:.1f} over the limit of {limits.max_aspect_ratio:g}",
            reason=Reason.ASPECT_RATIO,
        )


@contextmanager
def _decoder_errors(fmt: str, data: bytes, stage: str) -> Iterator[None]:
    """Map whatever Pillow raises on hostile data to a typed client error.

    Pillow's parsers raise a zoo of exception types on bad input (OSError, SyntaxError, ValueError,
    struct.error, IndexError, KeyError, ZeroDivisionError ...), so anything but MemoryError is the data's
    fault. Unexpected types are logged at WARNING so that they can be looked at; the client only ever sees
    a short fixed message, never Pillow's text (which may quote raw bytes).
    """
    try:
        yield
    except (InvalidMediaError, MemoryError):
        raise
    except _BOMB_ERRORS as exc:
        raise InvalidMediaError(
            "image declares more pixels than allowed (decompression-bomb guard)", reason=Reason.TOO_MANY_PIXELS
        ) from exc
    except Exception as exc:
        known = isinstance(exc, OSError | ValueError | SyntaxError | EOFError | struct.error | LookupError)
        level = logging.DEBUG if known else logging.WARNING
        logger.log(level, "%s %s failed: %s: %.200s", fmt, stage, type(exc).__name__, exc)
        name = fmt.upper()
        if _says_truncated(exc) or looks_truncated(fmt, data):
            raise InvalidMediaError(f"{name} data ends before the image does", reason=Reason.TRUNCATED) from exc
        raise InvalidMediaError(f"{name} data could not be decoded", reason=Reason.UNDECODABLE) from exc


def _says_truncated(exc: BaseException) -> bool:
    return isinstance(exc, EOFError | struct.error) or "truncated" in str(exc).lower()
