"""Hostile files whose cost is out of proportion to their size, built by hand (small, deterministic).

    from tests.support.cost_samples import jpeg_scan_bomb
    data = jpeg_scan_bomb(4096, 4096, scans=5000)   # ~135 KB; minutes of libjpeg without a scan limit

Each builder writes the container byte by byte, so that it can repeat what no encoder repeats: scans, marker
segments, PNG chunks, GIF extension blocks, RLE end-of-line codes. `tests/support/corpus.py` (family "cost") and
`tests/service/pipeline/test_hostile_cost.py` use them.
"""

from __future__ import annotations

import struct

from tests.support.media_samples import encode_image, make_image_bytes, png_chunk, random_image


def _segment(marker: int, payload: bytes) -> bytes:
    """One JPEG marker segment: FF marker, u16be length (payload + 2), payload (ITU T.81, B.1.1)."""
    return bytes([0xFF, marker]) + (len(payload) + 2).to_bytes(2, "big") + payload


class _BitWriter:
    """Entropy-coded bytes, MSB first, with 0xFF stuffed by 0x00 (T.81, F.1.2.3); padded with 1 bits."""

    def __init__(self) -> None:
        self.out, self._acc, self._bits = bytearray(), 0, 0

    def put(self, value: int, nbits: int) -> None:
        for shift in range(nbits - 1, -1, -1):
            self._acc, self._bits = (self._acc << 1) | ((value >> shift) & 1), self._bits + 1
            if self._bits == 8:
                self.out += b"\xff\x00" if self._acc == 0xFF else bytes([self._acc])
                self._acc, self._bits = 0, 0

    def flush(self) -> bytes:
        if self._bits:
            self.put((1 << (8 - self._bits)) - 1, 8 - self._bits)
        return bytes(self.out)


def jpeg_scan_bomb(width: int, height: int, scans: int) -> bytes:
    """A greyscale progressive JPEG of `scans` identical AC scans, each a few bytes of end-of-band codes.

    The AC Huffman table has a single symbol (code "0"): EOBRUN class 14, so that each scan is a handful of
    15-bit runs over all blocks (images of 16,384 blocks or more), else plain EOB, one bit per block. libjpeg
    warns about the bogus progression and goes on, passing over every block once per scan.
    """
    blocks = -(-width // 8) * -(-height // 8)
    runs = -(-blocks // 32767)  # EOB14 codes runs of 16384..32767 blocks
    bits = _BitWriter()
    if blocks >= 16384 * runs:
        symbol = 0xE0
        for index in range(runs):
            bits.put(0, 1)
            bits.put(blocks // runs + (index < blocks % runs) - 16384, 14)
    else:
        symbol = 0x00
        bits.put(0, blocks)
    scan = _segment(0xDA, b"\x01\x01\x00\x01\x3f\x00") + bits.flush()  # 1 component, Ss=1 Se=63 Ah=Al=0
    dqt = _segment(0xDB, b"\x00" + bytes([1] * 64))
    sof2 = _segment(0xC2, b"\x08" + struct.pack(">HH", height, width) + b"\x01\x01\x11\x00")
    dht = _segment(0xC4, b"\x10" + bytes([1] + [0] * 15) + bytes([symbol]))
    return b"\xff\xd8" + dqt + sof2 + dht + scan * scans + b"\xff\xd9"


def jpeg_many_segments(count: int) -> bytes:
    """A real 16x16 JPEG with `count` empty COM segments after SOI (4 bytes each)."""
    real = make_image_bytes(16, 16, "JPEG", seed=4)
    return real[:2] + b"\xff\xfe\x00\x02" * count + real[2:]


def jpeg_junk_after_app0(width: int, height: int, seed: int = 0) -> bytes:
    """A baseline JPEG with one junk byte between APP0 and the next marker: libjpeg warns ("extraneous bytes
    before marker") and decodes it at full size, and so does Pillow."""
    real = encode_image(random_image(16, 16, seed=seed).resize((width, height)), "JPEG")
    assert real[2:4] == b"\xff\xe0"
    end = 4 + int.from_bytes(real[4:6], "big")
    return real[:end] + b"\x00" + real[end:]


def png_many_chunks(count: int, kind: bytes = b"IDAT") -> bytes:
    """A real 16x16 PNG with `count` extra chunks before its IDAT: empty IDATs, or tEXt "k\\0v" entries."""
    real = make_image_bytes(16, 16, "PNG", seed=5)
    first_idat = real.index(b"IDAT") - 4
    extra = png_chunk(kind, b"" if kind == b"IDAT" else b"k\x00v") * count
    return real[:first_idat] + extra + real[first_idat:]


def gif_many_blocks(count: int) -> bytes:
    """A real 16x16 GIF with `count` empty comment extensions (3 bytes each) before its first image."""
    real = make_image_bytes(16, 16, "GIF", seed=6)
    flags = real[10]
    start = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    return real[:start] + b"\x21\xfe\x00" * count + real[start:]


def bmp_rle(width: int, height: int, rows: bytes, *, rle4: bool = False) -> bytes:
    """A bottom-up RLE8 (or RLE4) BMP with a grey palette and `rows` as its coded pixel data."""
    colours = 16 if rle4 else 256
    palette = b"".join(bytes([v * 255 // (colours - 1)] * 3) + b"\x00" for v in range(colours))
    info = struct.pack(
        "<IiiHHIIiiII", 40, width, height, 1, 4 if rle4 else 8, 2 if rle4 else 1, len(rows), 2835, 2835, colours, 0
    )
    offset = 14 + len(info) + len(palette)
    return b"BM" + struct.pack("<IHHI", offset + len(rows), 0, 0, offset) + info + palette + rows


def bmp_rle_eol_bomb(width: int, height: int, *, rle4: bool = False) -> bytes:
    """Every row one 1-pixel run, then end-of-line: 4 bytes that Pillow pads to `width` pixels, one at a time."""
    return bmp_rle(width, height, b"\x01\x05\x00\x00" * height + b"\x00\x01", rle4=rle4)


def bmp_rle_slow(width: int, height: int) -> bytes:
    """An RLE8 BMP within the run-length ratio (runs of 255 plus end-of-line padding, ~250 pixels per byte)
    that Pillow's Python decoder still needs ~0.25 us per pixel for: slow in a way no header tells."""
    runs = width // 255 // 2  # half of each row coded by runs, the rest padded by the end-of-line code
    row = b"\xff\x07" * runs + b"\x00\x00"
    return bmp_rle(width, height, row * height + b"\x00\x01")


def jpeg_dc_scan_bomb(width: int, height: int, scans: int) -> bytes:
    """A 4:4:4 progressive JPEG of `scans` interleaved DC-first scans, every block's difference coded in one bit
    (a one-symbol DC table): each scan passes over every block of all three components. libjpeg warns about
    the repeated progression and decodes it (grey). Arithmetic coding makes the same scans ~1 KB in all."""
    blocks = 3 * -(-width // 8) * -(-height // 8)
    bits = _BitWriter()
    for _ in range(blocks // 4096):
        bits.put(0, 4096)
    bits.put(0, blocks % 4096)
    scan = _segment(0xDA, b"\x03\x01\x00\x02\x00\x03\x00\x00\x00\x00") + bits.flush()  # Ss=Se=0, Ah=Al=0
    dqt = _segment(0xDB, b"\x00" + bytes([1] * 64))
    components = b"\x01\x11\x00\x02\x11\x00\x03\x11\x00"
    sof2 = _segment(0xC2, b"\x08" + struct.pack(">HH", height, width) + b"\x03" + components)
    dht = _segment(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x00")  # DC table 0: category 0 only, code "0"
    return b"\xff\xd8" + dqt + sof2 + dht + scan * scans + b"\xff\xd9"


def png_inflated_metadata(count: int, kind: bytes = b"iCCP", inflated: int = 1 << 20) -> bytes:
    """A real 16x16 PNG with `count` chunks of `kind` (iCCP, zTXt) before its IDAT, each `inflated` bytes of zeros
    deflated (~1 KB a MiB): what Pillow inflates one by one."""
    import zlib

    real = make_image_bytes(16, 16, "PNG", seed=5)
    first_idat = real.index(b"IDAT") - 4
    chunk = png_chunk(kind, b"p\x00\x00" + zlib.compress(bytes(inflated), 9))
    return real[:first_idat] + chunk * count + real[first_idat:]
