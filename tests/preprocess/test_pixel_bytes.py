"""Bytes left to the device (mmproc/preprocess `normalize=False`, for CUDA encoders): the uint8 patches, their
table and the device-side gather must give exactly the patches CPU preprocessing gives, through every family,
the packing, the decode workers' transfer and the encoder's forward."""

from __future__ import annotations

import asyncio
import dataclasses
import io

import pytest
import torch
from PIL import Image

from mmproc.batching import pack_images
from mmproc.media import MediaLimits
from mmproc.models.loader import encoder_from_checkpoint_tensors
from mmproc.preprocess import PreprocessConfig, preprocess_image
from mmproc.types import PreprocessedImage, apply_lut
from service.pipeline.decode.pool import DecodePool, DecodePoolConfig
from service.pipeline.decode.transfer import FILE_THRESHOLD
from tests.support.checkpoints import make_vision_tensors
from tests.support.media_samples import make_image_bytes, random_image
from tests.support.tiny_config import config_for

CONFIGS = {
    "kimi_vl": PreprocessConfig.kimi_vl(),
    "kimi_k25": PreprocessConfig.kimi_k25(),
    "kimi_k3": PreprocessConfig.kimi_k3(),  # transparent pixels onto a chessboard
}
SIZES = [(448, 448), (97, 333), (1500, 20), (31, 29)]  # square, odd (padding), resized, tiny


@pytest.mark.parametrize("family", sorted(CONFIGS))
@pytest.mark.parametrize("size", SIZES)
def test_bytes_normalize_to_the_cpu_patches_bit_for_bit(family, size):
    cfg = CONFIGS[family]
    image = random_image(*size, seed=size[0])
    want = preprocess_image(image, cfg)
    got = preprocess_image(image, cfg, normalize=False)
    assert got.patches.dtype == torch.uint8 and got.lut is not None and want.lut is None
    assert got.patches.nbytes * 4 == want.patches.nbytes  # a quarter of the bytes to hold and ship
    assert (got.grid_hw, got.num_tokens, got.image_size) == (want.grid_hw, want.num_tokens, want.image_size)
    assert torch.equal(got.normalized(), want.patches)


def test_transparent_k3_image_composites_before_the_bytes_leave():
    rgba = random_image(120, 90, mode="RGBA", seed=3)
    cfg = CONFIGS["kimi_k3"]
    assert torch.equal(preprocess_image(rgba, cfg, normalize=False).normalized(), preprocess_image(rgba, cfg).patches)


def bytes_images(cfg: PreprocessConfig, sizes=SIZES[:3]) -> list[PreprocessedImage]:
    return [preprocess_image(random_image(w, h, seed=w), cfg, normalize=False) for w, h in sizes]


def test_packing_keeps_bytes_and_one_table_or_normalizes_a_mixed_batch():
    cfg = CONFIGS["kimi_k25"]
    images = bytes_images(cfg)
    packed = pack_images(images, dtype=torch.bfloat16)
    assert packed.pixel_values.dtype == torch.uint8 and packed.lut is images[0].lut
    float_packed = pack_images([i.__class__(i.normalized(), i.grid_hw, i.num_tokens) for i in images])
    assert torch.equal(apply_lut(packed.pixel_values, packed.lut), float_packed.pixel_values)
    mixed = pack_images([images[0], preprocess_image(random_image(64, 64, seed=9), cfg)])  # one already normalized
    assert mixed.lut is None and mixed.pixel_values.dtype == torch.float32
    other = bytes_images(dataclasses.replace(cfg, image_mean=(0.4, 0.4, 0.4)), sizes=[(64, 64)])  # another table
    assert pack_images([images[0], *other]).lut is None


@torch.inference_mode()
@pytest.mark.parametrize("family", ["kimi_vl", "kimi_k25"])
def test_encoder_gives_the_same_embeddings_from_bytes(family):
    encoder = encoder_from_checkpoint_tensors(config_for(family), make_vision_tensors(family, seed=1))
    images = bytes_images(CONFIGS[family], sizes=[(112, 84), (56, 56), (30, 200)])
    from_bytes = pack_images(images)
    normalized = pack_images([i.__class__(i.normalized(), i.grid_hw, i.num_tokens) for i in images])
    assert from_bytes.lut is not None and normalized.lut is None
    assert torch.equal(encoder(from_bytes), encoder(normalized))


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_decode_workers_ship_bytes_and_table(isolation):
    cfg = CONFIGS["kimi_k25"]
    data = [make_image_bytes(700, 700, fmt="PNG", seed=1), make_image_bytes(30, 20, fmt="JPEG", seed=2)]
    pool = DecodePool(MediaLimits(), cfg, DecodePoolConfig(isolation=isolation, workers=1, normalize=False))
    pool.start()
    try:
        got = [p.image for p in asyncio.run(pool.prepare_all(data))]
    finally:
        pool.close()
    assert got[0].patches.nbytes >= FILE_THRESHOLD > got[1].patches.nbytes  # through a tmpfs file and the pipe
    for payload, image in zip(data, got):
        want = preprocess_image(Image.open(io.BytesIO(payload)).convert("RGB"), cfg)
        assert image.patches.dtype == torch.uint8 and torch.equal(image.normalized(), want.patches)


def test_cpu_preprocess_bench_reports_both_paths_against_the_decode(capsys):
    from mmproc.bench.cpu_preprocess import main

    assert main(["--sizes", "64x48", "--repeat", "1"]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert "decode ms" in header and "uint8 ms" in header
    fields = row.split()
    assert fields[0] == "64x48" and all(float(v) > 0 for v in fields[1:])
