"""Image formats known by their magic bytes, and canvas sizes peeked from headers without Pillow.

We sniff ourselves so Pillow is only ever asked for one of our five formats (several of its ~40 have a long
history of parser bugs), and peek sizes ourselves because `Image.open` is not always header-only (animated WebP
and GIF allocate canvases). Each peek reads a few fixed fields; JPEG's walks segments to the first SOF.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import MappingProxyType
from typing import Final

JPEG: Final = "jpeg"
PNG: Final = "png"
WEBP: Final = "webp"
GIF: Final = "gif"
BMP: Final = "bmp"

SUPPORTED_FORMATS: Final[frozenset[str]] = frozenset({JPEG, PNG, WEBP, GIF, BMP})

# Our lower-case names -> the names Pillow registers its openers under.
PILLOW_FORMAT: Final = MappingProxyType({JPEG: "JPEG", PNG: "PNG", WEBP: "WEBP", GIF: "GIF", BMP: "BMP"})

_PNG_MAGIC: Final = b"\x89PNG\r\n\x1a\n"


def sniff_format(data: bytes) -> str | None:
    """The format named by `data`'s magic bytes: "jpeg" | "png" | "webp" | "gif" | "bmp", or None.

    Only the first 12 bytes are looked at; whether the rest is a valid image is the decoder's business.
    """
    head = bytes(data[:12])
    if head.startswith(b"\xff\xd8\xff"):
        return JPEG
    if head.startswith(_PNG_MAGIC):
        return PNG
    if head.startswith((b"GIF87a", b"GIF89a")):
        return GIF
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return WEBP
    if head.startswith(b"BM"):
        return BMP
    return None


def peek_size(fmt: str, data: bytes) -> tuple[int, int] | None:
    """The (width, height) the header declares, read without Pillow; None when it cannot be found.

    For GIF it is the canvas Pillow allocates for frame 0 (logical screen grown to cover the first frame).
    A None is not an error: Pillow still opens the data, and its own size is checked as well. The peek only
    ever adds refusals, so a parser gap here can never let an image through.
    """
    peek = _PEEKERS.get(fmt)
    return None if peek is None else peek(data)


def _u16le(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 2], "little")


def _u16be(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 2], "big")


def _png_size(data: bytes) -> tuple[int, int] | None:
    # IHDR must be the first chunk (PNG spec, section 5.6): width and height as u32 big-endian.
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _bmp_size(data: bytes) -> tuple[int, int] | None:
    # BITMAPCOREHEADER (12 bytes) stores u16 sizes; every later DIB header i32, a negative height meaning
    # rows stored top-down. A negative width is invalid; Pillow gets to refuse it.
    if len(data) < 26:
        return None
    header_size = int.from_bytes(data[14:18], "little")
    if header_size == 12:
        return _u16le(data, 18), _u16le(data, 20)
    width = int.from_bytes(data[18:22], "little", signed=True)
    height = int.from_bytes(data[22:26], "little", signed=True)
    return (width, abs(height)) if width >= 0 else None


# Start-of-frame markers carrying the size: C0-CF except DHT (C4), JPG (C8) and DAC (CC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
JPEG_SOF = _JPEG_SOF
JPEG_SOS = 0xDA
_JPEG_MAX_HEADER_MARKERS = 4096  # a real header has a few dozen segments; past this the size is "unknown"
# A marker outside entropy-coded data: FF then a code that is neither 00 nor FF (fill bytes FF FF ... match at
# the last FF). Bytes that are not part of one (junk between segments) are skipped, as libjpeg ("extraneous
# bytes before marker", a warning) and Pillow's header parser do.
_JPEG_MARKER = re.compile(rb"\xff([^\x00\xff])")
# The end of entropy-coded data: a marker that is not stuffing (FF 00) or a restart marker (FF D0-D7).
_JPEG_ECS_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def jpeg_segments(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(marker, payload offset, payload length) of each JPEG marker after SOI, up to EOI or the end of `data`.

    Segment lengths are followed (ITU T.81, B.1.1); after an SOS segment its entropy-coded data is skipped,
    stuffed bytes and RST markers included. Markers without a length (TEM, RSTn) come with length 0. Every
    search runs in C (`re`), so a hostile file of junk or fill bytes costs one pass, not a Python loop per byte.
    """
    pos, end = 2, len(data)
    while True:
        if pos + 1 < end and data[pos] == 0xFF and data[pos + 1] not in (0x00, 0xFF):  # the usual: no junk
            marker, pos = data[pos + 1], pos + 2
        else:
            found = _JPEG_MARKER.search(data, pos)
            if found is None:
                return
            marker, pos = data[found.end() - 1], found.end()
        if marker == 0xD9:  # EOI
            return
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # TEM, RSTn, a stray SOI: no length
            yield marker, pos, 0
            continue
        if pos + 2 > end:
            return
        length = data[pos] << 8 | data[pos + 1]
        if length < 2:
            return
        yield marker, pos + 2, length - 2
        pos += length
        if marker == JPEG_SOS:
            ecs_end = _JPEG_ECS_END.search(data, pos)
            if ecs_end is None:
                return
            pos = ecs_end.start()


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    # The first SOF's precision, height (u16be), width (u16be) (ITU T.81, B.2.2); None at SOS/EOI before any SOF.
    for count, (marker, offset, length) in enumerate(jpeg_segments(data)):
        if marker == JPEG_SOS or count >= _JPEG_MAX_HEADER_MARKERS:
            return None
        if marker in _JPEG_SOF:
            if min(length, len(data) - offset) < 5:  # the segment, or the data, ends before the size
                return None
            return _u16be(data, offset + 3), _u16be(data, offset + 1)
    return None


def _webp_canvas_size(data: bytes) -> tuple[int, int] | None:
    # Same layout Pillow's WebPImagePlugin._get_size reads (RFC 9649, sections 2.5-2.7): the first chunk
    # after "RIFF<size>WEBP" is VP8 (lossy key frame header), VP8L (14-bit sizes - 1) or VP8X (24-bit sizes - 1).
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        return _u16le(data, 26) & 0x3FFF, _u16le(data, 28) & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


_GIF_MAX_BLOCKS = 100_000  # sub-blocks walked before giving up; bounds the walk over hostile extensions


def _gif_canvas_size(data: bytes) -> tuple[int, int] | None:
    """max(logical screen, first frame's extent): the canvas Pillow allocates for frame 0.

    A GIF is a bomb either way: a huge logical screen, or a small screen with a huge (or far-offset) first
    frame, which Pillow grows the canvas to cover. Walks the blocks up to the first image descriptor
    (GIF89a spec, sections 17-23); gives the logical screen alone when the walk ends early.
    """
    if len(data) < 13:
        return None
    screen_w, screen_h = _u16le(data, 6), _u16le(data, 8)
    flags = data[10]
    pos = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)  # skip the global colour table
    budget = _GIF_MAX_BLOCKS
    while pos < len(data) and budget > 0:
        block = data[pos]
        if block == 0x2C:  # image descriptor: x, y, w, h as u16le
            if pos + 9 > len(data):
                break
            x1, y1 = _u16le(data, pos + 1) + _u16le(data, pos + 5), _u16le(data, pos + 3) + _u16le(data, pos + 7)
            return max(screen_w, x1), max(screen_h, y1)
        if block != 0x21:  # neither an extension nor an image: trailer or garbage, Pillow decides
            break
        pos += 2  # extension introducer + label, then length-prefixed sub-blocks ending with a 0
        while pos < len(data) and data[pos] != 0 and budget > 0:
            pos += data[pos] + 1
            budget -= 1
        pos += 1
        budget -= 1
    return screen_w, screen_h


_PEEKERS = {JPEG: _jpeg_size, PNG: _png_size, WEBP: _webp_canvas_size, GIF: _gif_canvas_size, BMP: _bmp_size}


def looks_truncated(fmt: str, data: bytes) -> bool:
    """Whether `data` visibly ends before the image does, judged from the container, not the raster.

    Only consulted after the decoder has failed, to tell TRUNCATED from UNDECODABLE deterministically when
    Pillow's error does not say: JPEG without its EOI marker, PNG without IEND, GIF without its trailer (or its colour table),
    WebP or BMP shorter than the size their header declares.
    """
    if fmt == JPEG:
        return not data.endswith(b"\xff\xd9")
    if fmt == PNG:
        return b"IEND" not in data[-12:]
    if fmt == GIF:  # a 0x3B inside the global colour table is not the trailer
        colour_table = 3 << ((data[10] & 7) + 1) if len(data) > 10 and data[10] & 0x80 else 0
        return len(data) < 13 + colour_table or not data.endswith(b"\x3b")
    if fmt == WEBP:
        return len(data) < 12 or int.from_bytes(data[4:8], "little") + 8 > len(data)
    if fmt == BMP:
        return len(data) < 14 or int.from_bytes(data[2:6], "little") > len(data)
    return False
