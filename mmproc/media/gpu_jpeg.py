"""Which JPEGs are decoded on the GPU, decided on the CPU before any of their bytes reach it.

`gpu_jpeg` runs every check `decode_image` runs before the raster (same refusals, same reasons), then keeps the
JPEGs that nvJPEG decodes as libjpeg does (docs/media.md, "JPEG on the GPU"): 8-bit baseline or progressive
Huffman, grey or YCbCr in 4:4:4, 4:2:2 or 4:2:0, plain segments only, ending in EOI. Everything else (CMYK,
RGB-coded, 12-bit, arithmetic coding, other subsamplings, unknown markers, no EOI) returns None: the CPU path
decodes it or refuses it (nvJPEG decodes a truncated or garbled file that libjpeg refuses).
`orient` applies EXIF orientation to the decoded pixels, as `apply_orientation` does to a Pillow image.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mmproc.media.decode import read_header
from mmproc.media.formats import JPEG, jpeg_segments, looks_truncated, sniff_format
from mmproc.media.limits import MediaLimits
from mmproc.media.orientation import read_orientation

_SOF_BASELINE, _SOF_PROGRESSIVE, _SOS, _APP14 = 0xC0, 0xC2, 0xDA, 0xEE
# The segments a plain baseline or progressive file has (JPEG_SOS's data is skipped by `jpeg_segments`); any other
# marker (DNL, DAC, JPGn, TEM, a stray SOI or RST, a reserved code: libjpeg stops at those) sends the file to the
# CPU path, whose decoder gives the verdict: nvJPEG decodes through some that libjpeg refuses.
_PLAIN_MARKERS = frozenset({_SOF_BASELINE, _SOF_PROGRESSIVE, 0xC4, 0xDB, 0xDD, _SOS, 0xFE, *range(0xE0, 0xF0)})
_LUMA_SAMPLING = frozenset({(1, 1), (2, 1), (2, 2)})  # (h, v) of Y with chroma at (1, 1): 4:4:4, 4:2:2, 4:2:0
_RGB_IDS = (ord("R"), ord("G"), ord("B"))  # libjpeg reads such a file as RGB, not YCbCr


@dataclass(frozen=True)
class GpuJpeg:
    """A JPEG for the GPU decoder: its (width, height) as stored and the EXIF orientation to apply (1..8)."""

    size: tuple[int, int]
    orientation: int


def gpu_jpeg(data: bytes, limits: MediaLimits) -> GpuJpeg | None:
    """The facts the GPU path needs, None for an image the CPU path must take; InvalidMediaError exactly where
    `decode_image` would refuse before decoding."""
    if sniff_format(data) != JPEG:
        return None
    fmt, image = read_header(data, limits)
    data = bytes(data)  # bytearray / memoryview (after the size check): the segment walk slices bytes
    with image:
        orientation = read_orientation(image) if limits.apply_exif_orientation else 1
        size = image.size
    if looks_truncated(fmt, data) or not _plain(data):  # also what Pillow's mode would say: CMYK, Adobe RGB
        return None
    return GpuJpeg(size, orientation)


def _plain(data: bytes) -> bool:
    """One baseline or progressive frame, at least one scan after it, only the segments of `_PLAIN_MARKERS`."""
    frame, scans = None, 0
    for marker, offset, length in jpeg_segments(data):
        if marker not in _PLAIN_MARKERS:
            return False
        if marker == _APP14 and data[offset : offset + 5] == b"Adobe" and length >= 12 and data[offset + 11] == 0:
            return False  # an Adobe RGB-coded file (transform 0; Pillow keeps only the last APP14's)
        if marker in (_SOF_BASELINE, _SOF_PROGRESSIVE):
            if frame is not None:
                return False
            frame = data[offset : offset + length]
        scans += marker == _SOS
        if marker == _SOS and frame is None:
            return False
    return frame is not None and scans > 0 and _frame_fits(frame)


def _frame_fits(header: bytes) -> bool:
    """8-bit, grey or 3 components coded YCbCr, in a sampling checked on the GPU path."""
    if len(header) < 6 or header[0] != 8 or header[5] not in (1, 3) or len(header) < 6 + 3 * header[5]:
        return False
    components = [header[6 + 3 * i : 9 + 3 * i] for i in range(header[5])]
    if len(components) == 1:
        return True
    if tuple(c[0] for c in components) == _RGB_IDS:
        return False
    luma = (components[0][1] >> 4, components[0][1] & 15)
    return luma in _LUMA_SAMPLING and all(c[1] == 0x11 for c in components[1:])


def orient(pixels: Tensor, orientation: int) -> Tensor:
    """(H, W, C) pixels shown upright for EXIF `orientation` (1..8): the transposes of `apply_orientation`."""
    if orientation == 2:
        return pixels.flip(1)
    if orientation == 3:
        return pixels.flip((0, 1))
    if orientation == 4:
        return pixels.flip(0)
    if orientation == 5:
        return pixels.transpose(0, 1)
    if orientation == 6:
        return torch.rot90(pixels, -1, (0, 1))
    if orientation == 7:
        return pixels.flip((0, 1)).transpose(0, 1)
    if orientation == 8:
        return torch.rot90(pixels, 1, (0, 1))
    return pixels
