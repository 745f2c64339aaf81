"""Which JPEGs the GPU path takes (mmproc/media/gpu_jpeg.py), checked on the CPU: the kinds nvJPEG decodes as
libjpeg does go to the GPU, every other image to the CPU path, and a refusal before decoding is the CPU path's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mmproc.errors import InvalidMediaError
from mmproc.media import MediaLimits, decode_image
from mmproc.media.gpu_jpeg import GpuJpeg, gpu_jpeg, orient
from mmproc.media.orientation import apply_orientation
from tests.support.corpus import build_corpus
from tests.support.media_samples import encode_image, make_image_bytes, random_image

LIMITS = MediaLimits()


def _adobe_rgb(jpeg: bytes) -> bytes:
    """`jpeg` with an Adobe APP14 segment saying its three components are RGB, not YCbCr (transform 0)."""
    app14 = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"
    return jpeg[:2] + app14 + jpeg[2:]


def _sampling(jpeg: bytes, luma: int) -> bytes:
    """`jpeg` (4:4:4) with Y's sampling byte in its SOF0 set to `luma` (h << 4 | v): a sampling not checked on GPU."""
    sof = jpeg.index(b"\xff\xc0")
    at = sof + 4 + 6 + 1  # marker, length, precision + size + count, then Y's id: its sampling byte follows
    return jpeg[:at] + bytes([luma]) + jpeg[at + 1 :]


def _garbled(jpeg: bytes) -> bytes:
    """`jpeg` with FF 03 (a reserved marker: libjpeg stops, nvJPEG decodes on) in the middle of its scan data."""
    middle = jpeg.index(b"\xff\xda") + (len(jpeg) - jpeg.index(b"\xff\xda")) // 2
    return jpeg[:middle] + b"\xff\x03" + jpeg[middle:]


def _two_frames(jpeg: bytes) -> bytes:
    """`jpeg` with its SOF0 segment repeated."""
    sof = jpeg.index(b"\xff\xc0")
    length = int.from_bytes(jpeg[sof + 2 : sof + 4], "big")
    return jpeg[: sof + 2 + length] + jpeg[sof : sof + 2 + length] + jpeg[sof + 2 + length :]


@pytest.mark.parametrize(
    "name, data",
    [
        ("4:2:0", make_image_bytes(333, 517, "JPEG", quality=90)),
        ("4:4:4", make_image_bytes(333, 517, "JPEG", quality=90, subsampling=0)),
        ("4:2:2", make_image_bytes(333, 517, "JPEG", quality=90, subsampling=1)),
        ("progressive", make_image_bytes(300, 200, "JPEG", progressive=True)),
        ("grey", make_image_bytes(300, 200, "JPEG", mode="L")),
        ("restart markers", make_image_bytes(300, 200, "JPEG", restart_marker_blocks=4)),
    ],
)
def test_jpegs_nvjpeg_decodes_as_libjpeg_go_to_the_gpu(name, data) -> None:
    facts = gpu_jpeg(data, LIMITS)
    assert facts == GpuJpeg(decode_image(data, LIMITS).image.size, 1), name


@pytest.mark.parametrize(
    "name, data",
    [
        ("cmyk", make_image_bytes(64, 64, "JPEG", mode="CMYK")),
        ("adobe rgb", _adobe_rgb(make_image_bytes(64, 64, "JPEG"))),
        ("4:4:0", _sampling(make_image_bytes(64, 64, "JPEG", subsampling=0), 0x12)),
        ("no EOI", make_image_bytes(64, 64, "JPEG")[:-2]),
        ("unknown marker in the scan", _garbled(make_image_bytes(64, 64, "JPEG"))),
        ("two frames", _two_frames(make_image_bytes(64, 64, "JPEG"))),
        ("png", make_image_bytes(64, 64, "PNG")),
        ("webp", make_image_bytes(64, 64, "WEBP")),
    ],
)
def test_other_images_take_the_cpu_path(name, data) -> None:
    assert gpu_jpeg(data, LIMITS) is None, name


def test_exif_orientation_is_read_and_can_be_turned_off() -> None:
    data = encode_image(random_image(40, 24), "JPEG", exif_orientation=6)
    assert gpu_jpeg(data, LIMITS) == GpuJpeg((40, 24), 6)
    assert gpu_jpeg(data, MediaLimits(apply_exif_orientation=False)) == GpuJpeg((40, 24), 1)


def test_refusals_before_decoding_are_the_cpu_paths() -> None:
    """Every corpus case the CPU path refuses before decoding is refused by the gate with the same reason; the
    gate never lets through what the CPU path refuses on its header."""
    checked = 0
    for case in build_corpus():
        try:
            decode_image(case.data, LIMITS)
            cpu = "ok"
        except InvalidMediaError as exc:
            cpu = exc.reason
        try:
            gated = gpu_jpeg(case.data, LIMITS)
        except InvalidMediaError as exc:
            assert exc.reason == cpu, case.name  # a refusal on the header: the same one
            checked += 1
            continue
        if gated is not None:  # sent to the GPU: the CPU path decodes it or refuses it only while decoding
            assert cpu in ("ok", "truncated", "undecodable"), (case.name, cpu)
    assert checked > 20


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_matches_the_cpu_transposes(orientation) -> None:
    pixels = np.random.default_rng(orientation).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    want = np.asarray(apply_orientation(Image.fromarray(pixels), orientation))
    assert np.array_equal(orient(torch.from_numpy(pixels), orientation).numpy(), want)
