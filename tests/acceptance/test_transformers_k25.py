"""A Kimi K2.5 checkpoint written by Hugging Face transformers (>= 5.23, `save_pretrained`) serves as it is and
matches transformers' own `get_image_features` (skipped where transformers is not installed; ~10 s on CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from mmproc.client import EncoderClient
from mmproc.media import MediaLimits, decode_image
from mmproc.models import load_encoder
from mmproc.preprocess import load_preprocess_config, preprocess_image
from tests.support.media_samples import make_image_bytes
from tests.support.server import ServiceThread, test_settings

transformers = pytest.importorskip("transformers", minversion="5.23")

VISION = dict(hidden_size=144, num_attention_heads=2, num_hidden_layers=2, intermediate_size=288)
TEXT_HIDDEN = 96
# What transformers 5.23's Kimi_K25ImageProcessor.save_pretrained writes (it needs torchvision to be built).
PREPROCESSOR = {
    "image_processor_type": "Kimi_K25ImageProcessor",
    "do_convert_rgb": True,
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "resample": 3,
    "max_patches": 1024,
    "merge_size": 2,
    "patch_size": 14,
    "size": {"max_height": 40, "max_width": 40},
}
IMAGES = [
    make_image_bytes(448, 448, "PNG", seed=1),
    make_image_bytes(100, 80, "JPEG", seed=2),  # padded
    make_image_bytes(1000, 300, "PNG", seed=3, exif_orientation=6),  # resized by max_patches, rotated
    make_image_bytes(60, 900, "WEBP", seed=4),  # resized by the side limit
]


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.Kimi_K25Config(
        vision_config={**VISION, "pos_emb_height": 16, "pos_emb_width": 16},
        text_config=dict(
            model_type="deepseek_v3",
            hidden_size=TEXT_HIDDEN,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            q_lora_rank=16,  # None would make save_pretrained drop the text q_proj (a transformers 5.23 rename)
            kv_lora_rank=16,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            vocab_size=1000,
        ),
        projection_hidden_size=VISION["hidden_size"],
    )
    model = transformers.Kimi_K25ForConditionalGeneration(config).eval()
    with torch.no_grad():  # LayerNorms away from (1, 0) and a sharper projector, so mistakes show
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    path = tmp_path_factory.mktemp("k25_hf")
    model.save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return path, model


def test_the_checkpoint_uses_the_transformers_names(hf_checkpoint) -> None:
    path, _ = hf_checkpoint
    from safetensors import safe_open

    files = list(path.glob("*.safetensors"))
    keys = {k for f in files for k in safe_open(f, "pt").keys()}  # noqa: SIM118 - safe_open has no __iter__
    assert "vision_tower.encoder.patch_embed.proj.weight" in keys and "model.mm_projector.pre_norm.weight" in keys
    assert "vision_tower.patch_embed.proj.weight" not in keys  # not the release's spelling
    assert load_encoder(path).config.family == "kimi_k25"


@torch.inference_mode()
def test_served_transformers_checkpoint_matches_get_image_features(hf_checkpoint) -> None:
    path, model = hf_checkpoint
    server = ServiceThread(test_settings(model_path=str(path), dtype="float32")).start()
    try:
        with EncoderClient(server.grpc_target, timeout=120) as client:
            served = client.encode_images(IMAGES)
    finally:
        server.stop()
    rules = load_preprocess_config(path, "kimi_k25")
    assert (rules.in_patch_limit, rules.patch_limit_on_one_side) == (1024, 40)
    images = [preprocess_image(decode_image(data, MediaLimits()).image, rules) for data in IMAGES]
    pixels = torch.cat([image.patches for image in images])
    grid_thw = torch.tensor([(1, *image.grid_hw) for image in images])
    want = model.get_image_features(pixel_values=pixels, image_grid_thw=grid_thw).pooler_output
    for image, got, ref in zip(images, served, want, strict=True):
        assert got.shape == ref.shape == (image.num_tokens, TEXT_HIDDEN)
        assert float((got.double() - ref.double()).norm() / ref.double().norm()) < 1e-3
