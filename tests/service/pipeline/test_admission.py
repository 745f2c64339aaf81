"""The request patch budget, checked from image headers before any decoding (service/pipeline/admission.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmproc.client import EncoderClient
from mmproc.errors import InvalidMediaError
from mmproc.preprocess import PreprocessConfig, target_grid
from service.pipeline.admission import check_patch_budget, header_patches
from service.pipeline.decode.worker import prepare_image
from tests.support.media_samples import make_image_bytes, make_png
from tests.support.server import ServiceThread, serving, test_settings

CONFIGS = [PreprocessConfig.kimi_vl(), PreprocessConfig.kimi_k25()]


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.family)
def test_header_estimate_equals_the_decoded_grid(fmt: str, config: PreprocessConfig) -> None:
    for width, height in [(448, 448), (97, 333), (1000, 30), (30, 1000)]:
        data = make_image_bytes(width, height, fmt, seed=1)
        assert header_patches(data, config) == prepare_image(data, _limits(), config).image.num_patches


def test_exif_rotation_never_makes_the_estimate_exceed_the_truth() -> None:
    config = CONFIGS[0]
    for orientation in range(1, 9):
        data = make_image_bytes(900, 200, "JPEG", exif_orientation=orientation)
        assert header_patches(data, config) <= prepare_image(data, _limits(), config).image.num_patches


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 20_000), st.integers(1, 20_000), st.sampled_from(CONFIGS))
def test_patch_count_does_not_depend_on_orientation(width: int, height: int, config: PreprocessConfig) -> None:
    """Why min() over both orientations is exact for the released rules (square merge kernels)."""
    try:
        gh, gw = target_grid(width, height, config)
    except InvalidMediaError:
        return
    th, tw = target_grid(height, width, config)
    assert gh * gw == th * tw


@pytest.mark.parametrize("data", [b"", b"junk", b"\x89PNG\r\n\x1a\n", make_png(0, 5), make_png(100000, 1)])
def test_unreadable_or_refused_headers_count_zero(data: bytes) -> None:
    assert header_patches(data, CONFIGS[0]) == 0


def test_budget_is_checked_cumulatively() -> None:
    image = make_image_bytes(448, 448, "PNG")  # 32 x 32 = 1024 patches
    check_patch_budget([image, image], CONFIGS[0], 2048)
    with pytest.raises(InvalidMediaError) as info:
        check_patch_budget([image, image, image], CONFIGS[0], 2048)
    assert info.value.reason == "too_many_patches" and info.value.index == -1


@pytest.fixture(scope="module")
def budget_server() -> Iterator[ServiceThread]:
    with serving(test_settings(max_patches_per_request=5000)) as server:
        yield server


def test_server_refuses_from_headers_before_decoding(budget_server: ServiceThread) -> None:
    """The second image's header claims 4000x3000 over a few bytes of data: decoding it would say
    'truncated', so TOO_MANY_PATCHES proves that the budget was checked first."""
    images = [make_image_bytes(448, 448, "PNG"), make_png(4000, 3000)]
    with EncoderClient(budget_server.grpc_target) as client:
        with pytest.raises(InvalidMediaError) as info:
            client.encode_images(images)
        assert (info.value.reason, info.value.index) == ("too_many_patches", -1)
        with pytest.raises(InvalidMediaError) as info:
            client.encode_images(images[1:])  # alone it is within budget: now it is decoded, and refused
        assert info.value.reason == "truncated"


def _limits():
    from mmproc.media import MediaLimits

    return MediaLimits()


@pytest.mark.parametrize("normalize", [True, False], ids=["float32", "bytes"])
def test_the_doors_pending_bytes_are_what_the_decode_holds(normalize: bool) -> None:
    """The door checks `max_pending_mb` against the headers before decoding: it must count a patch as the workers
    ship it (uint8 bytes where the encoder normalizes them, a CUDA model's default) or it refuses 4x too early."""
    import asyncio

    from mmproc.models import load_encoder
    from service.pipeline.config import PipelineConfig
    from service.pipeline.decode.config import DecodePoolConfig
    from service.pipeline.requests import RequestPipeline

    config = PipelineConfig(decode=DecodePoolConfig(isolation="thread", workers=1, normalize=normalize))
    pipeline = RequestPipeline(load_encoder(None, preset="tiny"), CONFIGS[0], config)
    try:
        data = make_image_bytes(448, 448, "PNG", seed=1)
        (prepared,) = asyncio.run(pipeline.decode.pool.prepare_all([data]))
        held = prepared.image.patches.nbytes
        assert pipeline.overload.config.bytes_per_patch * header_patches(data, CONFIGS[0]) == held
        assert held == prepared.image.num_patches * 3 * 14 * 14 * (4 if normalize else 1)
    finally:
        pipeline.close()
