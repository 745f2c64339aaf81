"""A deterministic corpus of hostile (and a few good) images, each with the outcomes it may have.

    from tests.support.corpus import build_corpus
    for case in build_corpus():      # ~300 `Case`s, the same bytes on every run
        case.name, case.data, case.expect   # expect: reasons it may be refused with; "ok" = must/may encode

Families: valid controls, truncations at many offsets, bit flips, broken headers and CRCs, lying dimensions,
decompression bombs, cost bombs (scans, chunks, RLE; `tests/support/cost_samples.py`), extreme aspect ratios, empty/random/text bytes, wrong magic, formats we refuse (TIFF,
PDF, PSD, EPS, SVG, ICO, FITS, JPEG 2000, HEIF ...), polyglots and trailing junk. `tests/acceptance/test_corpus.py`
sends every case through a real server; `tests/fuzz/fuzz_media.py` seeds the fuzzer with it.

Videos: `build_video_corpus()` (tests/support/video_corpus.py; needs PyAV), checked by tests/media/test_video.py.

`python -m tests.support.corpus DIR` writes every case to DIR (one file per case) for fuzzers or manual checks.
"""

from __future__ import annotations

import base64
import struct
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from tests.support.cost_samples import (
    bmp_rle,
    bmp_rle_eol_bomb,
    bmp_rle_slow,
    gif_many_blocks,
    jpeg_dc_scan_bomb,
    jpeg_junk_after_app0,
    jpeg_many_segments,
    jpeg_scan_bomb,
    png_inflated_metadata,
    png_many_chunks,
)
from tests.support.media_samples import (
    PNG_MAGIC,
    encode_image,
    make_animated_bytes,
    make_gif_header,
    make_image_bytes,
    make_png,
    make_png_bomb,
    make_webp_vp8x_header,
    png_chunk,
    random_bytes,
    random_image,
)

OK = "ok"
DAMAGED = frozenset({"truncated", "undecodable"})
SIZE_REFUSALS = frozenset({"too_small", "too_many_pixels", "aspect_ratio"})
ANY_IMAGE_OUTCOME = DAMAGED | SIZE_REFUSALS | {OK, "unsupported_format"}


@dataclass(frozen=True)
class Case:
    name: str
    data: bytes
    expect: frozenset[str]


def _case(name: str, data: bytes, *expect: str | frozenset[str]) -> Case:
    outcomes: set[str] = set()
    for item in expect:
        outcomes |= {item} if isinstance(item, str) else set(item)
    return Case(name, data, frozenset(outcomes))


# ------------------------------------------------------------------------------------------------ builders


def _bases() -> dict[str, bytes]:
    """One small noise image per allowed format: the seeds of the mutation families."""
    return {fmt: make_image_bytes(64, 48, fmt, seed=7) for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP")}


def _jpeg_with_sof(width: int, height: int) -> bytes:
    """A JPEG whose first SOF0 declares `width` x `height`; the rest is a real 8x8 JPEG's tables and scan."""
    real = make_image_bytes(8, 8, "JPEG", seed=3)
    pos = real.index(b"\xff\xc0")
    sof = bytearray(real[pos : pos + 2 + int.from_bytes(real[pos + 2 : pos + 4], "big")])
    sof[5:7], sof[7:9] = height.to_bytes(2, "big"), width.to_bytes(2, "big")
    return real[:pos] + bytes(sof) + real[pos + len(sof) :]


def _bmp(
    width: int, height: int, *, bpp: int = 24, header_size: int = 40, compression: int = 0, pixels: bytes = b""
) -> bytes:
    info = struct.pack("<IiiHHIIiiII", header_size, width, height, 1, bpp, compression, len(pixels), 2835, 2835, 0, 0)
    offset = 14 + len(info)
    return b"BM" + struct.pack("<IHHI", offset + len(pixels), 0, 0, offset) + info + pixels


def _riff(form: bytes, *chunks: tuple[bytes, bytes], size_delta: int = 0) -> bytes:
    body = form + b"".join(
        kind + struct.pack("<I", len(data)) + data + b"\x00" * (len(data) % 2) for kind, data in chunks
    )
    return b"RIFF" + struct.pack("<I", len(body) + size_delta) + body


def _png_with(*chunks: tuple[bytes, bytes]) -> bytes:
    return PNG_MAGIC + b"".join(png_chunk(kind, data) for kind, data in chunks)


def _ihdr(width: int, height: int, depth: int = 8, color: int = 2, interlace: int = 0) -> tuple[bytes, bytes]:
    return b"IHDR", struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, interlace)


def _idat_for(width: int, height: int, channels: int = 3) -> tuple[bytes, bytes]:
    return b"IDAT", zlib.compress(bytes((1 + width * channels) * height))


def _gif(screen: tuple[int, int], descriptor: bytes | None, lzw: bytes) -> bytes:
    u16 = struct.Struct("<H").pack
    head = b"GIF89a" + u16(screen[0]) + u16(screen[1]) + bytes([0x80, 0, 0]) + b"\x00\x00\x00\xff\xff\xff"
    return head + (descriptor or b"") + lzw + b"\x3b"


# ------------------------------------------------------------------------------------------------ families


def valid_controls() -> Iterator[Case]:
    for fmt, mode, kwargs in [
        ("PNG", "RGB", {}), ("PNG", "RGBA", {}), ("PNG", "L", {}), ("PNG", "P", {}), ("PNG", "I;16", {}),
        ("PNG", "1", {}), ("PNG", "LA", {}), ("JPEG", "RGB", {}), ("JPEG", "L", {}), ("JPEG", "CMYK", {}),
        ("JPEG", "RGB", {"progressive": True}), ("WEBP", "RGB", {}), ("WEBP", "RGBA", {"lossless": False}),
        ("GIF", "P", {}), ("BMP", "RGB", {}), ("BMP", "P", {}), ("BMP", "1", {}),
    ]:  # fmt: skip
        yield _case(
            f"valid/{fmt}-{mode}{'-' + '-'.join(kwargs) if kwargs else ''}",
            encode_image(random_image(40, 30, mode, 11), fmt, **kwargs),
            OK,
        )
    yield _case("valid/JPEG-exif-rotate-90", make_image_bytes(64, 32, "JPEG", exif_orientation=6), OK)
    yield _case("valid/JPEG-exif-orientation-9", make_image_bytes(64, 32, "JPEG", exif_orientation=9), OK)
    for fmt in ("GIF", "WEBP", "PNG"):
        yield _case(
            f"valid/animated-{fmt}-first-frame", make_animated_bytes([(255, 0, 0), (0, 255, 0)], (32, 24), fmt), OK
        )
    yield _case("valid/1x1", make_image_bytes(1, 1, "PNG"), OK)
    yield _case("valid/aspect-exactly-200", make_image_bytes(200, 1, "PNG"), OK)
    yield _case("valid/big-1bit-16MP", make_png_bomb(4000, 4000), OK)


def truncations() -> Iterator[Case]:
    for fmt, data in _bases().items():
        n = len(data)
        offsets = sorted(
            {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 100, n // 4, n // 2, 3 * n // 4, n - 16, n - 2, n - 1}
        )
        for cut in offsets:
            # The last bytes are often a trailer the decoder does not need: those cuts may still decode.
            may_decode = {OK} if cut >= n - 16 else set()
            yield _case(f"truncated/{fmt}-at-{cut}-of-{n}", data[:cut], DAMAGED, "unsupported_format", *may_decode)


def bit_flips() -> Iterator[Case]:
    rng = np.random.default_rng(2024)
    for fmt, data in _bases().items():
        for trial in range(8):
            mutated = bytearray(data)
            for _ in range(int(rng.integers(1, 5))):
                position = int(rng.integers(8, len(data)))  # past the magic: the format stays recognised
                mutated[position] ^= 1 << int(rng.integers(0, 8))
            yield _case(f"bitflip/{fmt}-{trial}", bytes(mutated), ANY_IMAGE_OUTCOME)


def broken_headers() -> Iterator[Case]:
    png = _bases()["PNG"]
    yield _case("header/PNG-bad-IHDR-CRC", make_png(16, 16, crc_ok=False), "undecodable")
    bad_idat = bytearray(png)
    idat = png.index(b"IDAT")
    length = int.from_bytes(png[idat - 4 : idat], "big")
    bad_idat[idat + 4 + length] ^= 0xFF  # first CRC byte of the first IDAT
    yield _case("header/PNG-bad-IDAT-CRC", bytes(bad_idat), DAMAGED, OK)
    yield _case(
        "header/PNG-bit-depth-3", _png_with(_ihdr(8, 8, depth=3), _idat_for(8, 8), (b"IEND", b"")), "undecodable"
    )
    yield _case(
        "header/PNG-color-type-5", _png_with(_ihdr(8, 8, color=5), _idat_for(8, 8), (b"IEND", b"")), "undecodable"
    )
    yield _case("header/PNG-interlace-7", _png_with(_ihdr(8, 8, interlace=7), _idat_for(8, 8), (b"IEND", b"")), DAMAGED)
    yield _case("header/PNG-width-0", make_png(0, 16), "too_small")
    yield _case("header/PNG-height-0", make_png(16, 0), "too_small")
    yield _case("header/PNG-IDAT-before-IHDR", _png_with(_idat_for(8, 8), _ihdr(8, 8), (b"IEND", b"")), "undecodable")
    yield _case("header/PNG-no-IDAT", _png_with(_ihdr(8, 8), (b"IEND", b"")), DAMAGED)
    yield _case("header/PNG-IDAT-not-zlib", _png_with(_ihdr(8, 8), (b"IDAT", b"\x00" * 40), (b"IEND", b"")), DAMAGED)
    yield _case(
        "header/PNG-zlib-short",
        _png_with(_ihdr(64, 64), (b"IDAT", zlib.compress(b"\x00" * 10)), (b"IEND", b"")),
        DAMAGED,
    )
    yield _case(
        "header/PNG-chunk-length-huge",
        PNG_MAGIC + struct.pack(">I", 0x7FFFFFFF) + b"IHDR" + b"\x00" * 32,
        DAMAGED,
        "too_small",
    )
    yield _case(
        "header/PNG-zTXt-bomb",
        _png_with(
            *_png_chunks_of(make_image_bytes(8, 8, "PNG")), (b"zTXt", b"k\x00\x00" + zlib.compress(b"A" * (64 << 20)))
        ),
        DAMAGED,
        OK,
    )
    yield _case(
        "header/PNG-palette-missing", _png_with(_ihdr(8, 8, color=3), _idat_for(8, 8, 1), (b"IEND", b"")), DAMAGED, OK
    )
    jpeg = make_image_bytes(16, 16, "JPEG", seed=5)
    yield _case("header/JPEG-SOI-EOI-only", b"\xff\xd8\xff\xd9", DAMAGED)
    yield _case("header/JPEG-no-SOF", b"\xff\xd8" + jpeg[jpeg.index(b"\xff\xda") :], DAMAGED)
    yield _case("header/JPEG-height-0", _jpeg_with_sof(16, 0), DAMAGED, "too_small")
    yield _case(
        "header/JPEG-garbage-scan",
        jpeg[: jpeg.index(b"\xff\xda") + 14] + bytes(range(256)) * 4 + b"\xff\xd9",
        DAMAGED,
        OK,
    )
    yield _case("header/JPEG-bad-marker-length", b"\xff\xd8\xff\xe0\x00\x01" + jpeg[2:], DAMAGED, OK)
    yield _case("header/JPEG-fill-bytes-only", b"\xff\xd8" + b"\xff" * 10000, DAMAGED)
    yield _case("header/GIF-screen-0x0", make_gif_header((0, 0), (0, 0)), "too_small")
    yield _case("header/GIF-trailer-only", _gif((16, 16), None, b""), DAMAGED)
    descriptor = b"\x2c" + struct.pack("<HHHH", 0, 0, 16, 16) + b"\x00"
    yield _case("header/GIF-LZW-code-size-12", _gif((16, 16), descriptor, b"\x0c\x02\xff\xff\x00"), DAMAGED)
    yield _case(
        "header/GIF-LZW-garbage", _gif((16, 16), descriptor, b"\x02\x10" + bytes(range(16)) + b"\x00"), DAMAGED, OK
    )
    yield _case("header/BMP-header-size-0", _bmp(8, 8, header_size=0, pixels=bytes(8 * 8 * 3)), DAMAGED)
    yield _case("header/BMP-bpp-7", _bmp(8, 8, bpp=7, pixels=bytes(64)), DAMAGED)
    yield _case("header/BMP-negative-width", _bmp(-8, 8, pixels=bytes(8 * 8 * 3)), DAMAGED, SIZE_REFUSALS)
    yield _case("header/BMP-compression-9", _bmp(8, 8, compression=9, pixels=bytes(64)), DAMAGED)
    yield _case("header/BMP-RLE8-garbage", _bmp(8, 8, bpp=8, compression=1, pixels=b"\x00\x05" * 40), DAMAGED, OK)
    yield _case(
        "header/BMP-offset-past-end",
        b"BM" + struct.pack("<IHHI", 70, 0, 0, 1 << 30) + _bmp(8, 8)[14:54] + bytes(16),
        DAMAGED,
    )
    webp = _bases()["WEBP"]
    yield _case("header/WEBP-RIFF-size-larger", webp[:4] + struct.pack("<I", len(webp) * 4) + webp[8:], DAMAGED)
    yield _case(
        "header/WEBP-VP8-bad-signature", _riff(b"WEBP", (b"VP8 ", b"\x00" * 3 + b"\x00\x00\x00" + bytes(20))), DAMAGED
    )
    yield _case("header/WEBP-unknown-chunk", _riff(b"WEBP", (b"ABCD", bytes(32))), DAMAGED)
    yield _case("header/WEBP-VP8X-only", make_webp_vp8x_header(16, 16), DAMAGED)


def _png_chunks_of(data: bytes) -> list[tuple[bytes, bytes]]:
    """The chunks of a PNG without IEND (so that more can be appended before it)."""
    chunks, pos = [], 8
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        if kind != b"IEND":
            chunks.append((kind, data[pos + 8 : pos + 8 + length]))
        pos += 12 + length
    return chunks


def lying_dimensions() -> Iterator[Case]:
    yield _case("lying/PNG-10000x10000-tiny-IDAT", make_png(10000, 10000), "too_many_pixels")
    yield _case("lying/PNG-4000x3000-tiny-IDAT", make_png(4000, 3000), DAMAGED)
    yield _case("lying/PNG-2^31-wide", make_png(0x7FFFFFFF, 1), "too_many_pixels", "aspect_ratio")
    yield _case("lying/PNG-2^32-1-square", make_png(0xFFFFFFFF, 0xFFFFFFFF), "too_many_pixels")
    yield _case("lying/JPEG-65000x65000", _jpeg_with_sof(65000, 65000), "too_many_pixels")
    yield _case("lying/JPEG-8000x6000", _jpeg_with_sof(8000, 6000), "too_many_pixels")
    yield _case("lying/JPEG-3000x2000-8x8-data", _jpeg_with_sof(3000, 2000), DAMAGED, OK)
    yield _case(
        "lying/GIF-frame-wider-than-screen", make_gif_header((16, 16), (65535, 1)), "aspect_ratio", "too_many_pixels"
    )
    yield _case("lying/BMP-100000-square", _bmp(100000, 100000, pixels=bytes(64)), "too_many_pixels")
    yield _case("lying/BMP-top-down-huge", _bmp(20000, -20000, pixels=bytes(64)), "too_many_pixels")
    yield _case("lying/BMP-4000x3000-no-pixels", _bmp(4000, 3000, pixels=bytes(64)), DAMAGED)
    yield _case("lying/WEBP-VP8X-16384-square", make_webp_vp8x_header(16384, 16384), "too_many_pixels")
    vp8l = b"\x2f" + (((16383) | (16383 << 14)) & 0xFFFFFFF).to_bytes(4, "little") + bytes(20)
    yield _case("lying/WEBP-VP8L-16384-square", _riff(b"WEBP", (b"VP8L", vp8l)), "too_many_pixels")


def bombs() -> Iterator[Case]:
    yield _case("bomb/PNG-1bit-20000x20000", make_png_bomb(20000, 20000), "too_many_pixels")
    yield _case("bomb/PNG-1bit-50000x10000", make_png_bomb(50000, 10000), "too_many_pixels")
    yield _case("bomb/PNG-1bit-6400x6400-just-over", make_png_bomb(6400, 6400), "too_many_pixels")
    yield _case("bomb/PNG-1bit-9500x9500-over-pillow", make_png_bomb(9500, 9500), "too_many_pixels")
    yield _case("bomb/GIF-screen-65535-square", make_gif_header((65535, 65535), (1, 1)), "too_many_pixels")
    yield _case("bomb/GIF-frame-offset-65000", make_gif_header((16, 16), (10, 10), (65000, 65000)), "too_many_pixels")
    yield _case("bomb/GIF-frame-65535-square", make_gif_header((16, 16), (65535, 65535)), "too_many_pixels")
    yield _case("bomb/WEBP-VP8X-max", make_webp_vp8x_header(1 << 24, 1 << 24), "too_many_pixels")


def cost_bombs() -> Iterator[Case]:
    """Files that cost far more than their size suggests, refused from their bytes before decoding (defaults:
    100 JPEG scans, 16 passes over the blocks, one iCCP, 64 MiB of inflated PNG metadata, 65,536 segments/chunks/blocks, 256 pixels per RLE byte, 4 M pixels padded by RLE end-of-line codes), and good files near the limits."""
    yield _case("cost/JPEG-5000-scans", jpeg_scan_bomb(4096, 4096, 5000), "too_many_scans")
    yield _case("cost/JPEG-101-scans", jpeg_scan_bomb(4096, 4096, 101), "too_many_scans")
    yield _case("cost/JPEG-100-scans-101-passes", jpeg_scan_bomb(1024, 1024, 100), "too_many_scans")
    yield _case("cost/JPEG-16-passes-at-the-limit", jpeg_scan_bomb(1024, 1024, 16), OK)
    yield _case("cost/JPEG-100-DC-scans-444", jpeg_dc_scan_bomb(1024, 1024, 100), "too_many_scans")
    yield _case("cost/PNG-2-iCCP", png_inflated_metadata(2), "too_many_chunks")
    yield _case("cost/PNG-70-zTXt-of-1MiB", png_inflated_metadata(70, b"zTXt"), "compression_ratio")
    yield _case("cost/BMP-RLE8-40MP-within-the-ratio", bmp_rle_slow(6400, 6250), "compression_ratio")
    yield _case("cost/JPEG-70000-segments", jpeg_many_segments(70_000), "too_many_chunks")
    yield _case("cost/PNG-70000-empty-IDAT", png_many_chunks(70_000), "too_many_chunks")
    yield _case("cost/PNG-70000-tEXt", png_many_chunks(70_000, b"tEXt"), "too_many_chunks")
    yield _case("cost/PNG-1000-tEXt", png_many_chunks(1000, b"tEXt"), OK)
    yield _case("cost/GIF-70000-comment-blocks", gif_many_blocks(70_000), "too_many_chunks")
    yield _case("cost/BMP-RLE8-eol-40MP", bmp_rle_eol_bomb(6000, 6500), "compression_ratio")
    yield _case("cost/BMP-RLE4-eol-40MP", bmp_rle_eol_bomb(6000, 6500, rle4=True), "compression_ratio")
    yield _case("cost/BMP-RLE8-runs", bmp_rle(510, 4, b"\xff\x07\xff\x09\x00\x00" * 4 + b"\x00\x01"), OK)
    yield _case("cost/JPEG-junk-after-APP0", jpeg_junk_after_app0(64, 48), OK)


def aspect_ratios() -> Iterator[Case]:
    for name, (width, height, fmt), expect in [
        ("1x300", (1, 300, "PNG"), {"aspect_ratio"}), ("300x1", (300, 1, "PNG"), {"aspect_ratio"}),
        ("1000x4", (1000, 4, "PNG"), {"aspect_ratio"}), ("201x1", (201, 1, "GIF"), {"aspect_ratio"}),
        ("5000x20-GIF", (5000, 20, "GIF"), {"aspect_ratio"}), ("2800x14", (2800, 14, "PNG"), {OK}),
        ("3000x15-JPEG", (3000, 15, "JPEG"), {OK}), ("7200x36-grid-over-511", (7200, 36, "PNG"), {"aspect_ratio"}),
        ("14x2800-BMP", (14, 2800, "BMP"), {OK}), ("2x1000-WEBP", (2, 1000, "WEBP"), {"aspect_ratio"}),
    ]:  # fmt: skip
        yield _case(f"aspect/{name}", make_image_bytes(width, height, fmt, seed=9), *expect)


def not_images() -> Iterator[Case]:
    yield _case("junk/empty", b"", "empty")
    for size in (1, 2, 7, 64, 512, 4096, 65536):
        for seed in (1, 2):
            yield _case(f"junk/random-{size}-{seed}", random_bytes(size, seed), "unsupported_format")
    png_b64 = base64.b64encode(make_image_bytes(8, 8, "PNG"))
    for name, data in [
        ("whitespace", b" \n\t\r\n"), ("ascii", b"hello, world"), ("json", b'{"images": ["AAAA"]}'),
        ("html", b"<!doctype html><html><body><img src=x></body></html>"), ("nul-bytes", bytes(1000)),
        ("ff-bytes", b"\xff" * 1000), ("base64-of-a-png", png_b64),
        ("data-uri-text", b"data:image/png;base64," + png_b64),
        ("url", b"https://example.com/cat.png"), ("file-path", b"/etc/passwd"),
    ]:  # fmt: skip
        yield _case(f"junk/{name}", data, "unsupported_format")


def wrong_magic() -> Iterator[Case]:
    bases = _bases()
    jpeg, png, gif = bases["JPEG"], bases["PNG"], bases["GIF"]
    yield _case("magic/PNG-magic-on-JPEG-body", PNG_MAGIC + jpeg[8:], DAMAGED)
    yield _case("magic/GIF-magic-on-PNG-body", b"GIF89a" + png[6:], DAMAGED, SIZE_REFUSALS)
    yield _case("magic/BM-on-PNG", b"BM" + png, DAMAGED, SIZE_REFUSALS)
    yield _case("magic/JPEG-SOI-on-GIF-body", b"\xff\xd8\xff" + gif[3:], DAMAGED)
    yield _case("magic/GIF88a", b"GIF88a" + gif[6:], "unsupported_format")
    yield _case("magic/FFD8-without-FF", b"\xff\xd8\x00" + jpeg[3:], "unsupported_format")
    yield _case("magic/PNG-magic-only", PNG_MAGIC, DAMAGED)
    yield _case("magic/PNG-magic-one-byte-off", b"\x89PNG\r\n\x1a\x0b" + png[8:], "unsupported_format")
    yield _case("magic/RIFF-WAVE", _riff(b"WAVE", (b"fmt ", bytes(16)), (b"data", bytes(64))), "unsupported_format")
    yield _case("magic/RIFF-AVI", _riff(b"AVI ", (b"LIST", bytes(64))), "unsupported_format")


def refused_formats() -> Iterator[Case]:
    image = random_image(24, 16, "RGB", 4)
    fixed_date = time.gmtime(1_704_067_200)  # PDF stamps dates: keep the bytes stable
    for fmt, kwargs in [("TIFF", {}), ("TIFF", {"compression": "tiff_lzw"}), ("ICO", {}), ("PPM", {}), ("TGA", {}),
                        ("PDF", {"creationDate": fixed_date, "modDate": fixed_date}), ("PCX", {}), ("SGI", {}),
                        ("JPEG2000", {}), ("EPS", {}), ("DDS", {}), ("XBM", {})]:  # fmt: skip
        try:
            data = encode_image(image.convert("1") if fmt == "XBM" else image, fmt, **kwargs)
        except (OSError, KeyError, ValueError):  # a writer missing from this Pillow build: skip it
            continue
        suffix = "-" + kwargs["compression"] if "compression" in kwargs else ""
        yield _case(f"refused/{fmt}{suffix}", data, "unsupported_format")
    for name, data in [
        ("TIFF-big-endian-header", b"MM\x00\x2a\x00\x00\x00\x08" + bytes(64)),
        ("BigTIFF-header", b"II\x2b\x00\x08\x00\x00\x00" + bytes(64)),
        ("PSD-header", b"8BPS\x00\x01" + bytes(6) + b"\x00\x03" + struct.pack(">II", 16, 16) + b"\x00\x08\x00\x03"),
        ("EPS-text", b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 16 16\n"),
        ("EPS-DOS-binary", b"\xc5\xd0\xd3\xc6" + bytes(28)), ("SVG", b'<svg xmlns="http://www.w3.org/2000/svg"/>'),
        ("SVG-xml-prolog", b'<?xml version="1.0"?><svg width="9999999" height="9999999"></svg>'),
        ("FITS", b"SIMPLE  =                    T" + b" " * 50 + b"BITPIX  =                    8"),
        ("JP2-signature", b"\x00\x00\x00\x0cjP  \r\n\x87\n" + bytes(32)),
        ("J2K-codestream", b"\xff\x4f\xff\x51" + bytes(40)),
        ("HEIC", b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic"),
        ("AVIF", b"\x00\x00\x00\x1cftypavif" + bytes(16)),
        ("JPEG-XL", b"\xff\x0a" + bytes(32)), ("QOI", b"qoif" + struct.pack(">II", 16, 16) + b"\x03\x00"),
        ("ICNS", b"icns" + struct.pack(">I", 8)), ("OpenEXR", b"\x76\x2f\x31\x01" + bytes(32)),
        ("CUR", b"\x00\x00\x02\x00" + bytes(32)),
    ]:  # fmt: skip
        yield _case(f"refused/{name}", data, "unsupported_format")


def polyglots() -> Iterator[Case]:
    bases = _bases()
    junk = random_bytes(1024, 5)
    zip_tail = b"PK\x03\x04" + bytes(26) + b"PK\x05\x06" + bytes(18)
    for fmt in ("PNG", "JPEG", "GIF", "BMP", "WEBP"):
        yield _case(f"polyglot/{fmt}-then-junk", bases[fmt] + junk, OK)
    yield _case("polyglot/PNG-then-PNG", bases["PNG"] + make_image_bytes(9, 9, "PNG"), OK)
    yield _case("polyglot/JPEG-then-ZIP", bases["JPEG"] + zip_tail, OK)
    yield _case("polyglot/GIF-then-JAR-GIFAR", bases["GIF"] + zip_tail, OK)
    jpeg = bases["JPEG"]
    yield _case(
        "polyglot/JPEG-with-PNG-in-COM",
        jpeg[:2] + b"\xff\xfe" + struct.pack(">H", 2 + len(bases["PNG"][:60000])) + bases["PNG"][:60000] + jpeg[2:],
        OK,
    )
    yield _case(
        "polyglot/PNG-with-JPEG-in-tEXt",
        _png_with(*_png_chunks_of(bases["PNG"]), (b"tEXt", b"x\x00" + jpeg), (b"IEND", b"")),
        OK,
    )
    yield _case("polyglot/PDF-header-then-PNG", b"%PDF-1.7\n" + bases["PNG"], "unsupported_format")
    yield _case("polyglot/ZIP-then-PNG", zip_tail + bases["PNG"], "unsupported_format")
    yield _case("polyglot/HTML-then-PNG", b"<html><!--" + bases["PNG"], "unsupported_format")
    yield _case("polyglot/TIFF-then-JPEG", b"II*\x00" + jpeg, "unsupported_format")


FAMILIES = (valid_controls, truncations, bit_flips, broken_headers, lying_dimensions, bombs, cost_bombs,
            aspect_ratios, not_images, wrong_magic, refused_formats, polyglots)  # fmt: skip


@cache
def build_video_corpus() -> tuple:
    """The hostile videos (tests/support/video_corpus.py), built once per process (~3 s; PyAV must be installed)."""
    from tests.support.video_corpus import build_video_corpus as build

    return build()


@cache
def build_corpus() -> tuple[Case, ...]:
    """Every case, in a fixed order; built once per process (~1 s, most of it the bomb PNGs)."""
    cases = tuple(case for family in FAMILIES for case in family())
    names = [case.name for case in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else "corpus")
    out.mkdir(parents=True, exist_ok=True)
    for case in build_corpus():
        (out / case.name.replace("/", "__")).write_bytes(case.data)
    print(f"wrote {len(build_corpus())} cases to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
