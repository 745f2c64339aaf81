"""Work a file asks for beyond its pixel count, counted from its bytes before any decoder runs.

Multipliers no encoder writes but a hostile file repeats for free: JPEG scans and the blocks each one passes over
(libjpeg-turbo's scan limit, counted as work), segments, PNG chunks and GIF blocks (a Python round trip each in
Pillow), PNG metadata that Pillow inflates (iCCP, zTXt, iTXt), BMP RLE declaring more pixels than its runs code
or padding rows one pixel at a time. Each walk stops one past its limit; the bounds: docs/reliability.md.
"""

from __future__ import annotations

from mmproc.errors import InvalidMediaError, Reason
from mmproc.media.formats import BMP, GIF, JPEG, JPEG_SOF, JPEG_SOS, PNG, jpeg_segments, peek_size
from mmproc.media.limits import MediaLimits

_BMP_RLE = {1: "RLE8", 2: "RLE4"}  # BITMAPINFOHEADER compression values
# Pillow inflates each iCCP / zTXt / compressed iTXt to at most 1 MiB (ImageFile.SAFEBLOCK, MAX_TEXT_CHUNK) and
# deflate codes at most 1032 bytes per byte: a chunk costs min(1 MiB, 1032 x its bytes) of inflating. In all at
# most Pillow's own MAX_TEXT_MEMORY (64 MiB), which Pillow applies to text but not to iCCP.
_INFLATE_PER_BYTE, _INFLATE_PER_CHUNK, _INFLATE_TOTAL = 1032, 1 << 20, 64 << 20
_PNG_INFLATED = (b"iCCP", b"zTXt", b"iTXt")
# Pixels Pillow's Python RLE decoder pads one at a time after an end-of-line code (~0.1 us each): ~0.5 s.
RLE_PADDING_PIXELS = 4_000_000


def check_cost(fmt: str, data: bytes, limits: MediaLimits) -> None:
    """TOO_MANY_SCANS, TOO_MANY_CHUNKS or COMPRESSION_RATIO when `data` asks for more work than `limits` allow."""
    if fmt == JPEG:
        _check_jpeg(data, limits)
    elif fmt == PNG:
        _check_png(data, limits)
    elif fmt == GIF:
        _check_chunks("GIF blocks before the first image", _gif_blocks(data, limits.max_chunks + 1), limits)
    elif fmt == BMP:
        _check_bmp_rle(data, limits)


def _check_jpeg(data: bytes, limits: MediaLimits) -> None:
    """Scans, segments, and blocks decoded over all scans against `max_jpeg_passes` passes over every block: a
    progressive decoder visits each block of a scan's components once per scan, so 100 interleaved DC scans of a
    4:4:4 frame cost 100 passes however few bytes they take (arithmetic coding: 1.7 KB for 40 MP)."""
    segments = scans = visited = 0
    frame: _Frame | None = None
    for marker, offset, length in jpeg_segments(data):
        segments += 1
        if marker in JPEG_SOF and frame is None:
            frame = _Frame.parse(data[offset : offset + length])
        if marker == JPEG_SOS:
            scans += 1
            if scans > limits.max_jpeg_scans:
                raise InvalidMediaError(
                    f"JPEG has more than {limits.max_jpeg_scans} scans (limit max_jpeg_scans)",
                    reason=Reason.TOO_MANY_SCANS,
                )
            if frame is not None:
                visited += frame.scan_blocks(data[offset : offset + length])
                if visited > limits.max_jpeg_passes * frame.blocks:
                    raise InvalidMediaError(
                        f"JPEG scans pass over its {frame.blocks} blocks more than {limits.max_jpeg_passes} times "
                        "(limit max_jpeg_passes)",
                        reason=Reason.TOO_MANY_SCANS,
                    )
        if segments > limits.max_chunks:
            break
    _check_chunks("JPEG marker segments", segments, limits)


class _Frame:
    """A JPEG frame's block counts (ITU T.81, A.2): per component id its blocks alone (a one-component scan),
    and per MCU (an interleaved scan); `blocks`: one pass over every component."""

    def __init__(self, width: int, height: int, factors: dict[int, tuple[int, int]]) -> None:
        hmax = max(h for h, _ in factors.values())
        vmax = max(v for _, v in factors.values())
        self.mcus = _ceil(width, 8 * hmax) * _ceil(height, 8 * vmax)
        self.per_mcu = {c: h * v for c, (h, v) in factors.items()}
        self.alone = {
            c: _ceil(_ceil(width * h, hmax), 8) * _ceil(_ceil(height * v, vmax), 8) for c, (h, v) in factors.items()
        }
        self.blocks = self.mcus * sum(self.per_mcu.values())

    @staticmethod
    def parse(payload: bytes) -> _Frame | None:
        """From an SOF payload: precision, height, width, Nf, then Nf x (id, H<<4|V, Tq); None if it is short
        or sizeless (the decoder refuses those itself)."""
        if len(payload) < 6:
            return None
        height, width, count = payload[1] << 8 | payload[2], payload[3] << 8 | payload[4], payload[5]
        if width == 0 or height == 0 or count == 0 or len(payload) < 6 + 3 * count:
            return None
        factors = {}
        for i in range(count):
            sampling = payload[7 + 3 * i]
            factors[payload[6 + 3 * i]] = (max(1, sampling >> 4), max(1, sampling & 15))
        return _Frame(width, height, factors)

    def scan_blocks(self, payload: bytes) -> int:
        """Blocks one scan decodes, from its SOS payload: Ns, then Ns x (component id, tables), ..."""
        ids = [payload[1 + 2 * i] for i in range(payload[0]) if 2 + 2 * i <= len(payload)] if payload else []
        known = [c for c in ids if c in self.per_mcu]
        if len(known) == 1:
            return self.alone[known[0]]
        return self.mcus * sum(self.per_mcu[c] for c in known)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _check_chunks(what: str, count: int, limits: MediaLimits) -> None:
    if count > limits.max_chunks:
        raise InvalidMediaError(
            f"{what}: more than {limits.max_chunks} (limit max_chunks)", reason=Reason.TOO_MANY_CHUNKS
        )


def _check_png(data: bytes, limits: MediaLimits) -> None:
    """Chunks up to IEND (PNG spec, section 5.3: length u32be, type, data, CRC), at most max_chunks; one iCCP
    (the spec allows one; Pillow inflates each); and what Pillow would inflate of its metadata."""
    pos, count, profiles, inflated = 8, 0, 0, 0
    while pos + 8 <= len(data) and count <= limits.max_chunks:
        count += 1
        kind, length = data[pos + 4 : pos + 8], int.from_bytes(data[pos : pos + 4], "big")
        if kind == b"IEND":
            break
        if kind in _PNG_INFLATED:
            profiles += kind == b"iCCP"
            inflated += min(_INFLATE_PER_CHUNK, _INFLATE_PER_BYTE * min(length, len(data) - pos - 8))
            if profiles > 1:
                raise InvalidMediaError("PNG has more than one iCCP chunk", reason=Reason.TOO_MANY_CHUNKS)
            if inflated > _INFLATE_TOTAL:
                raise InvalidMediaError(
                    f"PNG metadata would inflate to more than {_INFLATE_TOTAL >> 20} MiB",
                    reason=Reason.COMPRESSION_RATIO,
                )
        pos += 12 + length
    _check_chunks("PNG chunks", count, limits)


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
    start = int.from_bytes(data[10:14], "little")
    coded = max(1, len(data) - start)  # bytes from the pixel-data offset on
    if pixels > limits.max_rle_ratio * coded:
        raise InvalidMediaError(
            f"{kind} BMP declares {pixels} pixels for {coded} bytes of runs, over {limits.max_rle_ratio} per byte "
            "(limit max_rle_ratio)",
            reason=Reason.COMPRESSION_RATIO,
        )
    padded = rle_padding(data, start, size[0], pixels, kind == "RLE4")
    if padded > RLE_PADDING_PIXELS:
        raise InvalidMediaError(
            f"{kind} BMP rows end early: more than {RLE_PADDING_PIXELS} pixels padded by end-of-line codes",
            reason=Reason.COMPRESSION_RATIO,
        )


def rle_padding(data: bytes, pos: int, width: int, pixels: int, rle4: bool) -> int:
    """Pixels that end-of-line codes pad (Pillow's BmpRleDecoder, one by one in Python), walking the records
    as it does, until the image is full, the bitmap ends or the padding passes RLE_PADDING_PIXELS."""
    end, produced, padded, x = len(data) - 1, 0, 0, 0
    while pos < end and produced < pixels and padded <= RLE_PADDING_PIXELS:
        count, code = data[pos], data[pos + 1]
        pos += 2
        if count:  # a run, cut at the row's end
            run = min(count, width - x)
            x, produced = x + run, produced + run
        elif code == 0:  # end of line
            if x:
                padded += width - x
                produced += width - x
            x = 0
        elif code == 1:  # end of bitmap
            break
        elif code == 2:  # delta: right, up (Pillow writes zeros in C)
            if pos + 1 >= len(data):
                break
            produced += data[pos] + data[pos + 1] * width
            x, pos = produced % width, pos + 2
        else:  # absolute: `code` pixels, word-aligned
            stored = (code + 1) // 2 if rle4 else code
            pos += stored + (stored & 1)
            x, produced = x + code, produced + code
    return padded
