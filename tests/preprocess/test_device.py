"""Preprocessing on torch tensors (mmproc/preprocess/device.py, resize.py): Pillow's BICUBIC bit for bit, and the
same patches as the CPU path for every family, on the CPU here and on a GPU where there is one."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image

from mmproc.preprocess import PreprocessConfig, preprocess_image
from mmproc.preprocess.device import preprocess_same_size, preprocess_tensor
from mmproc.preprocess.resize import pillow_bicubic

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def sizes(seed: int, count: int) -> list[tuple[int, int, int, int]]:
    """(w, h, W, H): shrinks and growths on each axis, one-axis resizes, tiny outputs, the vertical-first rule of
    Pillow 13 (height shrinking by more than twice the width's pixels) on both sides."""
    rng = random.Random(seed)
    out = [(3, 300, 224, 224), (300, 40, 290, 10), (200, 100, 190, 79), (64, 64, 1, 1), (1, 50, 30, 30)]
    while len(out) < count:
        w, h, W, H = rng.randint(1, 220), rng.randint(1, 220), rng.randint(1, 280), rng.randint(1, 280)
        out.append((w, w if rng.random() < 0.1 else h, W if rng.random() > 0.15 else w, H))
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_resize_is_pillows_bicubic_bit_for_bit(device) -> None:
    for i, (w, h, W, H) in enumerate(sizes(0, 120)):
        mode = "L" if i % 3 == 0 else "RGB"
        pixels = np.random.default_rng(i).integers(0, 256, (h, w, 3) if mode == "RGB" else (h, w), dtype=np.uint8)
        want = np.asarray(Image.fromarray(pixels, mode).resize((W, H), Image.Resampling.BICUBIC))
        src = torch.from_numpy(pixels if mode == "RGB" else pixels[..., None]).to(device)
        got = pillow_bicubic(src, (W, H)).cpu().numpy()
        assert np.array_equal(got if mode == "RGB" else got[..., 0], want), (w, h, W, H, mode)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["kimi_vl", "kimi_k25", "kimi_k3"])
def test_device_patches_equal_the_cpu_path(family, device) -> None:
    cfg = PreprocessConfig.default_for(family)
    rng = random.Random(1)
    for i in range(12):
        w, h = rng.randint(1, 1400), rng.randint(1, 1400)
        if i % 4 == 0:
            w, h = rng.randint(3000, 4200), rng.randint(50, 700)  # resized by the patch limits
        pixels = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
        want = preprocess_image(Image.fromarray(pixels), cfg)
        got = preprocess_tensor(torch.from_numpy(pixels).to(device), cfg)
        assert (got.grid_hw, got.num_tokens) == (want.grid_hw, want.num_tokens), (w, h)
        assert got.patches.device.type == device and torch.equal(got.patches.cpu(), want.patches), (w, h)


def test_bad_tensors_are_refused() -> None:
    with pytest.raises(ValueError, match="uint8"):
        preprocess_tensor(torch.zeros(4, 4, 3), PreprocessConfig.kimi_k25())
    with pytest.raises(ValueError, match="uint8"):
        pillow_bicubic(torch.zeros(4, 4, 3, dtype=torch.uint8), (0, 3))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["kimi_vl", "kimi_k25", "kimi_k3"])
def test_device_bytes_equal_the_cpu_paths_bytes(family, device) -> None:
    """normalize=False (GPU-decoded JPEGs): the uint8 patches and table the decode workers ship for a CUDA model."""
    cfg = PreprocessConfig.default_for(family)
    for i, (w, h) in enumerate([(333, 517), (1400, 90), (4000, 300), (28, 28)]):
        pixels = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
        want = preprocess_image(Image.fromarray(pixels), cfg, normalize=False)
        got = preprocess_tensor(torch.from_numpy(pixels).to(device), cfg, normalize=False)
        assert (got.grid_hw, got.num_tokens, got.image_size) == (want.grid_hw, want.num_tokens, (w, h))
        assert got.patches.dtype == torch.uint8 and got.patches.device.type == device
        assert torch.equal(got.patches.cpu(), want.patches) and torch.equal(got.lut, want.lut), (w, h)
        assert torch.equal(got.normalized().cpu(), want.normalized()), (w, h)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("normalize", [True, False])
def test_a_stack_of_same_size_images_gives_each_images_own_patches(device, normalize) -> None:
    """The GPU decoder preprocesses the same-size images of a batch together: image i's patches are its own."""
    cfg = PreprocessConfig.kimi_k25()
    for w, h in [(448, 448), (333, 517), (4000, 300)]:  # exact grid, padded, resized by the patch limits
        pixels = [np.random.default_rng(7 * i + w).integers(0, 256, (h, w, 3), dtype=np.uint8) for i in range(3)]
        got = preprocess_same_size([torch.from_numpy(p).to(device) for p in pixels], cfg, normalize)
        assert len(got) == 3
        for image, p in zip(got, pixels):
            want = preprocess_image(Image.fromarray(p), cfg, normalize=normalize)
            assert (image.grid_hw, image.num_tokens, image.image_size) == (want.grid_hw, want.num_tokens, (w, h))
            assert torch.equal(image.patches.cpu(), want.patches), (w, h, normalize)
    square = np.random.default_rng(3).integers(0, 256, (448, 448, 3), dtype=np.uint8)  # fills its grid: no padding
    rotated = torch.from_numpy(square).to(device).transpose(0, 1)  # a view, as `orient` gives an EXIF-rotated image
    (got,) = preprocess_same_size([rotated], cfg, normalize)
    want = preprocess_image(Image.fromarray(np.ascontiguousarray(square.transpose(1, 0, 2))), cfg, normalize=normalize)
    assert torch.equal(got.patches.cpu(), want.patches)
    with pytest.raises(ValueError, match="one size"):
        preprocess_same_size([torch.zeros(4, 4, 3, dtype=torch.uint8), torch.zeros(4, 5, 3, dtype=torch.uint8)], cfg)
