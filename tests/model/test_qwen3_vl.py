"""The Qwen3-VL tower (Qwen3-VL with DeepStack, Qwen3.5/3.6 without) on the CPU: against a plain per-image forward
written from the source's modules (tests/support/qwen_checkpoint.py), presets, output layout, loader errors."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from mmproc.batching import pack_images
from mmproc.errors import ConfigError
from mmproc.layers.rope import apply_rope, build_rope_table, gather_rope_axes, rope_axis_index, rope_row_index
from mmproc.models import PRESETS, load_encoder, parse_config
from mmproc.models.loader import encoder_from_checkpoint_tensors
from mmproc.models.qwen3_vl_tower import rotate_half_to_interleaved
from mmproc.types import PreprocessedImage
from tests.support.common import rel_err
from tests.support.preprocessed import make_images
from tests.support.qwen_checkpoint import (
    TINY_QWEN,
    make_qwen_tensors,
    qwen_config,
    reference_image,
    write_qwen_checkpoint,
)

GRIDS = [(4, 6), (10, 8), (2, 2), (48, 48), (6, 30)]  # 48 x 48: the position table as is


@pytest.fixture(scope="module")
def tensors():
    return make_qwen_tensors(TINY_QWEN, seed=1)


@pytest.fixture(scope="module")
def encoder(tensors):
    return encoder_from_checkpoint_tensors(parse_config(qwen_config(TINY_QWEN)), tensors)


@torch.inference_mode()
def test_packed_batch_matches_the_per_image_reference(encoder, tensors):
    images = make_images(GRIDS, seed=2, patch=16)
    got = encoder(pack_images(images))
    assert got.shape == (sum(i.num_tokens for i in images), 3 * 64) and encoder.output_widths == (64, 64, 64)
    want = torch.cat([reference_image(tensors, TINY_QWEN, i.patches, *i.grid_hw) for i in images])
    for level in range(3):  # the main merger, then each DeepStack level, side by side
        cols = slice(64 * level, 64 * (level + 1))
        assert rel_err(got[:, cols], want[:, cols]) < 2e-6, level


@torch.inference_mode()
def test_qwen3_5_has_no_deepstack_and_its_own_width(tmp_path):
    tensors = write_qwen_checkpoint(tmp_path, model_type="qwen3_5_moe", shards=3)
    model = load_encoder(tmp_path)
    assert model.config.family == "qwen3_vl" and model.config.deepstack_layers == () and model.output_dim == 64
    image = make_images([(8, 12)], seed=3, patch=16)[0]
    want = reference_image(tensors, {**TINY_QWEN, "deepstack_visual_indexes": []}, image.patches, 8, 12)
    assert rel_err(model(pack_images([image])), want) < 2e-6


@torch.inference_mode()
def test_out_chunks_get_every_level_of_their_rows(encoder):
    batch = pack_images(make_images([(4, 4), (2, 6), (6, 2)], seed=4, patch=16))
    want = encoder(batch)
    chunks = [torch.full((n, 192), float("nan")) for n in (4, 3, 3)]
    assert encoder(batch, out=chunks) is None
    torch.testing.assert_close(torch.cat(chunks), want, atol=0, rtol=0)
    whole = torch.empty(10, 192)
    assert encoder(batch, out=whole).data_ptr() == whole.data_ptr()
    torch.testing.assert_close(whole, want, atol=0, rtol=0)


def test_rotate_half_becomes_the_interleaved_layout():
    # q rotated the source's way (rotate-half, rows then columns) == permuted q rotated the interleaved way.
    dh, grids = 72, [(3, 5), (7, 2)]
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(sum(h * w for h, w in grids), 2, dh, generator=gen)
    rows = torch.cat([torch.arange(h).repeat_interleave(w) for h, w in grids]).float()
    cols = torch.cat([torch.arange(w).repeat(h) for h, w in grids]).float()
    inv = 1.0 / (10000.0 ** (torch.arange(0, dh // 2, 2, dtype=torch.float32) / (dh // 2)))
    half = torch.cat((rows[:, None] * inv, cols[:, None] * inv), 1)
    angles = torch.cat((half, half), 1)[:, None]  # (L, 1, dh)
    x1, x2 = q.chunk(2, -1)
    want = q * angles.cos() + torch.cat((-x2, x1), -1) * angles.sin()
    perm = rotate_half_to_interleaved(dh)
    cos_a, sin_a = build_rope_table(dh, 8, 8)
    got, _ = apply_rope(q[..., perm], q[..., perm], *table_rows(cos_a, sin_a, rope_row_index(grids, 8)))
    torch.testing.assert_close(got, want[..., perm], atol=1e-5, rtol=1e-5)


def table_rows(cos_t, sin_t, rows):
    half = cos_t.shape[-1]
    return cos_t.reshape(-1, half)[rows], sin_t.reshape(-1, half)[rows]


def test_axis_tables_hold_the_grid_table_values():
    from mmproc.layers.rope import build_rope_axis_table

    grids = [(3, 9), (10, 2)]
    cos_g, sin_g = build_rope_table(72, 16, 16)
    want = table_rows(cos_g, sin_g, rope_row_index(grids, 16))
    got = gather_rope_axes(*build_rope_axis_table(72, 16), rope_axis_index(grids))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@torch.inference_mode()
@pytest.mark.parametrize("preset", ["tiny-qwen3-vl", "tiny-qwen3.6"])
def test_tiny_presets_run(preset):
    model = load_encoder(None, preset=preset)
    levels = 1 + len(model.config.deepstack_layers)
    images = make_images([(4, 4), (2, 8)], seed=6, patch=16)
    out = model(pack_images(images))
    assert out.shape == (4 + 4, 256 * levels) and torch.isfinite(out).all()


def test_full_size_presets_have_the_released_shapes():
    for name, width, levels in (("qwen3-vl-8b", 4096, (8, 16, 24)), ("qwen3.6-35b-a3b", 2048, ())):
        cfg = PRESETS[name]
        assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.head_dim) == (27, 1152, 16, 72)
        assert (cfg.intermediate_size, cfg.text_hidden_size, cfg.deepstack_layers) == (4304, width, levels)
        assert (cfg.patch_size, cfg.temporal_patch_size, cfg.pos_emb_height, cfg.merge_kernel_size) == (
            16,
            2,
            48,
            (2, 2),
        )


def test_config_parsing():
    vl = parse_config(qwen_config(TINY_QWEN))
    assert vl.deepstack_layers == (0, 1) and vl.text_hidden_size == 64 and vl.num_layers == 3
    moe = parse_config(qwen_config(TINY_QWEN, "qwen3_5_moe"))
    assert moe.deepstack_layers == () and moe.family == "qwen3_vl"
    default = qwen_config({**TINY_QWEN, "depth": 27})
    del default["vision_config"]["deepstack_visual_indexes"]
    assert parse_config(default).deepstack_layers == (8, 16, 24)  # Qwen3VLVisionConfig's default
    with pytest.raises(ConfigError, match="hidden_act"):
        parse_config({**qwen_config(TINY_QWEN), "vision_config": {**TINY_QWEN, "hidden_act": "silu"}})
    with pytest.raises(ConfigError, match="deepstack"):
        parse_config({"model_type": "qwen3_vl", "vision_config": {**TINY_QWEN, "deepstack_visual_indexes": [3]}})
    with pytest.raises(ConfigError, match="contradicts"):
        parse_config({**qwen_config(TINY_QWEN), "model_type": "kimi_k25"})


def test_loader_names_a_missing_or_misshapen_tensor(tmp_path):
    tensors = write_qwen_checkpoint(tmp_path / "ok", shards=2)
    assert load_encoder(tmp_path / "ok").output_dim == 192
    missing = dict(tensors)
    del missing["model.visual.deepstack_merger_list.1.norm.bias"]
    _write(tmp_path / "missing", missing)
    with pytest.raises(ConfigError, match=r"deepstack_merger_list\.1\.norm\.bias"):
        load_encoder(tmp_path / "missing")
    bad = {**tensors, "model.visual.pos_embed.weight": torch.zeros(48 * 47, 144)}
    _write(tmp_path / "bad", bad)
    with pytest.raises(ConfigError, match="pos_embed.weight .* shape"):
        load_encoder(tmp_path / "bad")


def test_an_fp8_vision_tower_is_refused_naming_the_tensor(tmp_path):
    tensors = write_qwen_checkpoint(tmp_path / "scales")
    fp8 = {**tensors, "model.visual.blocks.0.attn.qkv.weight_scale_inv": torch.ones(4, 2)}
    _write(tmp_path / "scales", fp8)
    with pytest.raises(ConfigError, match=r"blocks\.0\.attn\.qkv\.weight_scale_inv.*FP8"):
        load_encoder(tmp_path / "scales")
    f8 = {
        **tensors,
        "model.visual.blocks.1.mlp.linear_fc1.weight": tensors["model.visual.blocks.1.mlp.linear_fc1.weight"].to(
            torch.float8_e4m3fn
        ),
    }
    _write(tmp_path / "f8", f8)
    with pytest.raises(ConfigError, match=r"blocks\.1\.mlp\.linear_fc1\.weight .*F8_E4M3"):
        load_encoder(tmp_path / "f8")


def test_an_fp8_release_with_a_bf16_tower_loads(tmp_path):
    tensors = write_qwen_checkpoint(tmp_path, model_type="qwen3_5_moe")
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["model.visual", "lm_head"],
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    llm = {"model.language_model.layers.0.mlp.gate_proj.weight": torch.zeros(8, 8).to(torch.float8_e4m3fn)}
    llm["model.language_model.layers.0.mlp.gate_proj.weight_scale_inv"] = torch.ones(1, 1)
    _write(tmp_path, {**{k: v.to(torch.bfloat16) for k, v in tensors.items()}, **llm})
    model = load_encoder(tmp_path)
    assert model.output_dim == 64 and dataclasses.replace(model.config).deepstack_layers == ()


def _write(path, tensors) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if not (path / "config.json").exists():
        (path / "config.json").write_text(json.dumps(qwen_config(TINY_QWEN)))
    for stale in path.glob("model*.safetensors*"):
        stale.unlink()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))


@torch.inference_mode()
def test_a_video_runs_as_its_temporal_slices(encoder, tensors):
    # Two distinct frames per patch (the full Conv3d kernel), one attention segment per slice, as transformers'
    # Qwen3-VL does for a video of grid (2, 6, 8).
    gen = torch.Generator().manual_seed(8)
    slices = [PreprocessedImage(torch.rand(48, 3, 2, 16, 16, generator=gen) * 2 - 1, (6, 8), 12) for _ in range(2)]
    got = encoder(pack_images(slices))
    want = torch.cat([reference_image(tensors, TINY_QWEN, s.patches, 6, 8) for s in slices])
    assert got.shape == (24, 192) and rel_err(got, want) < 2e-6
    # a batch of a video's slices and of images is not mixed (one patch shape per batch); images as before
    assert encoder(pack_images(make_images([(6, 8)], seed=9, patch=16))).shape == (12, 192)
