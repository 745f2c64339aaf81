"""The Qwen3-VL image rule on the CPU without transformers: smart_resize's arithmetic (ties to even), the settings
files (preprocessor_config.json, or nested in processor_config.json), normalization, alpha onto white, refusals.
The comparison with transformers itself: tests/acceptance/test_transformers_qwen3_vl.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from mmproc.errors import ConfigError, InvalidMediaError, Reason
from mmproc.preprocess import PreprocessConfig, load_preprocess_config, preprocess_image, target_grid
from mmproc.preprocess.qwen3_vl import smart_resize
from tests.support.qwen_checkpoint import PREPROCESSOR

CFG = PreprocessConfig.qwen3_vl()


@pytest.mark.parametrize(
    ("width", "height", "grid"),
    [
        (400, 260, (16, 24)),  # 12.5 * 32 rounds to 12 (even), 8.125 to 8
        (464, 336, (20, 28)),  # 14.5 -> 14, 10.5 -> 10: ties to even both ways
        (272, 208, (14, 20)),  # 8.5 -> 8, 6.5 -> 6, then under min_pixels: scaled up (ceil)
        (256, 256, (16, 16)),  # exactly min_pixels: as is
        (4096, 4096, (256, 256)),  # exactly max_pixels: as is
        (4097, 4097, (256, 256)),  # rounds back onto max_pixels
        (4200, 4200, (256, 256)),  # over: floor-scaled
        (1, 1, (16, 16)),  # scaled up to min_pixels
        (6400, 32, (2, 400)),  # aspect 200: accepted
    ],
)
def test_smart_resize_grids(width, height, grid):
    assert target_grid(width, height, CFG) == grid
    image = preprocess_image(Image.new("RGB", (width, height)), CFG) if width * height < 1 << 21 else None
    if image is not None:
        assert image.grid_hw == grid and image.num_tokens == grid[0] * grid[1] // 4
        assert image.patches.shape == (grid[0] * grid[1], 3, 16, 16)


def test_an_aspect_ratio_over_200_is_refused():
    with pytest.raises(InvalidMediaError) as err:
        target_grid(201, 1, CFG)
    assert err.value.reason == Reason.ASPECT_RATIO


def test_smart_resize_is_qwen2_vls_with_pythons_round():
    for height, width in ((48, 80), (80, 112), (1000, 700), (3000, 5000), (20, 3000)):
        h, w = smart_resize(height, width, 32, 65_536, 16_777_216)
        assert h % 32 == 0 and w % 32 == 0 and 65_536 <= h * w <= 16_777_216
    assert smart_resize(48, 80, 32, 1, 1 << 30) == (64, 64)  # round(1.5) = 2, round(2.5) = 2


def test_normalization_and_patch_order():
    rgb = np.zeros((256, 256, 3), dtype=np.uint8)
    rgb[:16, 16:32] = (255, 0, 51)  # patch (0, 1)
    out = preprocess_image(Image.fromarray(rgb), CFG)
    assert out.grid_hw == (16, 16) and out.patches.dtype == torch.float32
    patch = out.patches[1]  # row-major: the second patch of the first row
    assert torch.equal(patch[0], torch.ones(16, 16)) and torch.equal(patch[1], -torch.ones(16, 16))
    torch.testing.assert_close(patch[2], torch.full((16, 16), (51 - 127.5) / 127.5))
    assert torch.all(out.patches[0] == -1.0)
    raw = preprocess_image(Image.fromarray(rgb), CFG, normalize=False)  # bytes + the table the device applies
    assert raw.patches.dtype == torch.uint8
    for c in range(3):
        assert torch.equal(raw.lut[c][raw.patches[:, c].long()], out.patches[:, c])


def test_alpha_is_composited_onto_white():
    half = Image.new("RGBA", (256, 256), (0, 0, 0, 128))
    out = preprocess_image(half, CFG).patches
    value = (round(255 * 127 / 255) - 127.5) / 127.5  # Pillow's alpha_composite of black at 128/255 on white
    assert torch.allclose(out, torch.full_like(out, value), atol=1 / 127.5)


def test_settings_from_preprocessor_config_or_processor_config(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    assert load_preprocess_config(tmp_path / "a", "qwen3_vl") == CFG
    (tmp_path / "b").mkdir()
    nested = {"processor_class": "Qwen3VLProcessor", "image_processor": {**PREPROCESSOR, "min_pixels": 131_072}}
    (tmp_path / "b" / "processor_config.json").write_text(json.dumps(nested))
    cfg = load_preprocess_config(tmp_path / "b", "qwen3_vl")
    assert cfg.min_pixels == 131_072 and cfg.max_pixels == 16_777_216  # min_pixels overrides size, as in __init__
    assert cfg.to_public_dict()["max_tokens_per_image"] == 16_384


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"patch_size": None}, "patch_size"),
        ({"size": None}, "shortest_edge"),
        ({"resample": 2}, "resample"),
        ({"rescale_factor": 0.5}, "rescale_factor"),
        ({"merge_size": 0}, "merge_kernel_size"),
        ({"size": {"shortest_edge": 10, "longest_edge": 5}}, "min_pixels"),
    ],
)
def test_bad_settings_are_named(change, match):
    data = {k: v for k, v in {**PREPROCESSOR, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=match):
        PreprocessConfig.from_dict(data, "qwen3_vl")
