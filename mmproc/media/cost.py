"""Work a file asks for beyond its pixel count, counted from its bytes before any decoder runs.

Multipliers no encoder writes but a hostile file repeats for free: JPEG scans (one pass over all coefficients
each; libjpeg-turbo's scan limit) and segments, PNG chunks and GIF blocks (a Python round trip each in Pillow),
BMP RLE declaring more pixels than its runs code. Each walk stops one past its limit and searches in C.
"""

from __future__ import annotations

from mmproc.errors import InvalidMediaError, Reason
from mmproc.media.formats import BMP, GIF, JPEG, JPEG_SOS, PNG, jpeg_segments, peek_size
from mmproc.media.limits import MediaLimits

_BMP_RLE = {1: "RLE8", 2: "RLE4"}  # BITMAPINFOHEADER compression values


def check_cost(fmt: str, data: bytes, limits: MediaLimits) -> None:
    """TOO_MANY_SCANS, TOO_MANY_CHUNKS or COMPRESSION_RATIO when `data` asks for more work than `limits` allow."""
    if fmt == JPEG:
        _check_jpeg(data, limits)
    elif fmt == PNG:
        _check_chunks("PNG chunks", _png_chunks(data, limits.max_chunks + 1), limits)
    elif fmt == GIF:
        _check_chunks("GIF blocks before the first image", _gif_blocks(data, limits.max_chunks + 1), limits)
    elif fmt == BMP:
        _check_bmp_rle(data, limits)


def _check_jpeg(data: bytes, limits: MediaLimits) -> None:
    segments = scans = 0
    for marker, _, _ in jpeg_segments(data):
        segments += 1
        if marker == JPEG_SOS:
            scans += 1
            if scans > limits.max_jpeg_scans:
                raise InvalidMediaError(
                    f"JPEG has more than {limits.max_jpeg_scans} scans (limit max_jpeg_scans)",
                    reason=Reason.TOO_MANY_SCANS,
                )
        if segments > limits.max_chunks:
            break
    _check_chunks("JPEG marker segments", segments, limits)


def _check_chunks(what: str, count: int, limits: MediaLimits) -> None:
    if count > limits.max_chunks:
        raise InvalidMediaError(
            f"{what}: more than {limits.max_chunks} (limit max_chunks)", reason=Reason.TOO_MANY_CHUNKS
        )


def _png_chunks(data: bytes, stop_at: int) -> int:
    """Chunks up to IEND (PNG spec, section 5.3: length u32be, type, data, CRC), at most `stop_at`."""
    pos, count = 8, 0
    while pos + 8 <= len(data) and count < stop_at:
        count += 1
        if data[pos + 4 : pos + 8] == b"IEND":
            break
        pos += 12 + int.from_bytes(data[pos : pos + 4], "big")
    return count


def _gif_blocks(data: bytes, stop_at: int) -> int:
    """Extension blocks plus their sub-blocks before the first image descriptor (GIF89a spec, sections 23-26),
    at most `stop_at`: what Pillow reads in Python before it decodes frame 0."""
    if len(data) < 13:
        return 0
    flags = data[10]
    pos = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)  # skip the global colour table
    count = 0
    while pos < len(data) and data[pos] == 0x21 and count < stop_at:
        pos += 2
        count += 1
        while pos < len(data) and data[pos] != 0 and count < stop_at:
            pos += data[pos] + 1
            count += 1
        pos += 1
    return count


def _check_bmp_rle(data: bytes, limits: MediaLimits) -> None:
    if len(data) < 34 or int.from_bytes(data[14:18], "little") < 40:  # no compression field before BITMAPINFOHEADER
        return
    kind = _BMP_RLE.get(int.from_bytes(data[30:34], "little"))
    size = peek_size(BMP, data)
    if kind is None or size is None:
        return
    pixels = size[0] * size[1]
    coded = max(1, len(data) - int.from_bytes(data[10:14], "little"))  # bytes from the pixel-data offset on
    if pixels > limits.max_rle_ratio * coded:
        raise InvalidMediaError(
            f"{kind} BMP declares {pixels} pixels for {coded} bytes of runs, over {limits.max_rle_ratio} per byte "
            "(limit max_rle_ratio)",
            reason=Reason.COMPRESSION_RATIO,
        )
