"""Small, deterministic test images built in memory with Pillow, plus hand-made hostile headers.

A plain module of functions (no fixtures) so that any test file can import it:

    from tests.support.media_samples import make_image_bytes
    data = make_image_bytes(64, 48, fmt="JPEG", seed=1, exif_orientation=6)

Lossy formats use settings that keep colours close (JPEG quality 95; WebP lossless), so tests can compare
pixels with a small tolerance.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Sequence

import numpy as np
from PIL import Image

ORIENTATION_TAG = 0x0112
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Pillow's default save settings per format, tuned for tests (closest colours, smallest files).
_SAVE_DEFAULTS: dict[str, dict[str, object]] = {
    "JPEG": {"quality": 95},
    "WEBP": {"lossless": True, "exact": True},
}
_EXIF_CAPABLE = frozenset({"JPEG", "PNG", "WEBP"})


def random_image(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """Uniform noise in `mode`, the same for the same arguments.

    Supports 1, L, LA, P, PA, RGB, RGBA, RGBX, CMYK, YCbCr, LAB, HSV (8-bit bands), I;16 (0..65535),
    I (-100_000..100_000, to exercise clipping) and F (-50.0..300.0, likewise).
    """
    rng = np.random.default_rng(seed)
    if mode == "1":
        return Image.fromarray(rng.integers(0, 2, (height, width), dtype=np.uint8).astype(bool))
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 0x10000, (height, width), dtype=np.uint16))
    if mode == "I":
        return Image.fromarray(rng.integers(-100_000, 100_000, (height, width), dtype=np.int32))
    if mode == "F":
        return Image.fromarray(rng.uniform(-50.0, 300.0, (height, width)).astype(np.float32))
    bands = Image.getmodebands(mode)
    image = Image.frombytes(mode, (width, height), rng.integers(0, 256, width * height * bands, np.uint8).tobytes())
    if mode in ("P", "PA"):
        image.putpalette(rng.integers(0, 256, 768, dtype=np.uint8).tobytes())
    return image


def solid_image(width: int, height: int, color: int | tuple[int, ...], mode: str = "RGB") -> Image.Image:
    """One colour everywhere (for colour checks that must survive lossy codecs)."""
    return Image.new(mode, (width, height), color)


def corner_marked_image(width: int, height: int, block: int = 16) -> Image.Image:
    """Blue RGB image with a red `block` x `block` square in the top-left corner.

    Used for EXIF orientation: wherever the red corner ends up tells which transpose was applied.
    Edges on multiples of 8 (JPEG blocks) keep the colours clean.
    """
    image = Image.new("RGB", (width, height), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, block, block))
    return image


def encode_image(image: Image.Image, fmt: str = "PNG", *, exif_orientation: int | None = None, **save_kwargs) -> bytes:
    """`image` saved as `fmt` (a Pillow format name), with an EXIF orientation tag when asked."""
    fmt = fmt.upper()
    kwargs = {**_SAVE_DEFAULTS.get(fmt, {}), **save_kwargs}
    if exif_orientation is not None:
        if fmt not in _EXIF_CAPABLE:
            raise ValueError(f"{fmt} cannot carry EXIF")
        exif = Image.Exif()
        exif[ORIENTATION_TAG] = exif_orientation
        kwargs["exif"] = exif
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def make_image_bytes(
    width: int,
    height: int,
    fmt: str = "PNG",
    mode: str = "RGB",
    seed: int = 0,
    exif_orientation: int | None = None,
    **save_kwargs,
) -> bytes:
    """Noise image (`random_image`) of the given size and mode, encoded as `fmt` (JPEG, PNG, WEBP, GIF, BMP,
    or any other format Pillow writes, e.g. TIFF or PDF for refusal tests)."""
    return encode_image(random_image(width, height, mode, seed), fmt, exif_orientation=exif_orientation, **save_kwargs)


def make_animated_bytes(
    colors: Sequence[tuple[int, int, int]], size: tuple[int, int] = (16, 16), fmt: str = "GIF"
) -> bytes:
    """An animation with one solid frame per colour (GIF, WEBP or PNG -> APNG)."""
    frames = [Image.new("RGB", size, color) for color in colors]
    buffer = io.BytesIO()
    kwargs = _SAVE_DEFAULTS.get(fmt.upper(), {})
    frames[0].save(buffer, fmt, save_all=True, append_images=frames[1:], duration=100, loop=0, **kwargs)
    return buffer.getvalue()


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC-32 over type + data (PNG spec, section 5.3)."""
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def make_png(
    width: int, height: int, *, bit_depth: int = 8, color_type: int = 2, idat: bytes | None = None, crc_ok: bool = True
) -> bytes:
    """A PNG written chunk by chunk, whose IHDR may claim any size.

    `idat` defaults to a tiny zlib stream that does not match the size: enough for header-only tests,
    which must refuse the image before any pixel is decoded. `crc_ok=False` corrupts the IHDR CRC.
    """
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0))
    if not crc_ok:
        ihdr = ihdr[:-4] + bytes(b ^ 0xFF for b in ihdr[-4:])
    idat = zlib.compress(b"\x00" * 16) if idat is None else idat
    return PNG_MAGIC + ihdr + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


def make_png_bomb(width: int, height: int) -> bytes:
    """A real 1-bit greyscale PNG of all-zero rows: tiny on the wire, width*height pixels once decoded.

    Compressed row by row so that building it never holds the raw raster in memory.
    """
    row = bytes(1 + (width + 7) // 8)  # filter type 0 + packed bits
    compressor = zlib.compressobj(9)
    parts = [compressor.compress(row) for _ in range(height)]
    parts.append(compressor.flush())
    return make_png(width, height, bit_depth=1, color_type=0, idat=b"".join(parts))


def make_gif_header(screen: tuple[int, int], frame: tuple[int, int], offset: tuple[int, int] = (0, 0)) -> bytes:
    """A minimal GIF89a: logical screen, 2-colour global table, one image descriptor, empty LZW data.

    The raster is empty on purpose: it is for bomb tests that must be refused from the header alone.
    """
    u16 = struct.Struct("<H").pack
    header = b"GIF89a" + u16(screen[0]) + u16(screen[1]) + bytes([0x80, 0, 0]) + b"\x00\x00\x00\xff\xff\xff"
    descriptor = b"\x2c" + u16(offset[0]) + u16(offset[1]) + u16(frame[0]) + u16(frame[1]) + b"\x00"
    lzw = b"\x02" + b"\x01\x2c" + b"\x00"  # min code size 2; one sub-block holding clear (4) + end (5)
    return header + descriptor + lzw + b"\x3b"


def make_webp_vp8x_header(width: int, height: int) -> bytes:
    """RIFF/WEBP with only a VP8X chunk declaring a `width` x `height` canvas (RFC 9649, section 2.7)."""
    vp8x = b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    body = b"WEBP" + b"VP8X" + struct.pack("<I", len(vp8x)) + vp8x
    return b"RIFF" + struct.pack("<I", len(body)) + body


def random_bytes(size: int, seed: int = 0) -> bytes:
    """Deterministic noise that starts with no known magic (first byte forced to 0x00)."""
    data = bytearray(np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes())
    if data:
        data[0] = 0
    return bytes(data)
