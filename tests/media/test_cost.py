"""Work multipliers counted from the bytes before decoding (mmproc/media/cost.py) and the JPEG marker walk."""

from __future__ import annotations

import pytest

from mmproc.errors import ConfigError, InvalidMediaError
from mmproc.media import MediaLimits, decode_image
from mmproc.media.cost import check_cost
from mmproc.media.formats import JPEG, JPEG_SOS, jpeg_segments, peek_size
from service.app.configs import decode_config, media_limits
from service.pipeline.decode.worker import DecodeBudget
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
from tests.support.media_samples import encode_image, make_image_bytes, random_image
from tests.support.server import test_settings

LIMITS = MediaLimits()


def scans(data: bytes) -> int:
    return sum(marker == JPEG_SOS for marker, _, _ in jpeg_segments(data))


def reason(data: bytes, limits: MediaLimits = LIMITS) -> str:
    try:
        decode_image(data, limits)
    except InvalidMediaError as exc:
        return exc.reason
    return "ok"


def test_scans_are_counted_through_stuffing_and_restart_markers() -> None:
    noise = random_image(256, 192, seed=1)  # noise: plenty of 0xFF bytes stuffed in the entropy-coded data
    assert scans(encode_image(noise, "JPEG", quality=95)) == 1
    assert scans(encode_image(noise, "JPEG", quality=95, progressive=True)) == 10  # libjpeg's colour script
    assert scans(encode_image(noise.convert("L"), "JPEG", progressive=True)) == 6
    restarts = encode_image(noise, "JPEG", quality=95, restart_marker_blocks=1)
    assert restarts.count(b"\xff\xd0") > 10 and scans(restarts) == 1
    assert scans(jpeg_scan_bomb(1024, 1024, 321)) == 321


def test_scan_limit_is_inclusive_and_configurable() -> None:
    passes = MediaLimits(max_jpeg_passes=1000)
    assert reason(jpeg_scan_bomb(1024, 1024, 100), passes) == "ok"
    assert reason(jpeg_scan_bomb(1024, 1024, 101), passes) == "too_many_scans"
    progressive = encode_image(random_image(64, 48, seed=2), "JPEG", progressive=True)
    assert reason(progressive, MediaLimits(max_jpeg_scans=10)) == "ok"
    assert reason(progressive, MediaLimits(max_jpeg_scans=9)) == "too_many_scans"


def test_chunk_limit_covers_jpeg_png_and_gif() -> None:
    limits = MediaLimits(max_chunks=1000)
    for build in (jpeg_many_segments, png_many_chunks, gif_many_blocks):
        assert reason(build(900), limits) == "ok", build.__name__
        assert reason(build(1100), limits) == "too_many_chunks", build.__name__
    assert reason(png_many_chunks(1100, b"tEXt"), limits) == "too_many_chunks"
    assert reason(png_many_chunks(70_000)) == "too_many_chunks"  # the default, 65,536


def test_real_files_are_far_from_the_chunk_limit() -> None:
    for fmt in ("JPEG", "PNG", "GIF"):
        check_cost(fmt.lower(), make_image_bytes(1024, 768, fmt, seed=3), MediaLimits(max_chunks=64))


def test_rle_bmp_ratio() -> None:
    runs = b"\xff\x07\xff\x09\x00\x00" * 4 + b"\x00\x01"  # 510 pixels per row in two full runs: 78 px/byte
    assert reason(bmp_rle(510, 4, runs)) == "ok"
    assert reason(bmp_rle(510, 4, runs), MediaLimits(max_rle_ratio=70)) == "compression_ratio"
    assert reason(bmp_rle_eol_bomb(2000, 2000)) == "compression_ratio"  # 4 MP from 8 KB: 500 px/byte
    assert reason(bmp_rle_eol_bomb(2000, 2000, rle4=True)) == "compression_ratio"
    assert reason(bmp_rle_eol_bomb(200, 200)) == "ok"  # 50 px/byte: slow only in proportion to its size
    assert reason(make_image_bytes(300, 200, "BMP", mode="P")) == "ok"  # uncompressed: not an RLE question


def test_the_jpeg_peek_skips_junk_between_segments_like_libjpeg() -> None:
    data = jpeg_junk_after_app0(640, 480)
    assert peek_size(JPEG, data) == (640, 480)
    assert decode_image(data, LIMITS).image.size == (640, 480)
    real = make_image_bytes(64, 48, "JPEG")
    filled = real[:2] + b"\xff\xff\xff" + real[2:]  # fill bytes before a marker (T.81, B.1.1.2)
    assert peek_size(JPEG, filled) == (64, 48)
    assert peek_size(JPEG, real[:2] + b"\x00" * 1000) is None


def test_jpeg_scans_are_counted_by_the_blocks_they_pass_over() -> None:
    """100 interleaved DC scans of a 4:4:4 frame are 100 passes (issue 47: 188 M block decodes, 3.8 s at 40 MP):
    refused by max_jpeg_passes before the decoder runs, far under max_jpeg_scans."""
    assert reason(jpeg_dc_scan_bomb(512, 512, 16)) == "ok"
    assert reason(jpeg_dc_scan_bomb(512, 512, 17)) == "too_many_scans"
    assert reason(jpeg_dc_scan_bomb(512, 512, 17), MediaLimits(max_jpeg_passes=17)) == "ok"
    noise = random_image(256, 192, seed=1)
    for real in (  # libjpeg's progressions: 5.3 passes (colour), 6 (grey); baseline: 1
        encode_image(noise, "JPEG", progressive=True),
        encode_image(noise.convert("L"), "JPEG", progressive=True),
        encode_image(noise, "JPEG", quality=95),
    ):
        assert reason(real, MediaLimits(max_jpeg_passes=6)) == "ok"
    # One-component scans count that component's blocks alone: 1 AC scan of a grey 1024^2 is one pass.
    assert reason(jpeg_scan_bomb(1024, 1024, 16)) == "ok" and reason(jpeg_scan_bomb(1024, 1024, 17)) == "too_many_scans"


def test_png_inflated_metadata_is_bounded() -> None:
    """One iCCP (the spec's rule; Pillow inflates each, outside its text-memory cap), and at most 64 MiB that
    Pillow would inflate from iCCP, zTXt and iTXt in all."""
    assert reason(png_inflated_metadata(1)) == "ok"
    assert reason(png_inflated_metadata(2)) == "too_many_chunks"
    assert reason(png_inflated_metadata(30_000, inflated=1 << 10)) == "too_many_chunks"
    assert reason(png_inflated_metadata(60, b"zTXt")) == "ok"
    assert reason(png_inflated_metadata(70, b"zTXt")) == "compression_ratio"


def test_rle_rows_padded_by_end_of_line_count_as_work() -> None:
    """Within the pixels-per-byte ratio, rows cut short by end-of-line codes are padded one pixel at a time in
    Python: at 40 MP 2.4 s (issue 47: 2.9-4.3 s); over 4 M padded pixels is refused."""
    assert reason(bmp_rle_slow(6400, 6250)) == "compression_ratio"  # 246 px/byte, 20.9 M padded
    assert reason(bmp_rle_slow(1000, 400)) == "ok"  # 0.1 M padded
    full_rows = b"\xff\x07\xff\x09\x00\x00" * 4 + b"\x00\x01"  # rows coded to their end: nothing padded
    assert reason(bmp_rle(510, 4, full_rows)) == "ok"


@pytest.mark.parametrize("field", ["max_jpeg_scans", "max_jpeg_passes", "max_chunks", "max_rle_ratio"])
def test_limits_are_validated(field: str) -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match=field):
            MediaLimits(**{field: bad})


def test_settings_flow_to_the_limits_and_the_budget() -> None:
    settings = test_settings(
        max_jpeg_scans=7, max_chunks=99, max_rle_ratio=33, decode_budget_base_s=0.3, decode_budget_per_mp_s=0.1
    )
    limits = media_limits(settings)
    assert (limits.max_jpeg_scans, limits.max_chunks, limits.max_rle_ratio) == (7, 99, 33)
    budget = decode_config(settings).budget
    assert budget.seconds(0) == pytest.approx(0.3) and budget.seconds(10_000_000) == pytest.approx(1.3)
    default = decode_config(test_settings()).budget
    assert default == DecodeBudget(0.5, 0.2, 30.0)
    assert default.seconds(40_000_000) == pytest.approx(8.5) and default.seconds(10**12) == 30.0
    assert default.for_image(make_image_bytes(2000, 1000, "PNG")) == pytest.approx(0.9)
    assert default.for_image(b"not an image") == pytest.approx(0.5)
