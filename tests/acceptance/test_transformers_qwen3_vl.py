"""Tiny Qwen3-VL (with DeepStack) and Qwen3.5-MoE checkpoints written by transformers 5.23's own classes
(`save_pretrained`, a small text model included) are served as they are, and match transformers' default image
processor (`Qwen2VLImageProcessor`, the torchvision backend: what the engines use, the reference) +
`get_image_features`: every level of every image's embedding, and grid_thw exactly.

Skipped without transformers or torchvision (.ci/run gives it the torch 2.14.1 / torchvision 0.29.1 venv: the
index's torchvision cannot load beside torch 2.13+cpu). About 30 s of tests on the 2-core machine.

Policy differences, tested as such (docs/models.md#qwen3-vl-preprocessing): mmproc applies a JPEG's EXIF
orientation (transformers does only when it opens a file itself, not for a PIL image handed to it); transparency is
composited onto white in both.
"""

from __future__ import annotations

import io
import json
import math

import pytest
import torch
from PIL import Image, ImageOps

from mmproc.batching import pack_images
from mmproc.client import EncoderClient
from mmproc.media import MediaLimits, decode_image
from mmproc.models import load_encoder
from mmproc.preprocess import RULES, load_preprocess_config, preprocess_image, target_grid
from tests.support.media_samples import make_image_bytes
from tests.support.server import ServiceThread, test_settings

transformers = pytest.importorskip("transformers", minversion="5.23")
pytest.importorskip("torchvision")  # the default (and reference) backend of Qwen2VLImageProcessor

OUT = 64
VISION = dict(hidden_size=144, num_heads=2, intermediate_size=288, out_hidden_size=OUT)
IMAGE_PROCESSOR = dict(
    patch_size=16,
    merge_size=2,
    temporal_patch_size=2,
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
    size={"shortest_edge": 65_536, "longest_edge": 16_777_216},  # Qwen3-VL's file, not the class's Qwen2-VL values
)
NOT_RESIZED = [make_image_bytes(256, 256, "PNG", seed=1), make_image_bytes(512, 384, "PNG", seed=2)]
RESIZED = [
    make_image_bytes(300, 200, "PNG", seed=3),  # under min_pixels: scaled up
    make_image_bytes(333, 250, "JPEG", seed=4),  # rounded to 32
    make_image_bytes(200, 500, "WEBP", seed=5, mode="RGBA"),  # alpha: onto white, both sides
    make_image_bytes(400, 260, "JPEG", seed=6, exif_orientation=6),  # rotated by mmproc (policy)
]


def _tighten(model: torch.nn.Module) -> None:
    """Norms away from (1, 0) and larger weights, so that a wrong pairing or order shows."""
    with torch.no_grad():
        for name, param in model.model.visual.named_parameters():
            param.normal_(1.0 if "norm" in name and name.endswith("weight") else 0.0, 0.05)


def _save(model: torch.nn.Module, path, nested: bool) -> None:
    model.save_pretrained(path)
    processor = transformers.Qwen2VLImageProcessor(**IMAGE_PROCESSOR)
    if nested:  # transformers 5 processors may write only processor_config.json, the image processor inside it
        (path / "processor_config.json").write_text(json.dumps({"image_processor": processor.to_dict()}, default=int))
    else:
        processor.save_pretrained(path)


@pytest.fixture(scope="module")
def qwen3_vl(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.Qwen3VLConfig(
        vision_config={**VISION, "depth": 3, "deepstack_visual_indexes": [0, 2]},
        text_config=dict(
            hidden_size=OUT,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            vocab_size=1000,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 4, 4]},
        ),
    )
    model = transformers.Qwen3VLForConditionalGeneration(config).eval()
    _tighten(model)
    path = tmp_path_factory.mktemp("qwen3_vl_hf")
    _save(model, path, nested=False)
    return path, model


@pytest.fixture(scope="module")
def qwen3_5_moe(tmp_path_factory):
    torch.manual_seed(1)
    config = transformers.Qwen3_5MoeConfig(
        vision_config={**VISION, "depth": 2},
        text_config=dict(
            hidden_size=OUT,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            vocab_size=1000,
        ),
    )
    model = transformers.Qwen3_5MoeForConditionalGeneration(config).eval()
    _tighten(model)
    path = tmp_path_factory.mktemp("qwen3_5_moe_hf")
    _save(model, path, nested=True)
    return path, model


def _reference(model, processor, image: Image.Image) -> tuple[list[int], torch.Tensor]:
    """transformers: the default processor, then get_image_features; levels side by side as mmproc lays them."""
    inputs = processor(images=[image], return_tensors="pt")
    out = model.get_image_features(pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"])
    levels = [out.pooler_output[0]] + [level[0] for level in (getattr(out, "deepstack_features", None) or [])]
    return inputs["image_grid_thw"][0].tolist(), torch.cat(levels, dim=1)


def _reference_image(data: bytes) -> Image.Image:
    return ImageOps.exif_transpose(Image.open(io.BytesIO(data)))  # mmproc's EXIF policy, applied for the reference


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


@pytest.mark.parametrize("name", ["qwen3_vl", "qwen3_5_moe"])
@torch.inference_mode()
def test_every_level_matches_get_image_features(name, request) -> None:
    path, model = request.getfixturevalue(name)
    encoder = load_encoder(path)
    rules = load_preprocess_config(path, encoder.config.family)
    processor = transformers.AutoImageProcessor.from_pretrained(path)
    assert type(processor).__name__ == "Qwen2VLImageProcessor"  # the torchvision backend, not ...Pil
    levels = 3 if name == "qwen3_vl" else 1
    assert encoder.output_widths == (OUT,) * levels
    for data in NOT_RESIZED + RESIZED:
        decoded = decode_image(data, MediaLimits(), keep_alpha=RULES[rules.family].keeps_alpha).image
        image = preprocess_image(decoded, rules)
        got = encoder(pack_images([image]))
        grid, want = _reference(model, processor, _reference_image(data))
        assert grid == [1, *image.grid_hw] and got.shape == want.shape == (image.num_tokens, OUT * levels)
        tolerance = 2e-5 if data in NOT_RESIZED else 1e-3
        for level in range(levels):
            cols = slice(level * OUT, (level + 1) * OUT)
            assert _rel(got[:, cols], want[:, cols]) < tolerance, (name, decoded.size, level)


@torch.inference_mode()  # the processor caches its mean/std tensors: made in inference mode by the test above
def test_served_as_is(qwen3_vl) -> None:
    path, model = qwen3_vl
    # Qwen's pixel budget allows 65,536 patches in one image: a batch must hold one (the default is 32,768).
    settings = test_settings(model_path=str(path), dtype="float32", max_batch_patches=65_536)
    server = ServiceThread(settings).start()
    try:
        with EncoderClient(server.grpc_target, timeout=120) as client:
            served = client.encode_images(NOT_RESIZED + RESIZED[:2])
    finally:
        server.stop()
    processor = transformers.AutoImageProcessor.from_pretrained(path)
    for data, got in zip(NOT_RESIZED + RESIZED[:2], served, strict=True):
        _, want = _reference(model, processor, _reference_image(data))
        assert got.shape == want.shape and _rel(got, want) < 1e-3


def _sizes() -> list[tuple[int, int]]:
    """200 (width, height): ties of round() (x.5 multiples of 32), both pixel-budget edges, odd and extreme ratios."""
    ties = [(16 * k, 16 * j) for k, j in ((5, 7), (3, 9), (7, 21), (11, 13), (9, 5), (25, 3), (15, 15), (13, 40))]
    edges = [(256, 256), (255, 257), (4096, 4096), (4097, 4095), (5000, 3356), (1, 1), (1, 200), (200, 1)]
    extreme = [(32, 6400), (6400, 32), (3, 600), (16000, 80), (57000, 290), (12, 2399)]
    gen = torch.Generator().manual_seed(0)
    rest = []
    while len(ties) + len(edges) + len(extreme) + len(rest) < 200:
        w, h = (int(x) for x in torch.randint(1, 6000, (2,), generator=gen))
        if max(w, h) / min(w, h) <= 200:
            rest.append((w, h))
    return ties + edges + extreme + rest


def test_grid_thw_and_token_counts_on_200_sizes(qwen3_vl) -> None:
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    path, _ = qwen3_vl
    rules = load_preprocess_config(path, "qwen3_vl")
    processor = transformers.AutoImageProcessor.from_pretrained(path)
    sizes = _sizes()
    assert len(sizes) == 200
    for w, h in sizes:
        rh, rw = smart_resize(h, w, factor=32, min_pixels=65_536, max_pixels=16_777_216)
        grid = target_grid(w, h, rules)
        assert grid == (rh // 16, rw // 16), (w, h)
        assert processor.get_number_of_image_patches(h, w) == grid[0] * grid[1]  # what vLLM sizes prompts with
    ties = [(w, h) for w, h in sizes if (w / 32) % 1 == 0.5 or (h / 32) % 1 == 0.5]
    assert any(round(w / 32) % 2 == 0 and math.floor(w / 32 + 0.5) != round(w / 32) for w, _ in ties)
    small = [(w, h) for w, h in sizes if w * h <= 600_000][:12]  # through the processor itself: same grids
    for w, h in small:
        got = processor(images=[Image.new("RGB", (w, h))], return_tensors="pt")["image_grid_thw"][0].tolist()
        assert got == [1, *target_grid(w, h, rules)], (w, h)


def test_exif_orientation_is_mmproc_policy(qwen3_vl) -> None:
    path, _ = qwen3_vl
    rules = load_preprocess_config(path, "qwen3_vl")
    processor = transformers.AutoImageProcessor.from_pretrained(path)
    data = RESIZED[3]  # 400 x 260 stored, EXIF orientation 6: shown 260 x 400
    image = preprocess_image(decode_image(data, MediaLimits()).image, rules)
    as_stored = processor(images=[Image.open(io.BytesIO(data))], return_tensors="pt")["image_grid_thw"][0].tolist()
    # transformers, handed a PIL image, does not rotate: 400 wide -> 12.5 * 32 rounds (to even) to 384 = 24 patches
    assert as_stored == [1, 16, 24] and image.grid_hw == (24, 16) == target_grid(260, 400, rules)


def test_alpha_goes_onto_white_as_in_transformers(qwen3_vl) -> None:
    path, _ = qwen3_vl
    rules = load_preprocess_config(path, "qwen3_vl")
    processor = transformers.AutoImageProcessor.from_pretrained(path)
    clear = Image.new("RGBA", (256, 256), (10, 20, 30, 0))  # fully transparent: white after compositing
    buffer = io.BytesIO()
    clear.save(buffer, "PNG")
    decoded = decode_image(buffer.getvalue(), MediaLimits(), keep_alpha=RULES["qwen3_vl"].keeps_alpha).image
    got = preprocess_image(decoded, rules).patches.flatten(1)  # (L, 3*16*16), row-major
    want = processor(images=[clear], return_tensors="pt")["pixel_values"]  # (L, 3*2*16*16), window order
    assert torch.all(got == 1.0) and torch.all(want == 1.0)  # white, normalised: (255 - 127.5) / 127.5
