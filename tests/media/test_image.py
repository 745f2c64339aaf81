"""mmproc.media: limits, format sniffing, the order of refusals, decoding, EXIF orientation, mode -> RGB."""

from __future__ import annotations

import dataclasses
import io
import resource
import struct
import sys
import threading
import tracemalloc
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile, ImageOps
from PIL.JpegImagePlugin import JpegImageFile

from mmproc.errors import ConfigError, InvalidMediaError, Reason
from mmproc.media import SUPPORTED_FORMATS, MediaLimits, decode_image, sniff_format
from mmproc.media.convert import to_rgb
from mmproc.media.formats import peek_size
from mmproc.media.orientation import read_orientation
from mmproc.types import DecodedImage
from tests.support.media_samples import (
    corner_marked_image,
    encode_image,
    make_animated_bytes,
    make_gif_header,
    make_image_bytes,
    make_png,
    make_png_bomb,
    make_webp_vp8x_header,
    random_bytes,
    random_image,
    solid_image,
)

LIMITS = MediaLimits()
FORMATS = ["JPEG", "PNG", "WEBP", "GIF", "BMP"]


def reason_of(data: bytes, limits: MediaLimits = LIMITS) -> str:
    with pytest.raises(InvalidMediaError) as info:
        decode_image(data, limits)
    assert info.value.index == -1
    return info.value.reason


def pixel(decoded: DecodedImage, xy: tuple[int, int]) -> tuple[int, int, int]:
    return decoded.image.getpixel(xy)


def assert_close(actual: tuple[int, ...], expected: tuple[int, ...], tol: int) -> None:
    assert all(abs(a - e) <= tol for a, e in zip(actual, expected, strict=True)), (actual, expected)


# ---------------------------------------------------------------------------------------------- MediaLimits


def test_limits_defaults() -> None:
    assert LIMITS.max_image_bytes == 32 * 1024 * 1024
    assert LIMITS.max_pixels == 40_000_000
    assert LIMITS.min_side == 1
    assert LIMITS.max_aspect_ratio == 200.0
    assert LIMITS.allowed_formats == frozenset({"jpeg", "png", "webp", "gif", "bmp"}) == SUPPORTED_FORMATS
    with pytest.raises(dataclasses.FrozenInstanceError):
        LIMITS.max_pixels = 1  # type: ignore[misc]


@pytest.mark.parametrize("value", [0, -1, 89_000_001, 10**12, True, 1.5, None])
def test_limits_reject_bad_max_pixels(value: object) -> None:
    with pytest.raises(ConfigError, match="max_pixels"):
        MediaLimits(max_pixels=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_image_bytes", 0),
        ("max_image_bytes", "1"),
        ("min_side", 0),
        ("max_aspect_ratio", 0.5),
        ("max_aspect_ratio", float("inf")),
        ("max_aspect_ratio", float("nan")),
        ("allowed_formats", {"tiff"}),
        ("allowed_formats", "png"),
        ("allowed_formats", set()),
        ("allowed_formats", [1]),
    ],
)
def test_limits_reject_bad_fields(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        MediaLimits(**{field: value})


def test_limits_normalise() -> None:
    limits = MediaLimits(max_pixels=89_000_000, max_aspect_ratio=3, allowed_formats=["PNG", " Jpeg"])
    assert limits.allowed_formats == frozenset({"png", "jpeg"})
    assert isinstance(limits.max_aspect_ratio, float)


# ---------------------------------------------------------------------------------------------- sniffing


@pytest.mark.parametrize("fmt", FORMATS)
def test_sniff_known_formats(fmt: str) -> None:
    assert sniff_format(make_image_bytes(8, 8, fmt)) == fmt.lower()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xd8",
        make_image_bytes(8, 8, "TIFF"),
        make_image_bytes(8, 8, "PDF"),
        make_image_bytes(8, 8, "ICO"),
        b"8BPS\x00\x01" + bytes(20),  # PSD
        b"%!PS-Adobe-3.0 EPSF-3.0\n",
        b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>',
        b"RIFF\x10\x00\x00\x00WAVEfmt ",
        random_bytes(64),
    ],
)
def test_sniff_refuses_everything_else(data: bytes) -> None:
    assert sniff_format(data) is None


# ---------------------------------------------------------------------------------------------- decoding


@pytest.mark.parametrize(("fmt", "tol"), [("JPEG", 4), ("PNG", 0), ("WEBP", 0), ("GIF", 0), ("BMP", 0)])
def test_each_format_decodes_to_rgb(fmt: str, tol: int) -> None:
    data = encode_image(solid_image(40, 30, (200, 100, 50)), fmt)
    decoded = decode_image(data, LIMITS)
    assert isinstance(decoded, DecodedImage)
    assert decoded.image.mode == "RGB"
    assert decoded.image.size == decoded.source_size == (40, 30)
    assert decoded.source_format == fmt.lower()
    for xy in [(0, 0), (39, 29), (20, 15)]:
        assert_close(pixel(decoded, xy), (200, 100, 50), tol)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "BMP"])
def test_lossless_formats_round_trip_exactly(fmt: str) -> None:
    original = random_image(33, 17, "RGB", seed=3)
    decoded = decode_image(encode_image(original, fmt), LIMITS)
    assert np.array_equal(np.asarray(decoded.image), np.asarray(original))


def test_output_is_plain_loaded_image_without_metadata() -> None:
    data = make_image_bytes(16, 8, "JPEG", exif_orientation=6, icc_profile=b"not really an icc profile")
    decoded = decode_image(data, LIMITS)
    assert type(decoded.image) is Image.Image  # not an ImageFile holding the BytesIO
    assert decoded.image.info == {}
    assert decoded.image.getexif().get(0x0112) is None  # nobody downstream can rotate it twice


# ---------------------------------------------------------------------------------------------- modes -> RGB


def decode_png_of(image: Image.Image) -> DecodedImage:
    return decode_image(encode_image(image, "PNG"), LIMITS)


def test_mode_l() -> None:
    image = Image.fromarray(np.array([[0, 7], [128, 255]], dtype=np.uint8))
    decoded = decode_png_of(image)
    assert pixel(decoded, (1, 0)) == (7, 7, 7)
    assert pixel(decoded, (1, 1)) == (255, 255, 255)


def test_mode_1() -> None:
    image = Image.fromarray(np.array([[True, False]]))
    assert image.mode == "1"
    decoded = decode_png_of(image)
    assert pixel(decoded, (0, 0)) == (255, 255, 255)
    assert pixel(decoded, (1, 0)) == (0, 0, 0)


def test_mode_la_drops_alpha_keeps_stored_grey() -> None:
    image = Image.new("LA", (2, 1), (5, 0))
    image.putpixel((1, 0), (200, 255))
    decoded = decode_png_of(image)
    assert pixel(decoded, (0, 0)) == (5, 5, 5)  # fully transparent: the stored grey, not a background
    assert pixel(decoded, (1, 0)) == (200, 200, 200)


def test_mode_rgba_drops_alpha_keeps_stored_colour() -> None:
    image = Image.new("RGBA", (2, 1), (1, 2, 3, 0))
    image.putpixel((1, 0), (10, 20, 30, 128))
    decoded = decode_png_of(image)
    assert pixel(decoded, (0, 0)) == (1, 2, 3)  # what Kimi's processors get from convert("RGB")
    assert pixel(decoded, (1, 0)) == (10, 20, 30)


def palette_image(transparent_index: int | None) -> Image.Image:
    image = Image.frombytes("P", (2, 1), bytes([0, 1]))
    image.putpalette([10, 20, 30, 200, 100, 50] + [0] * 762)
    if transparent_index is not None:
        image.info["transparency"] = transparent_index
    return image


@pytest.mark.parametrize("fmt", ["PNG", "GIF", "BMP"])
def test_mode_p(fmt: str) -> None:
    decoded = decode_image(encode_image(palette_image(None), fmt), LIMITS)
    assert pixel(decoded, (0, 0)) == (10, 20, 30)
    assert pixel(decoded, (1, 0)) == (200, 100, 50)


@pytest.mark.parametrize("fmt", ["PNG", "GIF"])
def test_mode_p_with_transparency_keeps_palette_colour_without_warnings(fmt: str) -> None:
    data = encode_image(palette_image(1), fmt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow's "Palette images with Transparency" warning must not fire
        decoded = decode_image(data, LIMITS)
    assert pixel(decoded, (0, 0)) == (10, 20, 30)
    assert pixel(decoded, (1, 0)) == (200, 100, 50)  # transparent index: the palette colour, alpha dropped


def test_mode_p_with_per_index_transparency_table() -> None:
    image = palette_image(None)
    image.info["transparency"] = bytes([255, 0] + [255] * 254)
    rgb = to_rgb(image)
    assert rgb.getpixel((1, 0)) == (200, 100, 50)


def test_mode_cmyk_jpeg() -> None:
    data = encode_image(solid_image(16, 16, (0, 255, 255, 0), "CMYK"), "JPEG")
    decoded = decode_image(data, LIMITS)
    assert_close(pixel(decoded, (8, 8)), (255, 0, 0), 4)


I16_VALUES = np.array([[0x0000, 0x0001, 0x00C8, 0x00FF, 0x0100, 0x1234, 0x8000, 0xFFFF]], dtype=np.uint16)


def test_mode_i16_png_clips_at_255_like_pillow() -> None:
    # What the reference processors get from `image.convert("RGB")` (Pillow 12.3 and 13.0): min(v, 255).
    image = Image.fromarray(I16_VALUES)
    assert image.mode == "I;16"
    decoded = decode_png_of(image)
    assert [pixel(decoded, (x, 0)) for x in range(8)] == [(v,) * 3 for v in (0, 1, 200, 255, 255, 255, 255, 255)]
    opened = Image.open(io.BytesIO(encode_image(image, "PNG")))
    assert opened.mode == "I;16"
    assert np.array_equal(np.asarray(decoded.image), np.asarray(opened.convert("RGB")))


@pytest.mark.parametrize("mode", ["I;16", "I;16L", "I;16B"])
def test_mode_i16_byte_orders_match_pillow_convert(mode: str) -> None:
    raw = I16_VALUES.astype(">u2" if mode == "I;16B" else "<u2").tobytes()
    image = Image.frombytes(mode, (8, 1), raw)
    rgb = to_rgb(image)
    assert [rgb.getpixel((x, 0))[0] for x in range(8)] == [0, 1, 200, 255, 255, 255, 255, 255]
    assert np.array_equal(np.asarray(rgb), np.asarray(image.convert("RGB")))
    noise = random_image(9, 7, "I;16", seed=5)
    assert np.array_equal(np.asarray(to_rgb(noise)), np.asarray(noise.convert("RGB")))


def test_mode_i_clips_then_takes_high_byte() -> None:
    image = Image.fromarray(np.array([[-5, 0x1234, 0xFFFF, 70_000]], dtype=np.int32))
    assert image.mode == "I"
    rgb = to_rgb(image)
    assert [rgb.getpixel((x, 0))[0] for x in range(4)] == [0, 0x12, 255, 255]


def test_mode_f_clips_and_truncates() -> None:
    image = Image.fromarray(np.array([[1.7, 254.9, 300.0, -3.0, np.nan, np.inf]], dtype=np.float32))
    assert image.mode == "F"
    rgb = to_rgb(image)
    assert [rgb.getpixel((x, 0))[0] for x in range(6)] == [1, 254, 255, 0, 0, 255]
    assert rgb.getpixel((0, 0)) == (1, 1, 1)


@pytest.mark.parametrize(
    "mode",
    ["1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV", "I;16", "I", "F"],
)
def test_every_mode_converts_deterministically(mode: str) -> None:
    image = random_image(9, 7, mode, seed=11)
    first, second = to_rgb(image), to_rgb(image.copy())
    assert first.mode == "RGB" and first.size == (9, 7)
    assert first is not image
    assert np.array_equal(np.asarray(first), np.asarray(second))


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "CMYK", "YCbCr"])
def test_plain_modes_match_pillow_convert(mode: str) -> None:
    image = random_image(9, 7, mode, seed=12)
    assert np.array_equal(np.asarray(to_rgb(image)), np.asarray(image.convert("RGB")))


# ---------------------------------------------------------------------------------------------- EXIF orientation

# Where the red top-left square of a stored image ends up once shown upright, per EXIF orientation.
RED_CORNER = {1: "tl", 2: "tr", 3: "br", 4: "bl", 5: "tl", 6: "tr", 7: "br", 8: "bl"}


def corner_xy(corner: str, size: tuple[int, int], inset: int = 4) -> tuple[int, int]:
    width, height = size
    return (inset if corner[1] == "l" else width - 1 - inset, inset if corner[0] == "t" else height - 1 - inset)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_jpeg(orientation: int) -> None:
    data = encode_image(corner_marked_image(48, 32), "JPEG", exif_orientation=orientation)
    decoded = decode_image(data, LIMITS)
    assert decoded.source_size == (48, 32)
    assert decoded.image.size == ((32, 48) if orientation >= 5 else (48, 32))
    for corner in ("tl", "tr", "bl", "br"):
        expected = (255, 0, 0) if corner == RED_CORNER[orientation] else (0, 0, 255)
        assert_close(pixel(decoded, corner_xy(corner, decoded.image.size)), expected, 8)
    with Image.open(io.BytesIO(data)) as reference:  # same result as Pillow's own exif_transpose
        upright = ImageOps.exif_transpose(reference).convert("RGB")
    assert np.array_equal(np.asarray(decoded.image), np.asarray(upright))


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_exif_orientation_png_webp(fmt: str) -> None:
    decoded = decode_image(encode_image(corner_marked_image(48, 32), fmt, exif_orientation=6), LIMITS)
    assert decoded.source_size == (48, 32)
    assert decoded.image.size == (32, 48)
    assert pixel(decoded, corner_xy("tr", (32, 48))) == (255, 0, 0)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_exif_orientation_can_be_ignored(fmt: str) -> None:
    # apply_exif_orientation=False: the image as stored (SGLang's K3 path), red corner still top-left.
    data = encode_image(corner_marked_image(48, 32), fmt, exif_orientation=6)
    decoded = decode_image(data, dataclasses.replace(LIMITS, apply_exif_orientation=False))
    assert decoded.image.size == (48, 32)
    assert_close(pixel(decoded, corner_xy("tl", (48, 32))), (255, 0, 0), 8)


@pytest.mark.parametrize("value", [0, 9, 65535])
def test_exif_orientation_out_of_range_is_ignored(value: int) -> None:
    decoded = decode_image(encode_image(corner_marked_image(48, 32), "JPEG", exif_orientation=value), LIMITS)
    assert decoded.image.size == (48, 32)
    assert_close(pixel(decoded, (4, 4)), (255, 0, 0), 8)


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")
def test_broken_exif_block_decodes_without_rotation() -> None:
    garbage = b"Exif\x00\x00MM\x00\x2a\xff\xff\xff\xf0" + bytes(range(256)) * 4
    decoded = decode_image(encode_image(corner_marked_image(48, 32), "JPEG", exif=garbage), LIMITS)
    assert decoded.image.size == (48, 32)


def test_exif_parser_exception_is_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(self: Image.Image) -> None:
        raise SyntaxError("unreadable IFD")  # one of the errors Pillow's own JPEG opener tolerates

    monkeypatch.setattr(JpegImageFile, "getexif", explode)
    decoded = decode_image(encode_image(corner_marked_image(48, 32), "JPEG", exif_orientation=6), LIMITS)
    assert decoded.image.size == (48, 32)  # no transpose, no crash


@pytest.mark.parametrize("error", [RecursionError("IFD loop"), struct.error("short"), KeyError(1), ValueError()])
def test_read_orientation_survives_any_parser_error(error: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(self: Image.Image) -> None:
        raise error

    image = corner_marked_image(8, 8)
    monkeypatch.setattr(Image.Image, "getexif", explode)
    assert read_orientation(image) == 1


def test_read_orientation_ignores_odd_values() -> None:
    image = corner_marked_image(8, 8)
    for value, expected in [(6, 6), ("6", 1), (True, 1), ((6,), 1), (-1, 1)]:
        image.getexif()[0x0112] = value
        assert read_orientation(image) == expected


# ---------------------------------------------------------------------------------------------- animations


@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "PNG"])
def test_animation_uses_first_frame(fmt: str) -> None:
    data = make_animated_bytes([(255, 0, 0), (0, 255, 0), (0, 0, 255)], size=(16, 12), fmt=fmt)
    with Image.open(io.BytesIO(data)) as check:
        assert check.n_frames == 3
    decoded = decode_image(data, LIMITS)
    assert decoded.image.size == (16, 12)
    assert pixel(decoded, (8, 6)) == (255, 0, 0)


# ---------------------------------------------------------------------------------------------- refusals


def test_empty() -> None:
    assert reason_of(b"") == Reason.EMPTY


def test_too_large_comes_before_format() -> None:
    data = make_image_bytes(32, 32, "PNG")
    assert reason_of(data, MediaLimits(max_image_bytes=len(data) - 1)) == Reason.TOO_LARGE
    assert reason_of(random_bytes(200), MediaLimits(max_image_bytes=100)) == Reason.TOO_LARGE
    assert decode_image(data, MediaLimits(max_image_bytes=len(data))).image.size == (32, 32)


@pytest.mark.parametrize(
    "data",
    [
        make_image_bytes(8, 8, "TIFF"),
        make_image_bytes(8, 8, "PDF"),
        make_image_bytes(8, 8, "ICO"),
        b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>',
        random_bytes(1000),
    ],
    ids=["tiff", "pdf", "ico", "svg", "random"],
)
def test_unsupported_format(data: bytes) -> None:
    assert reason_of(data) == Reason.UNSUPPORTED_FORMAT


def test_format_not_on_allowlist() -> None:
    limits = MediaLimits(allowed_formats={"png"})
    assert reason_of(make_image_bytes(8, 8, "JPEG"), limits) == Reason.UNSUPPORTED_FORMAT
    assert decode_image(make_image_bytes(8, 8, "PNG"), limits).source_format == "png"


@pytest.mark.parametrize(
    ("data", "limits"),
    [
        (make_png(0, 10), LIMITS),
        (make_gif_header((0, 0), (0, 0)), LIMITS),
        (make_image_bytes(5, 20), MediaLimits(min_side=10)),
        (make_image_bytes(20, 5, "JPEG"), MediaLimits(min_side=10)),
    ],
)
def test_too_small(data: bytes, limits: MediaLimits) -> None:
    assert reason_of(data, limits) == Reason.TOO_SMALL


@pytest.mark.parametrize("fmt", FORMATS)
def test_aspect_ratio(fmt: str) -> None:
    assert reason_of(make_image_bytes(1, 1000, fmt)) == Reason.ASPECT_RATIO
    assert reason_of(make_image_bytes(1000, 1, fmt)) == Reason.ASPECT_RATIO
    assert decode_image(make_image_bytes(1, 200, fmt), LIMITS).image.size == (1, 200)  # equal to the limit: ok


@pytest.mark.parametrize("fmt", FORMATS)
def test_too_many_pixels_by_limit(fmt: str) -> None:
    data = make_image_bytes(40, 30, fmt)
    assert reason_of(data, MediaLimits(max_pixels=40 * 30 - 1)) == Reason.TOO_MANY_PIXELS
    assert decode_image(data, MediaLimits(max_pixels=40 * 30)).image.size == (40, 30)


def test_png_ihdr_claiming_100000_squared() -> None:
    assert reason_of(make_png(100_000, 100_000)) == Reason.TOO_MANY_PIXELS


@pytest.mark.parametrize(
    "data",
    [
        make_gif_header((65535, 65535), (1, 1)),  # huge logical screen
        make_gif_header((10, 10), (9000, 9000)),  # small screen, huge first frame
        make_gif_header((10, 10), (10, 10), offset=(60000, 60000)),  # small frame far outside the screen
        make_webp_vp8x_header(9000, 9000),  # libwebp would allocate this canvas on open
        make_webp_vp8x_header(16384, 16384),
        make_png(10_000, 10_000),  # between Pillow's warning and error thresholds
    ],
    ids=["gif-screen", "gif-frame", "gif-offset", "webp-9000", "webp-16384", "png-1e8"],
)
def test_bombs_refused_before_pillow_opens_them(data: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("Image.open called for an image the header check must refuse")

    monkeypatch.setattr(Image, "open", forbidden)
    assert reason_of(data) == Reason.TOO_MANY_PIXELS


def test_png_bomb_refused_without_decoding() -> None:
    bomb = make_png_bomb(50_000, 50_000)  # 2.5 Gpixel 1-bit: 2.5 GB once decoded, 0.3 MB on the wire
    assert len(bomb) < 1_000_000
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    try:
        assert reason_of(bomb) == Reason.TOO_MANY_PIXELS
        _, python_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    rss_growth_bytes = rss_growth if sys.platform == "darwin" else rss_growth * 1024
    assert python_peak < 8 * 1024 * 1024
    assert rss_growth_bytes < 64 * 1024 * 1024  # Pillow's C raster would be 2.5 GB


def test_over_limit_png_never_reaches_the_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    loads = []
    real_load = ImageFile.ImageFile.load

    def spy(self: ImageFile.ImageFile) -> object:
        loads.append(self.size)
        return real_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    assert reason_of(make_png_bomb(9000, 9000)) == Reason.TOO_MANY_PIXELS  # 81 Mpx: under Pillow's own guard
    assert loads == []
    decode_image(make_image_bytes(8, 8), LIMITS)
    assert loads and set(loads) == {(8, 8)}


def test_pillow_bomb_guard_maps_to_too_many_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    data = make_image_bytes(40, 40, "JPEG")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # an operator's stricter global setting is honoured
    assert reason_of(data) == Reason.TOO_MANY_PIXELS
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 700)  # 1600 > 2 * 700: Pillow raises DecompressionBombError
    assert reason_of(data) == Reason.TOO_MANY_PIXELS
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning, raised as an error, maps the same way
        assert reason_of(data) == Reason.TOO_MANY_PIXELS


def test_peek_size_matches_pillow() -> None:
    for fmt in FORMATS:
        data = make_image_bytes(37, 23, fmt)
        assert peek_size(fmt.lower(), data) == (37, 23), fmt
    for data in (
        encode_image(solid_image(37, 23, (1, 2, 3)), "WEBP", lossless=False),
        make_animated_bytes([(0, 0, 0)] * 2, (37, 23), "WEBP"),
    ):
        assert peek_size("webp", data) == (37, 23)
    top_down = encode_image(solid_image(37, 23, (1, 2, 3)), "BMP")
    top_down = top_down[:22] + (-23).to_bytes(4, "little", signed=True) + top_down[26:]
    assert peek_size("bmp", top_down) == (37, 23)


# ---------------------------------------------------------------------------------------------- truncated / undecodable


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncation_anywhere_is_truncated(fmt: str) -> None:
    """Every prefix that still carries the magic bytes is TRUNCATED, or decodes when the raster is complete."""
    data = make_image_bytes(24, 16, fmt, seed=2)
    magic = {"JPEG": 3, "PNG": 8, "WEBP": 12, "GIF": 6, "BMP": 2}[fmt]
    for cut in range(magic, len(data), max(1, len(data) // 150)):
        try:
            decode_image(data[:cut], LIMITS)
        except InvalidMediaError as exc:
            assert exc.reason == Reason.TRUNCATED, (fmt, cut, str(exc))


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_half(fmt: str) -> None:
    data = make_image_bytes(64, 64, fmt)
    assert reason_of(data[: len(data) // 2]) == Reason.TRUNCATED


def test_undecodable_png_bad_crc() -> None:
    data = make_png(8, 8, crc_ok=False)  # complete container, corrupt header chunk
    exc = pytest.raises(InvalidMediaError, decode_image, data, LIMITS).value
    assert exc.reason == Reason.UNDECODABLE
    assert str(exc) == "request: PNG data could not be decoded [undecodable]"  # fixed text, no raw bytes


def test_undecodable_png_bad_idat() -> None:
    assert reason_of(make_png(8, 8, idat=b"definitely not zlib")) == Reason.UNDECODABLE


def test_undecodable_jpeg_garbage_between_soi_and_eoi() -> None:
    assert reason_of(b"\xff\xd8\xff" + random_bytes(500) + b"\xff\xd9") == Reason.UNDECODABLE


def test_undecodable_webp_with_unknown_first_chunk() -> None:
    body = b"WEBP" + b"ABCD" + (8).to_bytes(4, "little") + bytes(8)
    assert reason_of(b"RIFF" + len(body).to_bytes(4, "little") + body) == Reason.UNDECODABLE


def test_index_is_set_by_caller() -> None:
    try:
        decode_image(b"", LIMITS)
    except InvalidMediaError as exc:
        moved = exc.at_index(3)
    assert (moved.index, moved.reason, moved.http_status) == (3, "empty", 400)
    assert isinstance(moved, ValueError)


# ---------------------------------------------------------------------------------------------- robustness

_SEEDS = [make_image_bytes(12, 9, fmt, seed=5) for fmt in FORMATS] + [
    make_image_bytes(12, 9, "JPEG", exif_orientation=3),
    make_animated_bytes([(1, 2, 3), (4, 5, 6)], (12, 9), "GIF"),
]
_MAGICS = [b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"RIFF\x00\x01\x00\x00WEBP", b"BM"]
_SMALL = MediaLimits(max_pixels=1_000_000)


@st.composite
def hostile_bytes(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["random", "magic", "mutated", "cut"]))
    if kind == "random":
        return draw(st.binary(max_size=512))
    if kind == "magic":
        return draw(st.sampled_from(_MAGICS)) + draw(st.binary(max_size=512))
    data = bytearray(draw(st.sampled_from(_SEEDS)))
    if kind == "cut":
        return bytes(data[: draw(st.integers(0, len(data)))])
    for _ in range(draw(st.integers(1, 8))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_bytes())
def test_only_rgb_images_or_invalid_media_errors(data: bytes) -> None:
    try:
        decoded = decode_image(data, _SMALL)
    except InvalidMediaError as exc:
        assert exc.index == -1 and exc.reason in {r.value for r in Reason}
        return
    assert decoded.image.mode == "RGB"
    assert decoded.image.width * decoded.image.height <= _SMALL.max_pixels


def test_concurrent_decodes_agree() -> None:
    inputs = [
        make_image_bytes(40, 30, fmt, seed=i, exif_orientation=6 if fmt == "JPEG" else None)
        for i, fmt in enumerate(FORMATS)
    ]
    expected = [np.asarray(decode_image(data, LIMITS).image) for data in inputs]
    barrier = threading.Barrier(4)

    def work(worker: int) -> bool:
        barrier.wait()
        return all(
            np.array_equal(np.asarray(decode_image(inputs[i % 5], LIMITS).image), expected[i % 5])
            for i in range(worker, worker + 25)
        )

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(4)))
