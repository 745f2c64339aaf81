"""Kimi K3 (MoonViT3d): config parsing with the K3 defaults, a random-weight checkpoint in the real key layout served
in float32 on the CPU, compared with an independent float64 pipeline (tests/support/reference_moonvit3d.py) that decodes,
resizes, composites transparent pixels, normalizes and encodes on its own."""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from mmproc.batching import pack_images
from mmproc.client import EncoderClient
from mmproc.errors import ConfigError
from mmproc.models import PRESETS, load_encoder, parse_config
from mmproc.preprocess import PreprocessConfig, load_preprocess_config, preprocess_image, target_grid
from tests.support.checkpoints import TINY_K3_VISION, hf_config, preprocessor_config, write_checkpoint
from tests.support.common import rel_err
from tests.support.media_samples import encode_image, make_image_bytes, random_image
from tests.support.reference_moonvit3d import ReferenceKimiK3, navit_size, preprocess
from tests.support.server import ServiceThread, test_settings

TEXT_HIDDEN = 256


def test_a_real_k3_config_parses_to_the_k3_tower() -> None:
    cfg = parse_config(hf_config("kimi_k3"))
    assert cfg.family == "kimi_k3"
    assert (cfg.hidden_size, cfg.qkv_width, cfg.num_heads, cfg.head_dim) == (128, 256, 2, 128)
    assert (cfg.norm, cfg.pos_emb_mode, cfg.projector, cfg.activation) == (
        "rmsnorm",
        "bilinear",
        "mlp_post_norm",
        "gelu_tanh",
    )
    assert not (cfg.attn_bias or cfg.mlp_bias or cfg.patch_embed_bias)
    assert cfg.text_hidden_size == TEXT_HIDDEN


def test_missing_keys_take_the_k3_defaults_not_k25s() -> None:
    cfg = parse_config({"model_type": "kimi_k3", "vision_config": {"model_type": "kimi_k3_vision"}})
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.qkv_width, cfg.intermediate_size) == (
        1024,
        27,
        12,
        1536,
        4096,
    )
    assert cfg.head_dim == 128 and cfg.text_hidden_size == 4096  # KimiK3Config's default text config
    assert cfg == dataclasses.replace(PRESETS["kimi-k3"], name=cfg.name)  # the preset is the K3 default


def test_k3_is_recognised_by_model_type_even_with_k25_keys() -> None:
    raw = hf_config("kimi_k3")
    assert any(k.startswith("vt_") for k in raw["vision_config"])  # the keys alone would say K2.5
    assert parse_config(raw).family == "kimi_k3"
    raw["vision_config"]["model_type"] = "moonvit"
    with pytest.raises(ConfigError, match="contradicts"):
        parse_config(raw)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("norm_type", "batchnorm"),
        ("pos_emb_interpolation_mode", "nearest"),
        ("mm_projector_type", "patchmerger"),
        ("activation_func", "relu"),
        ("vt_num_attention_heads", 5),
        ("attn_bias", "no"),
        ("qkv_hidden_size", 0),
    ],
)
def test_bad_k3_fields_are_named(key, value) -> None:
    raw = hf_config("kimi_k3")
    raw["vision_config"][key] = value
    with pytest.raises(ConfigError, match=key if key != "vt_num_attention_heads" else "num_heads"):
        parse_config(raw)


def test_unknown_family_names_model_type() -> None:
    with pytest.raises(ConfigError, match="model_type.*kimi_k3"):
        parse_config({"model_type": "qwen2_vl", "vision_config": {}})


# -- the pipeline against the independent float64 one ----------------------------------------------------


def rgba_image(width: int, height: int, seed: int) -> Image.Image:
    """Noise colours with an alpha ramp from opaque to fully transparent (every blend weight occurs)."""
    rgb = np.asarray(random_image(width, height, "RGB", seed))
    alpha = np.linspace(0, 255, width, dtype=np.float64)[None, :].repeat(height, 0).astype(np.uint8)
    return Image.fromarray(np.dstack([rgb, alpha]), "RGBA")


# (bytes, what it is): sizes padded and resized (by the patch limit below), formats, EXIF, transparency
CASES = [
    (make_image_bytes(448, 448, "PNG", seed=1), "448 square png"),
    (make_image_bytes(300, 200, "JPEG", seed=2, exif_orientation=6), "jpeg rotated by EXIF"),
    (make_image_bytes(37, 53, "PNG", "L", seed=3), "small grey png, padded"),
    (make_image_bytes(1030, 260, "WEBP", seed=4), "wide webp, resized by in_patch_limit"),
    (make_image_bytes(90, 640, "BMP", seed=5), "tall bmp, resized by the side limit"),
    (encode_image(rgba_image(150, 100, 6), "PNG"), "transparent png onto the chessboard"),
    (encode_image(rgba_image(700, 90, 7), "WEBP", lossless=True), "transparent webp, resized then composited"),
]
PREPROCESSOR = {"media_proc_cfg": {"in_patch_limit": 600, "patch_limit_on_one_side": 30}}


def reference_decode(data: bytes) -> Image.Image:
    """Pillow as the reference processors use it: upright, RGBA when the image has alpha, else RGB."""
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    has_alpha = "A" in image.getbands() or "transparency" in image.info
    return image.convert("RGBA" if has_alpha else "RGB")


@pytest.fixture(scope="module")
def k3_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("k3")
    tensors = write_checkpoint(
        path, "kimi_k3", sharded=True, with_language_model=True, seed=21, preprocessor=PREPROCESSOR
    )
    return path, tensors


REFERENCE_CFG = preprocessor_config("kimi_k3", PREPROCESSOR)["media_proc_cfg"]  # what the checkpoint's file holds


def test_k3_preprocessing_matches_the_reference_pixels_and_token_counts(k3_checkpoint) -> None:
    path, _ = k3_checkpoint
    cfg = load_preprocess_config(path, "kimi_k3")
    assert cfg.family == "kimi_k3" and cfg.transparent_bg is not None and cfg.transparent_bg.pattern == "chessboard"
    for data, what in CASES:
        image = reference_decode(data)
        want, (_, gh, gw) = preprocess(image, REFERENCE_CFG)
        got = preprocess_image(image, cfg)
        assert got.grid_hw == (gh, gw) == target_grid(image.width, image.height, cfg), what
        assert got.num_tokens == gh * gw // 4, what
        assert float((got.patches.double() - want).abs().max()) < 1e-6, what


def test_transparent_pixels_become_the_chessboard() -> None:
    cfg = PreprocessConfig.kimi_k3()
    clear = Image.new("RGBA", (56, 28), (255, 0, 0, 0))  # fully transparent red: only the background shows
    patches = preprocess_image(clear, cfg).patches  # (8, 3, 14, 14), normalized (x / 255 - 0.5) / 0.5
    pixels = patches.view(2, 4, 3, 14, 14).permute(2, 0, 3, 1, 4).reshape(3, 28, 56)
    levels = torch.round((pixels[0] * 0.5 + 0.5) * 255)
    assert levels[0, 0] == 255 and levels[0, 16] == 200 and levels[16, 0] == 200 and levels[16, 16] == 255
    assert torch.equal(pixels[0], pixels[1]) and torch.equal(pixels[1], pixels[2])  # grey: R = G = B


@torch.inference_mode()
def test_loaded_k3_checkpoint_matches_the_reference(k3_checkpoint) -> None:
    path, tensors = k3_checkpoint
    model = load_encoder(path, dtype="float32")
    assert model.config.family == "kimi_k3" and model.output_dim == TEXT_HIDDEN
    reference = ReferenceKimiK3(TINY_K3_VISION, tensors)
    cfg = load_preprocess_config(path, "kimi_k3")
    images = [preprocess_image(reference_decode(data), cfg) for data, _ in CASES]
    got = model(pack_images(images)).split([i.num_tokens for i in images])
    for (data, what), image, out in zip(CASES, images, got, strict=True):
        want = reference.image(*preprocess(reference_decode(data), REFERENCE_CFG))
        assert out.shape == want.shape == (image.num_tokens, TEXT_HIDDEN), what
        assert rel_err(out, want) < 1e-3, what


@torch.inference_mode()
def test_served_k3_checkpoint_matches_the_reference(k3_checkpoint) -> None:
    path, tensors = k3_checkpoint
    reference = ReferenceKimiK3(TINY_K3_VISION, tensors)
    server = ServiceThread(test_settings(model_path=str(path), dtype="float32")).start()
    try:
        with EncoderClient(server.grpc_target, timeout=120) as client:
            results = client.encode([data for data, _ in CASES])
            info = client.server_info()
    finally:
        server.stop()
    assert info.preprocess.family == "kimi_k3"
    assert info.prompt.image_header == "<|media_begin|>image {width}x{height}<|media_content|>"
    for (data, what), result in zip(CASES, results, strict=True):
        image = reference_decode(data)
        assert result.image_size == image.size, what  # what the K3 prompt header names
        got = result.tensor
        want = reference.image(*preprocess(image, REFERENCE_CFG))
        new_w, new_h, pad_w, pad_h = navit_size(image.width, image.height, REFERENCE_CFG)
        assert got.shape[0] == (new_w + pad_w) * (new_h + pad_h) // 28**2, what
        assert rel_err(got, want) < 1e-3, what


def test_serving_a_bad_k3_checkpoint_exits_2_naming_the_key(tmp_path) -> None:
    write_checkpoint(tmp_path, "kimi_k3", sharded=False, with_language_model=False, config_overrides=BAD_NORM)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("MMPROC_")}
    proc = subprocess.run(
        [sys.executable, "-m", "service.app.cli", "serve", "--model-path", str(tmp_path), "--grpc-address",
         "127.0.0.1:0", "--http-address", "127.0.0.1:0"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "vision_config.norm_type 'batchnorm'" in proc.stderr and "Traceback" not in proc.stderr


BAD_NORM = {"vision_config": {"norm_type": "batchnorm"}}


def test_every_family_has_a_preprocessing_rule_and_a_prompt_framing() -> None:
    from mmproc.models import FAMILIES
    from mmproc.preprocess import RULES
    from mmproc.prompt import framing

    for family in FAMILIES:
        assert family.name in RULES and framing(family.name) is not None, family.name
        assert PreprocessConfig.default_for(family.name).family == family.name
    k3 = framing("kimi_k3")
    assert (
        k3.image_text(2, 640, 480)
        == "<|media_begin|>image 640x480<|media_content|><|media_pad|><|media_pad|><|media_end|>"
    )
