"""mmproc.preprocess against independent re-implementations of the released Kimi-VL / K2.5 processors.

Token counts are checked against hard-coded values and against a plain re-implementation of the size
formulas written here; pixels are checked bit for bit against the reference pipelines (PIL resize, pad,
the references' own float arithmetic, patchify) re-written here without torchvision.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mmproc.errors import ConfigError, InvalidMediaError
from mmproc.preprocess import PreprocessConfig, load_preprocess_config, preprocess_image, target_grid

VL = PreprocessConfig.kimi_vl()
K25 = PreprocessConfig.kimi_k25()
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

KIMI_VL_JSON = {
    "image_processor_type": "KimiVLImageProcessor",
    "patch_size": 14,
    "pad_input": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "in_token_limit": 4096,
    "merge_kernel_size": [2, 2],
}
KIMI_K25_JSON = {
    "media_proc_cfg": {
        "in_patch_limit": 16384,
        "patch_size": 14,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_kernel_size": 2,
        "fixed_output_tokens": None,
        "patch_limit_on_one_side": 512,
        "in_patch_limit_each_frame": 4096,
        "in_patch_limit_video": None,
        "sample_fps": 2.0,
        "max_num_frames_each_video": None,
        "temporal_merge_kernel_size": 4,
        "timestamp_mode": "hh:mm:ss.fff",
    }
}


# -- independent size arithmetic (written from the reference formulas, not from mmproc) ------------------------


def vl_sizes(w: int, h: int, limit: int = 4096, p: int = 14, k: tuple[int, int] = (2, 2)) -> tuple[int, int, int, int]:
    """KimiVLImageProcessor.rescale with pad_input: (resized w, resized h, padded w, padded h)."""
    if (w // p) * (h // p) > limit:
        scale = math.sqrt(limit / ((w // p) * (h // p)))
        w, h = int(w * scale), int(h * scale)
    step_h, step_w = k[0] * p, k[1] * p
    return w, h, w + (step_w - w % step_w) % step_w, h + (step_h - h % step_h) % step_h


def k25_sizes(w: int, h: int, limit: int = 16384, side: int = 512, p: int = 14, m: int = 2) -> tuple[int, ...]:
    """media_utils.navit_resize_image: (resized w, resized h, padded w, padded h)."""
    s1 = math.sqrt(limit / (max(1.0, w // p) * max(1.0, h // p)))
    scale = min(1.0, s1, side * p / w, side * p / h)
    nw = min(max(1, int(w * scale)), side * p)
    nh = min(max(1, int(h * scale)), side * p)
    f = m * p
    return nw, nh, nw + (f - nw % f) % f, nh + (f - nh % f) % f


def vl_tokens(w: int, h: int) -> int | None:
    """Tokens under Kimi-VL-A3B's rules, None where the reference raises "Exceed pos emb"."""
    *_, pw, ph = vl_sizes(w, h)
    if pw // 14 >= 512 or ph // 14 >= 512:
        return None
    return (pw // 28) * (ph // 28)


def k25_tokens(w: int, h: int) -> int:
    *_, pw, ph = k25_sizes(w, h)
    return (pw // 28) * (ph // 28)


def tokens(grid: tuple[int, int], cfg: PreprocessConfig) -> int:
    kh, kw = cfg.merge_kernel_size
    return (grid[0] // kh) * (grid[1] // kw)


REQUIRED = {(448, 448): (256, 256), (1024, 1024): (1089, 1369), (1920, 1080): (1032, 2691)}
SIZES = [
    *REQUIRED,
    (1, 1),
    (14, 14),
    (27, 29),
    (28, 28),
    (4000, 100),
    (100, 4000),
    (4096, 4096),
    (8000, 8000),
    (10000, 400),  # K2.5: the one-side limit is the binding scale
    (400, 10000),
    (37, 53),
    (1001, 997),
    (640, 480),
    (7125, 125),  # the sliver that gives Kimi-VL more patches than in_token_limit
]


def noise_image(w: int, h: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed + w * 7919 + h)
    img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
    return img if mode == "RGB" else img.convert(mode)


# -- token counts -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", list(REQUIRED))
def test_required_token_counts(size: tuple[int, int]) -> None:
    vl, k25 = REQUIRED[size]
    assert tokens(target_grid(*size, VL), VL) == vl
    assert tokens(target_grid(*size, K25), K25) == k25
    # The independent implementation agrees with the hard-coded values too.
    assert (vl_tokens(*size), k25_tokens(*size)) == (vl, k25)


@pytest.mark.parametrize("size", SIZES)
def test_token_counts_match_independent_formulas(size: tuple[int, int]) -> None:
    w, h = size
    assert tokens(target_grid(w, h, VL), VL) == vl_tokens(w, h)
    assert tokens(target_grid(w, h, K25), K25) == k25_tokens(w, h)
    *_, pw, ph = k25_sizes(w, h)
    assert target_grid(w, h, K25) == (ph // 14, pw // 14)


def test_k25_one_side_limit_binds() -> None:
    gh, gw = target_grid(10000, 400, K25)
    assert gw == 512 and gh * gw <= K25.in_patch_limit  # 10000 px wide -> 7168 px = 512 patches
    assert target_grid(8000, 8000, K25) == (130, 130)


@pytest.mark.parametrize("size", [s for s in SIZES if s[0] * s[1] <= 4_000_000])
@pytest.mark.parametrize("cfg", [VL, K25], ids=["kimi_vl", "kimi_k25"])
def test_target_grid_agrees_with_pixels(size: tuple[int, int], cfg: PreprocessConfig) -> None:
    out = preprocess_image(noise_image(*size), cfg)
    assert out.grid_hw == target_grid(*size, cfg)
    assert all(isinstance(x, int) for x in out.grid_hw)
    assert out.num_tokens == tokens(out.grid_hw, cfg)
    assert out.patches.shape == (out.grid_hw[0] * out.grid_hw[1], 3, 14, 14)


def test_kimi_vl_refuses_grids_beyond_the_position_embedding() -> None:
    # 8000x100: 571 x 7 whole patches <= 4096, so no resize; padded width = 572 patches >= 512.
    assert vl_tokens(8000, 100) is None
    with pytest.raises(InvalidMediaError) as e:
        target_grid(8000, 100, VL)
    assert e.value.reason == "aspect_ratio" and e.value.http_status == 400
    with pytest.raises(InvalidMediaError):
        preprocess_image(noise_image(100, 8000), VL)
    # Largest width that still fits: 7140 px = 510 patches after padding.
    assert target_grid(7140, 100, VL)[1] == 510
    # K2.5 shrinks the same image instead of refusing it.
    assert target_grid(8000, 100, K25)[1] == 512


@pytest.mark.parametrize("size", [(0, 10), (10, 0), (-3, 5)])
def test_target_grid_refuses_empty_sizes(size: tuple[int, int]) -> None:
    with pytest.raises(InvalidMediaError) as e:
        target_grid(*size, VL)
    assert e.value.reason == "too_small"


# -- pixels ------------------------------------------------------------------------------------------------------


def reference_kimi_vl(image: Image.Image, cfg: PreprocessConfig) -> tuple[torch.Tensor, tuple[int, int]]:
    """KimiVLImageProcessor (pad_input) step by step, torchvision calls spelled out."""
    p, (kh, kw) = cfg.patch_size, cfg.merge_kernel_size
    w, h = image.size
    if (w // p) * (h // p) > cfg.in_token_limit:
        scale = math.sqrt(cfg.in_token_limit / ((w // p) * (h // p)))
        image = image.resize((int(w * scale), int(h * scale)), Image.BICUBIC)
    w, h = image.size
    pad_h, pad_w = (kh * p - h % (kh * p)) % (kh * p), (kw * p - w % (kw * p)) % (kw * p)
    canvas = Image.new(image.mode, (w + pad_w, h + pad_h), 0)  # TF.pad(image, (0, 0, pad_w, pad_h)), fill 0
    canvas.paste(image, (0, 0))
    x = torch.from_numpy(np.array(canvas.convert("RGB"), copy=True)).permute(2, 0, 1).contiguous()  # TF.to_tensor
    x = x.to(torch.float32).div(255)
    mean = torch.as_tensor(cfg.image_mean, dtype=torch.float32).view(-1, 1, 1)  # TF.normalize
    std = torch.as_tensor(cfg.image_std, dtype=torch.float32).view(-1, 1, 1)
    x = x.sub_(mean).div_(std)
    c, hh, ww = x.shape
    patches = x.reshape(c, hh // p, p, ww // p, p).permute(1, 3, 0, 2, 4).contiguous().view(-1, c, p, p)
    return patches, (hh // p, ww // p)


def reference_kimi_k25(image: Image.Image, cfg: PreprocessConfig) -> tuple[torch.Tensor, tuple[int, int]]:
    """KimiK25VisionProcessor.preprocess for one image, media_utils numpy arithmetic spelled out."""
    p, m = cfg.patch_size, cfg.merge_kernel_size[0]
    image = image.convert("RGB")
    nw, nh, pw, ph = k25_sizes(*image.size, cfg.in_patch_limit, cfg.patch_limit_on_one_side, p, m)
    arr = np.asarray(image.resize((nw, nh), resample=Image.Resampling.BICUBIC))
    arr = np.pad(arr, ((0, ph - nh), (0, pw - nw), (0, 0)), mode="constant", constant_values=0)
    x = np.expand_dims(arr, axis=0)
    x = (x / 255.0).astype(np.float32)
    x -= np.array(cfg.image_mean)
    x *= 1.0 / np.array(cfg.image_std)
    t, hh, ww, c = x.shape
    patches = x.reshape(t, hh // p, p, ww // p, p, c).transpose(0, 1, 3, 5, 2, 4).reshape(-1, c, p, p)
    return torch.from_numpy(np.ascontiguousarray(patches)), (hh // p, ww // p)


def simple_normalized_chw(image: Image.Image, cfg: PreprocessConfig, sizes: tuple[int, ...]) -> np.ndarray:
    """The textbook formula: resize, np.pad, x / 255, (x - mean) / std, all float32 -> (3, H, W)."""
    nw, nh, pw, ph = sizes
    arr = np.asarray(image.convert("RGB").resize((nw, nh), Image.BICUBIC))
    arr = np.pad(arr, ((0, ph - nh), (0, pw - nw), (0, 0)))
    x = arr.astype(np.float32) / np.float32(255)
    x = (x - np.asarray(cfg.image_mean, np.float32)) / np.asarray(cfg.image_std, np.float32)
    return x.transpose(2, 0, 1)


PIXEL_SIZES = [(37, 53), (1001, 997), (640, 480), (28, 28), (5, 300)]
CLIP_VL = dataclasses.replace(VL, image_mean=CLIP_MEAN, image_std=CLIP_STD)
CLIP_K25 = dataclasses.replace(K25, image_mean=CLIP_MEAN, image_std=CLIP_STD)
PIXEL_CONFIGS = {
    "kimi_vl": (VL, reference_kimi_vl),
    "kimi_k25": (K25, reference_kimi_k25),
    "kimi_vl_clip": (CLIP_VL, reference_kimi_vl),  # mean/std not exact in float32: exercises the arithmetic
    "kimi_k25_clip": (CLIP_K25, reference_kimi_k25),
    "kimi_vl_1024": (dataclasses.replace(VL, in_token_limit=1024), reference_kimi_vl),
}


@pytest.mark.parametrize("size", PIXEL_SIZES)
@pytest.mark.parametrize("name", list(PIXEL_CONFIGS))
def test_patches_equal_the_reference_bit_for_bit(name: str, size: tuple[int, int]) -> None:
    cfg, reference = PIXEL_CONFIGS[name]
    image = noise_image(*size)
    out = preprocess_image(image, cfg)
    expected, grid = reference(image, cfg)
    assert out.grid_hw == grid
    assert out.patches.dtype == torch.float32 and out.patches.device.type == "cpu"
    assert out.patches.is_contiguous()
    assert out.patches.shape == (grid[0] * grid[1], 3, cfg.patch_size, cfg.patch_size)
    assert torch.equal(out.patches, expected)


@pytest.mark.parametrize("size", [(37, 53), (1001, 997)])
@pytest.mark.parametrize("cfg", [VL, K25, CLIP_K25], ids=["kimi_vl", "kimi_k25", "kimi_k25_clip"])
def test_patches_follow_the_textbook_formula_and_layout(cfg: PreprocessConfig, size: tuple[int, int]) -> None:
    image = noise_image(*size, seed=1)
    if cfg.family == "kimi_vl":
        sizes = vl_sizes(*size, cfg.in_token_limit)
    else:
        sizes = k25_sizes(*size, cfg.in_patch_limit, cfg.patch_limit_on_one_side)
    chw = simple_normalized_chw(image, cfg, sizes)
    out = preprocess_image(image, cfg)
    gh, gw = out.grid_hw
    p = cfg.patch_size
    assert chw.shape == (3, gh * p, gw * p)
    for i in sorted({0, 1, gw - 1, gw, gh * gw // 2, gh * gw - 1}):  # naive extraction, row-major patch order
        r, c = divmod(i, gw)
        naive = torch.from_numpy(np.ascontiguousarray(chw[:, r * p : (r + 1) * p, c * p : (c + 1) * p]))
        torch.testing.assert_close(out.patches[i], naive, atol=1e-6, rtol=0)


@pytest.mark.parametrize("cfg", [VL, K25, CLIP_K25], ids=["kimi_vl", "kimi_k25", "kimi_k25_clip"])
def test_padding_is_normalized_black(cfg: PreprocessConfig) -> None:
    w, h = 37, 53  # no resize; padded to 56 x 56: 19 columns and 3 rows of padding
    out = preprocess_image(Image.new("RGB", (w, h), (255, 255, 255)), cfg)
    p = cfg.patch_size
    gh, gw = out.grid_hw
    assert (gh, gw) == (4, 4)
    image = out.patches.view(gh, gw, 3, p, p).permute(2, 0, 3, 1, 4).reshape(3, gh * p, gw * p)
    black = (0.0 - torch.tensor(cfg.image_mean)) / torch.tensor(cfg.image_std)
    white = (1.0 - torch.tensor(cfg.image_mean)) / torch.tensor(cfg.image_std)
    for c in range(3):
        torch.testing.assert_close(
            image[c, h:, :], torch.full((gh * p - h, gw * p), black[c].item()), atol=1e-6, rtol=0
        )
        torch.testing.assert_close(image[c, :h, w:], torch.full((h, gw * p - w), black[c].item()), atol=1e-6, rtol=0)
        torch.testing.assert_close(image[c, :h, :w], torch.full((h, w), white[c].item()), atol=1e-6, rtol=0)


@pytest.mark.parametrize("cfg", [VL, K25], ids=["kimi_vl", "kimi_k25"])
@pytest.mark.parametrize("mode", ["L", "RGBA"])
def test_non_rgb_input_is_converted(cfg: PreprocessConfig, mode: str) -> None:
    image = noise_image(300, 200, mode=mode)
    out = preprocess_image(image, cfg)
    expected = preprocess_image(image.convert("RGB"), cfg)
    assert out.grid_hw == expected.grid_hw
    assert torch.equal(out.patches, expected.patches)


def test_kimi_vl_without_padding_resizes_to_whole_kernels() -> None:
    cfg = dataclasses.replace(VL, pad_input=False)
    assert target_grid(1920, 1080, cfg) == (48, 84)  # 1196 x 672 -> 1176 x 672 pixels
    assert target_grid(10, 10, cfg) == (2, 2)  # never below one kernel
    out = preprocess_image(noise_image(1001, 997), cfg)
    assert out.grid_hw == target_grid(1001, 997, cfg) and out.grid_hw[0] % 2 == 0 and out.grid_hw[1] % 2 == 0
    nw, nh, _, _ = vl_sizes(1001, 997)  # 902 x 898 under the token limit ...
    fw, fh = nw - nw % 28, nh - nh % 28  # ... then one resize, from the original, to 896 x 896
    expected = torch.from_numpy(simple_normalized_chw(noise_image(1001, 997), cfg, (fw, fh, fw, fh)))
    gh, gw = out.grid_hw
    got = out.patches.view(gh, gw, 3, 14, 14).permute(2, 0, 3, 1, 4).reshape(3, gh * 14, gw * 14)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


# -- max_patches_per_image ----------------------------------------------------------------------------------------

BOUND_CONFIGS = {
    "kimi_vl": VL,
    "kimi_k25": K25,
    "kimi_vl_1024": dataclasses.replace(VL, in_token_limit=1024),
    "kimi_vl_nopad": dataclasses.replace(VL, pad_input=False),
    "kimi_vl_k1x3": dataclasses.replace(VL, merge_kernel_size=(1, 3), in_token_limit=2000),
    "kimi_k25_small": dataclasses.replace(K25, in_patch_limit=4096, patch_limit_on_one_side=128),
}

sides = st.one_of(st.integers(1, 64), st.integers(1, 4000), st.integers(1, 60000))


@settings(max_examples=400, deadline=None)
@given(w=sides, h=sides, name=st.sampled_from(list(BOUND_CONFIGS)))
def test_max_patches_bounds_every_accepted_image(w: int, h: int, name: str) -> None:
    cfg = BOUND_CONFIGS[name]
    try:
        gh, gw = target_grid(w, h, cfg)
    except InvalidMediaError:
        return
    assert gh * gw <= cfg.max_patches_per_image
    assert tokens((gh, gw), cfg) <= cfg.max_tokens_per_image


def worst_realized(cfg: PreprocessConfig, narrow: int = 40, long: int = 700) -> int:
    """Largest grid found over slivers: for whole-patch counts (a, b), the largest image with those counts."""
    p, best = cfg.patch_size, 0
    for a in range(narrow):
        for b in range(long):
            for w, h in (((a + 1) * p - 1, (b + 1) * p - 1), ((b + 1) * p - 1, (a + 1) * p - 1)):
                try:
                    gh, gw = target_grid(w, h, cfg)
                except InvalidMediaError:
                    continue
                best = max(best, gh * gw)
    return best


@pytest.mark.parametrize("name", ["kimi_vl", "kimi_k25", "kimi_vl_1024"])
def test_max_patches_is_a_tight_bound(name: str) -> None:
    cfg = BOUND_CONFIGS[name]
    worst = worst_realized(cfg)
    assert worst <= cfg.max_patches_per_image <= 1.05 * worst
    limit = cfg.in_token_limit if cfg.family == "kimi_vl" else cfg.in_patch_limit
    assert worst > limit  # padding slivers really do exceed the nominal limit


def test_max_patches_known_values() -> None:
    # Kimi-VL: a 7125x125 image is not resized (508 x 8 <= 4096 whole patches) and pads to 510 x 10.
    assert target_grid(7125, 125, VL) == (10, 510)
    assert VL.max_patches_per_image == 5496 and K25.max_patches_per_image == 17928
    assert K25.max_patches_per_image <= 512 * 512


# -- configuration ------------------------------------------------------------------------------------------------


def test_presets() -> None:
    assert (VL.family, VL.patch_size, VL.merge_kernel_size, VL.in_token_limit, VL.pad_input) == (
        "kimi_vl",
        14,
        (2, 2),
        4096,
        True,
    )
    assert VL.image_mean == (0.5, 0.5, 0.5) and VL.image_std == (0.5, 0.5, 0.5)
    assert (K25.family, K25.merge_kernel_size, K25.in_patch_limit, K25.patch_limit_on_one_side) == (
        "kimi_k25",
        (2, 2),
        16384,
        512,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        VL.patch_size = 16  # type: ignore[misc]


def test_from_dict_detects_the_family() -> None:
    assert PreprocessConfig.from_dict(KIMI_VL_JSON) == VL
    assert PreprocessConfig.from_dict(KIMI_K25_JSON) == K25
    auto = {"auto_map": {"AutoImageProcessor": "image_processing_kimi_vl.KimiVLImageProcessor"}, "pad_input": True}
    assert PreprocessConfig.from_dict(auto).family == "kimi_vl"


def test_kimi_vl_missing_keys_take_the_reference_class_defaults() -> None:
    cfg = PreprocessConfig.from_dict({"image_processor_type": "KimiVLImageProcessor"})
    assert cfg.pad_input is False and cfg.image_mean == CLIP_MEAN and cfg.image_std == CLIP_STD
    assert cfg.in_token_limit == 4096 and cfg.merge_kernel_size == (2, 2)


def test_k25_tolerates_a_list_kernel_and_missing_keys() -> None:
    cfg = PreprocessConfig.from_dict({"media_proc_cfg": {"merge_kernel_size": [2, 2], "in_patch_limit": 1024}})
    assert cfg.merge_kernel_size == (2, 2) and cfg.in_patch_limit == 1024 and cfg.patch_limit_on_one_side == 512


def test_load_honours_non_default_values(tmp_path: Path) -> None:
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**KIMI_VL_JSON, "in_token_limit": 1024}))
    cfg = load_preprocess_config(tmp_path)
    assert cfg.in_token_limit == 1024
    assert tokens(target_grid(1024, 1024, cfg), cfg) == 256  # 73 x 73 > 1024 -> 448 x 448 pixels
    out = preprocess_image(noise_image(1024, 1024), cfg)
    assert out.num_tokens == 256


def test_load_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="preprocessor_config.json") as e:
        load_preprocess_config(tmp_path)
    assert str(tmp_path) in str(e.value)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "cannot read JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14}), "unknown layout"),
        (json.dumps({"media_proc_cfg": {"fixed_output_tokens": 256}}), "fixed_output_tokens"),
        (json.dumps({"media_proc_cfg": {"patch_limit_on_one_side": 511}}), "patch_limit_on_one_side"),
        (json.dumps({"media_proc_cfg": {"merge_kernel_size": [2, 3]}}), "merge_kernel_size"),
        (json.dumps({"media_proc_cfg": []}), "media_proc_cfg"),
        (json.dumps({**KIMI_VL_JSON, "patch_size": "14"}), "patch_size"),
        (json.dumps({**KIMI_VL_JSON, "patch_size": 0}), "patch_size"),
        (json.dumps({**KIMI_VL_JSON, "in_token_limit": True}), "in_token_limit"),
        (json.dumps({**KIMI_VL_JSON, "image_std": [0.5, 0.0, 0.5]}), r"image_std\[1\]"),
        (json.dumps({**KIMI_VL_JSON, "image_mean": [0.5, 0.5]}), "image_mean"),
        (json.dumps({**KIMI_VL_JSON, "pad_input": "yes"}), "pad_input"),
        (json.dumps({**KIMI_VL_JSON, "merge_kernel_size": 2}), "merge_kernel_size"),
    ],
)
def test_load_bad_files_raise_config_error_naming_the_problem(tmp_path: Path, content: str, match: str) -> None:
    (tmp_path / "preprocessor_config.json").write_text(content)
    with pytest.raises(ConfigError, match=match) as e:
        load_preprocess_config(tmp_path)
    assert str(tmp_path) in str(e.value)


def test_constructor_validates_family_specific_fields() -> None:
    with pytest.raises(ConfigError, match="in_token_limit"):
        dataclasses.replace(VL, in_token_limit=None)
    with pytest.raises(ConfigError, match="family"):
        dataclasses.replace(VL, family="qwen")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Kimi-VL settings"):
        dataclasses.replace(K25, pad_input=True)


@pytest.mark.parametrize("cfg", [VL, K25], ids=["kimi_vl", "kimi_k25"])
def test_public_dict_is_plain_json(cfg: PreprocessConfig) -> None:
    public = cfg.to_public_dict()
    assert json.loads(json.dumps(public)) == public
    assert public["family"] == cfg.family and public["max_patches_per_image"] == cfg.max_patches_per_image
    assert public["merge_kernel_size"] == [2, 2]
