"""EXIF orientation: read it defensively, apply it as a pure transpose.

Same effect as `PIL.ImageOps.exif_transpose` (same `getexif()` lookup, which also honours an XMP
`tiff:Orientation`, and the same tag -> transpose table), split in two so that a broken EXIF block can only
ever mean "no rotation": `exif_transpose` also rewrites the EXIF/XMP metadata of its result, and that
re-serialisation can raise on the very blocks we are trying to survive. Our output carries no metadata.
"""

from __future__ import annotations

import logging

from PIL import Image

logger = logging.getLogger(__name__)

ORIENTATION_TAG = 0x0112

# EXIF orientation value -> the transpose that shows the image upright (as in ImageOps.exif_transpose).
# 2 mirror horizontal, 3 rotate 180, 4 mirror vertical, 5 mirror along the main diagonal,
# 6 rotate 90 clockwise (stored = camera turned right), 7 mirror along the anti-diagonal, 8 rotate 90 ccw.
_TRANSPOSE: dict[int, Image.Transpose] = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def read_orientation(image: Image.Image) -> int:
    """The EXIF orientation of a loaded image, 1..8; 1 when absent, out of range or unreadable.

    Pillow's EXIF parser can fail in many ways on hostile data (struct errors, bad offsets, recursion in
    IFD links, odd value types), so any exception means "no orientation" rather than a failed image.
    """
    try:
        value = image.getexif().get(ORIENTATION_TAG, 1)
    except Exception as exc:  # noqa: BLE001 - metadata is best effort; see docstring
        logger.debug("ignoring unreadable EXIF block (%s)", type(exc).__name__)
        return 1
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 8:
        return value
    return 1


def apply_orientation(image: Image.Image, orientation: int) -> Image.Image:
    """`image` shown upright for EXIF `orientation` (1..8); `image` itself for 1 or an unknown value."""
    method = _TRANSPOSE.get(orientation)
    return image if method is None else image.transpose(method)
