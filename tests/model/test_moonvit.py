"""The packed MoonViT encoder against a per-image forward and against an independent HF-style reference."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from mmproc.batching import pack_images
from mmproc.layers.add_norm import add_norm
from mmproc.layers.attention import VarlenMeta, long_segments_on_sdpa, sdpa_segments, select_attention
from mmproc.layers.kernels import linear_gelu_tanh
from mmproc.layers.pos_emb import Learnable2DInterpPosEmb, interpolate_pos_emb
from mmproc.layers.projector import merge_gather_index
from mmproc.layers.rope import apply_rope, build_rope_table, rope_cos_sin
from mmproc.models import PRESETS, VisionConfig, VisionEncoder, load_encoder
from mmproc.models.loader import encoder_from_checkpoint_tensors
from mmproc.models.tower import TowerInputs
from mmproc.types import PackedBatch, PreprocessedImage
from tests.support.checkpoints import TINY_VISION, make_vision_tensors
from tests.support.common import rel_err
from tests.support.preprocessed import make_images
from tests.support.reference_moonvit import reference_model
from tests.support.tiny_config import config_for

GRIDS = [(4, 4), (6, 10), (2, 2), (64, 64), (8, 14)]


@pytest.fixture(scope="module")
def tensors():
    return {family: make_vision_tensors(family, seed=1) for family in ("kimi_vl", "kimi_k25")}


@pytest.fixture(scope="module")
def encoder(tensors) -> VisionEncoder:
    return encoder_from_checkpoint_tensors(config_for("kimi_vl"), tensors["kimi_vl"])


def per_image_forward(model: VisionEncoder, images: list[PreprocessedImage]) -> torch.Tensor:
    """The plain way: one image at a time, a real conv, direct interpolation, full SDPA per image."""
    tower, proj, cfg = model.tower, model.projector, model.config
    cos_t, sin_t = build_rope_table(cfg.head_dim, 64, 64)
    outs = []
    for image in images:
        h, w = image.grid_hw
        x = F.conv2d(image.patches, tower.patch_embed.proj.weight, tower.patch_embed.proj.bias).flatten(1)
        table = tower.patch_embed.pos_emb.weight
        pos = F.interpolate(table.permute(2, 0, 1)[None], size=(h, w), mode="bicubic", align_corners=False)
        x = x + pos[0].permute(1, 2, 0).reshape(h * w, -1)
        cos, sin = cos_t[:h, :w].reshape(h * w, -1), sin_t[:h, :w].reshape(h * w, -1)
        for blk in tower.encoder.blocks:
            q, k, v = blk.wqkv(blk.norm0(x)).view(h * w, 3, cfg.num_heads, cfg.head_dim).unbind(1)
            q, k = apply_rope(q, k, cos, sin)
            o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
            x = x + blk.wo(o.transpose(0, 1).reshape(h * w, -1))
            x = x + blk.mlp.fc1(F.gelu(blk.mlp.fc0(blk.norm1(x)), approximate="tanh"))
        x = tower.encoder.final_layernorm(x)
        merged = x.view(h // 2, 2, w // 2, 2, -1).permute(0, 2, 1, 3, 4).reshape(h * w // 4, 4, -1)
        y = proj.pre_norm(merged).flatten(1)
        outs.append(proj.linear_2(F.gelu(proj.linear_1(y))))
    return torch.cat(outs)


@torch.inference_mode()
def test_packed_forward_equals_per_image_forward(encoder):
    images = make_images(GRIDS)
    got = encoder(pack_images(images))
    assert got.shape == (sum(i.num_tokens for i in images), 256)
    torch.testing.assert_close(got, per_image_forward(encoder, images), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["kimi_vl", "kimi_k25"])
@torch.inference_mode()
def test_matches_independent_reference(tensors, family):
    images = make_images([(4, 4), (6, 10), (2, 2), (64, 64), (8, 14), (30, 12)], seed=2)
    model = encoder_from_checkpoint_tensors(config_for(family), tensors[family])
    reference = reference_model(family, TINY_VISION, 256, tensors[family])
    batch = pack_images(images)
    want = reference(batch.pixel_values, list(batch.grid_hws))
    got = model(batch)
    assert got.shape == want.shape
    assert rel_err(got, want) < 1e-3
    # Per image, too: a wrong row order inside one image must not hide in the global norm.
    for g, r in zip(got.split(batch.token_counts), want.split(batch.token_counts), strict=True):
        assert rel_err(g, r) < 1e-3


def complex_rope(x: torch.Tensor, rows: list[int], cols: list[int], head_dim: int) -> torch.Tensor:
    """Reference rotation with torch.polar/view_as_complex: even pairs by column, odd pairs by row."""
    freqs = 1.0 / (10000 ** (torch.arange(0, head_dim, 4)[: head_dim // 4].float() / head_dim))
    col = torch.polar(torch.ones(len(cols), head_dim // 4), torch.outer(torch.tensor(cols).float(), freqs))
    row = torch.polar(torch.ones(len(rows), head_dim // 4), torch.outer(torch.tensor(rows).float(), freqs))
    cis = torch.stack([col, row], dim=-1).reshape(len(rows), 1, head_dim // 2)
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * cis).flatten(-2)


def test_apply_rope_equals_complex_reference():
    head_dim, grids = 72, [(3, 5), (7, 2)]
    cos_t, sin_t = build_rope_table(head_dim, 16, 16)
    cos, sin = rope_cos_sin(grids, cos_t, sin_t)
    rows = [r for h, w in grids for r in range(h) for _ in range(w)]
    cols = [c for h, w in grids for _ in range(h) for c in range(w)]
    q, k = torch.randn(2, len(rows), 3, head_dim).unbind(0)
    q_out, k_out = apply_rope(q, k, cos, sin)
    torch.testing.assert_close(q_out, complex_rope(q, rows, cols, head_dim), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, complex_rope(k, rows, cols, head_dim), atol=1e-5, rtol=1e-5)
    qb, _ = apply_rope(q.bfloat16(), k.bfloat16(), cos, sin)
    assert qb.dtype == torch.bfloat16 and rel_err(qb, q_out) < 1e-2


def test_rope_even_pairs_follow_column_odd_pairs_follow_row():
    head_dim = 72
    cos_t, sin_t = build_rope_table(head_dim, 8, 8)
    x = torch.randn(3, 1, head_dim)
    # 1x3 grid: the column changes, the row is 0 -> only even pairs rotate.
    out_row, _ = apply_rope(x, x, *rope_cos_sin([(1, 3)], cos_t, sin_t))
    # 3x1 grid: the row changes, the column is 0 -> only odd pairs rotate.
    out_col, _ = apply_rope(x, x, *rope_cos_sin([(3, 1)], cos_t, sin_t))
    pairs = lambda t: t.view(3, 1, head_dim // 2, 2)  # noqa: E731
    x_p, row_p, col_p = pairs(x), pairs(out_row), pairs(out_col)
    torch.testing.assert_close(row_p[0], x_p[0])  # position (0, 0) does not rotate
    torch.testing.assert_close(col_p[0], x_p[0])
    for pos in (1, 2):
        assert not torch.allclose(row_p[pos, :, 0::2], x_p[pos, :, 0::2])  # even pairs: column moved
        torch.testing.assert_close(row_p[pos, :, 1::2], x_p[pos, :, 1::2])
        assert not torch.allclose(col_p[pos, :, 1::2], x_p[pos, :, 1::2])  # odd pairs: row moved
        torch.testing.assert_close(col_p[pos, :, 0::2], x_p[pos, :, 0::2])


def test_rope_table_is_the_same_at_any_size():
    small, big = build_rope_table(72, 8, 16), build_rope_table(72, 64, 64)
    assert small[0].shape == (8, 16, 36) and small[0].dtype == torch.float32
    torch.testing.assert_close(small[0], big[0][:8, :16], atol=0, rtol=0)
    assert math.isclose(small[1][2, 5, 0].item(), math.sin(5.0), rel_tol=1e-6)  # pair 0: column 5 at freq 1
    assert math.isclose(small[1][2, 5, 1].item(), math.sin(2.0), rel_tol=1e-6)  # pair 1: row 2 at freq 1


def test_merger_order_is_tl_tr_bl_br():
    # One 2x4 grid and one 4x2 grid; each patch's value is its row-major index within the packed sequence.
    grids = [(2, 4), (4, 2)]
    x = torch.arange(16, dtype=torch.float32)[:, None].repeat(1, 3)
    merged = x.index_select(0, merge_gather_index(grids, (2, 2))).view(-1, 4, 3)[..., 0]
    expected = [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert merged.tolist() == expected


def test_pos_emb_interpolation_and_cache():
    module = Learnable2DInterpPosEmb(64, 64, 8)
    with torch.no_grad():
        module.weight.normal_()
    table = module.weight.detach().clone()
    direct = F.interpolate(table.permute(2, 0, 1)[None], size=(10, 23), mode="bicubic", align_corners=False)
    got = module([(10, 23)])
    torch.testing.assert_close(got, direct[0].permute(1, 2, 0).reshape(230, 8), atol=1e-4, rtol=1e-5)  # fp32 kernel
    torch.testing.assert_close(module([(64, 64)]), table.reshape(-1, 8), atol=0, rtol=0)  # identity
    torch.testing.assert_close(interpolate_pos_emb(table, 64, 64), table.reshape(-1, 8), atol=0, rtol=0)
    assert module([(10, 23)]) is got  # cached
    both = module([(10, 23), (4, 4)])
    assert both.shape == (230 + 16, 8)
    with torch.no_grad():
        module.weight.mul_(2)  # in-place edit: the version counter invalidates the cache
    torch.testing.assert_close(module([(10, 23)]), got * 2, atol=1e-5, rtol=1e-5)
    module.load_state_dict({"weight": table * 3})
    torch.testing.assert_close(module([(10, 23)]), got * 3, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("table_hw", [(64, 64), (9, 5)])
@pytest.mark.parametrize("out_hw", [(1, 1), (2, 3), (10, 23), (63, 64), (64, 65), (110, 74), (130, 7)])
def test_pos_emb_separable_interpolation_is_torch_bicubic(table_hw: tuple[int, int], out_hw: tuple[int, int]) -> None:
    # The matmul formulation must be torch's bicubic resize (taps, border clamping, A = -0.75), not an approximation:
    # exact to float64 rounding against F.interpolate in float64, and within float32 rounding of the float32 kernel.
    table = torch.randn(*table_hw, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(sum(out_hw)))
    h, w = out_hw
    want = F.interpolate(table.permute(2, 0, 1)[None], size=out_hw, mode="bicubic", align_corners=False)
    torch.testing.assert_close(interpolate_pos_emb(table, h, w), want[0].permute(1, 2, 0).reshape(h * w, 6),
                               atol=1e-12, rtol=1e-12)  # fmt: skip
    want32 = F.interpolate(table.float().permute(2, 0, 1)[None], size=out_hw, mode="bicubic", align_corners=False)
    torch.testing.assert_close(interpolate_pos_emb(table.float(), h, w), want32[0].permute(1, 2, 0).reshape(h * w, 6),
                               atol=1e-4, rtol=1e-5)  # fmt: skip


def test_pos_emb_cache_is_bounded():
    module = Learnable2DInterpPosEmb(64, 64, 8, max_cache_entries=3, max_cache_bytes=10_000)
    for h in range(2, 12, 2):
        module([(h, 6)])
    assert module.cache_entries <= 3 and module.cache_bytes <= 10_000
    module([(100, 100)])  # 320 kB: larger than the byte bound, computed but not cached
    assert module.cache_bytes <= 10_000


def test_pos_emb_cache_keeps_part_of_a_batch_larger_than_itself(monkeypatch):
    # A batch with 5 sizes through a cache of 3 entries, twice: plain LRU would evict each size just before its
    # next use (0 hits on the second call); entries of the batch being embedded are never evicted for each other.
    from mmproc.layers import pos_emb

    computed = []
    original = pos_emb.interpolate_pos_emb
    monkeypatch.setattr(
        pos_emb, "interpolate_pos_emb", lambda t, h, w, mode: computed.append((h, w)) or original(t, h, w, mode)
    )
    module = Learnable2DInterpPosEmb(64, 64, 8, max_cache_entries=3)
    with torch.no_grad():
        module.weight.normal_()
    grids = [(2, 4), (4, 4), (6, 4), (8, 4), (10, 4), (4, 4)]
    first = module(grids)
    assert len(computed) == 5 and module.cache_entries <= 3
    computed.clear()
    torch.testing.assert_close(module(grids), first, atol=0, rtol=0)
    assert len(computed) == 2, "three of the five sizes should have stayed cached"
    assert module.cache_entries <= 3


@torch.inference_mode()
def test_pos_emb_add_to_equals_adding_the_concatenation():
    module = Learnable2DInterpPosEmb(64, 64, 8)
    with torch.no_grad():
        module.weight.normal_()
    for grids in ([(4, 6)], [(4, 6)] * 3, [(2, 2), (4, 6), (4, 6), (64, 64), (2, 2)]):
        x = torch.randn(sum(h * w for h, w in grids), 8)
        want = x + module(grids)
        assert module.add_to_(x, grids) is x
        torch.testing.assert_close(x, want, atol=0, rtol=0)


def test_sdpa_segments_is_block_diagonal():
    cu = torch.tensor([0, 5, 12, 13], dtype=torch.int32)
    q, k, v = torch.randn(3, 13, 2, 8).unbind(0)
    got = sdpa_segments(q, k, v, VarlenMeta.from_cu_seqlens(cu, 7))
    mask = torch.zeros(13, 13, dtype=torch.bool)
    for s, e in [(0, 5), (5, 12), (12, 13)]:
        mask[s:e, s:e] = True
    want = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), mask)
    torch.testing.assert_close(got, want.transpose(0, 1), atol=1e-6, rtol=1e-5)
    assert select_attention("cpu", torch.float32, 2, 8)[0] == "sdpa"


@pytest.mark.parametrize(("length", "batched"), [(4, True), (9, False)])
def test_equal_segments_are_batched_only_below_uniform_below(length, batched):
    # flash_attn_cute's setting: equal short segments take one batched SDPA call, equal long ones stay varlen.
    calls = []

    def recording_varlen(q, k, v, meta):
        calls.append(meta.uniform)
        return sdpa_segments(q, k, v, meta)

    meta = VarlenMeta.from_cu_seqlens(torch.arange(0, 3 * length + 1, length, dtype=torch.int32), length)
    q, k, v = torch.randn(3, 3 * length, 2, 8).unbind(0)
    fn = long_segments_on_sdpa(recording_varlen, long_segment=1 << 30, uniform_batched=True, uniform_below=8)
    torch.testing.assert_close(fn(q, k, v, meta), sdpa_segments(q, k, v, meta), atol=1e-6, rtol=1e-6)
    assert calls == ([] if batched else [length])


@pytest.mark.parametrize("backend", ["auto", "flash_attn_cute", "torch_varlen", "sdpa"])
def test_a_named_attention_backend_falls_back_to_sdpa_where_it_cannot_run(backend):
    # CPU float32: no varlen kernel runs here, whichever is asked for; the service still serves.
    assert select_attention("cpu", torch.float32, 2, 8, backend=backend)[0] == "sdpa"


def test_an_unknown_attention_backend_is_refused():
    with pytest.raises(ValueError, match="flash_attn_cute"):
        select_attention("cpu", torch.float32, 2, 8, backend="flash3")


@pytest.mark.parametrize("lengths", [[3, 9, 2, 2, 12, 1], [9], [9, 9], [1, 2], [2, 10, 3]])
def test_long_segments_split_from_varlen_runs(lengths):
    offsets = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    meta = VarlenMeta.from_cu_seqlens(offsets, max(lengths))
    seen = []

    def fake_varlen(q, k, v, sub):  # records what the varlen backend is asked to do
        assert sub.cu_seqlens[0] == 0 and sub.cu_seqlens[-1] == q.shape[0] and sub.max_seqlen < 8
        seen.append(sub.cu_seqlens.tolist())
        assert sub.bounds == tuple(zip(seen[-1][:-1], seen[-1][1:], strict=True))
        return sdpa_segments(q, k, v, sub)

    q, k, v = torch.randn(3, int(offsets[-1]), 2, 8).unbind(0)
    got = long_segments_on_sdpa(fake_varlen, long_segment=8)(q, k, v, meta)
    torch.testing.assert_close(got, sdpa_segments(q, k, v, meta), atol=1e-6, rtol=1e-6)
    short_runs = {(3, 9, 2, 2, 12, 1): [[0, 3], [0, 2, 4], [0, 1]], (1, 2): [[0, 1, 3]], (2, 10, 3): [[0, 2], [0, 3]]}
    assert seen == short_runs.get(tuple(lengths), [])
    if max(lengths) >= 8:
        runs = meta.runs(8)
        assert runs is meta.runs(8)  # planned once per forward
        assert [r.start for r in runs[1:]] == [r.end for r in runs[:-1]] and runs[-1].end == offsets[-1]


@torch.inference_mode()
def test_out_is_written_in_place(encoder):
    batch = pack_images(make_images([(4, 6), (2, 2)]))
    out = torch.full((batch.num_tokens, encoder.output_dim), float("nan"))
    ptr = out.data_ptr()
    got = encoder(batch, out=out)
    assert got.data_ptr() == ptr and out.data_ptr() == ptr
    torch.testing.assert_close(out, encoder(batch), atol=0, rtol=0)
    pool = torch.zeros(100, encoder.output_dim)  # a slice of a larger pool
    encoder(batch, out=pool[10 : 10 + batch.num_tokens])
    torch.testing.assert_close(pool[10 : 10 + batch.num_tokens], out, atol=0, rtol=0)
    assert pool[:10].abs().sum() == 0 and pool[10 + batch.num_tokens :].abs().sum() == 0
    with pytest.raises(ValueError, match="out must be"):
        encoder(batch, out=torch.empty(batch.num_tokens + 1, encoder.output_dim))


@torch.inference_mode()
def test_bfloat16_on_cpu_is_close_to_float32(tensors):
    images = make_images([(4, 4), (12, 8), (64, 64)], seed=3)
    batch = pack_images(images)
    f32 = encoder_from_checkpoint_tensors(config_for("kimi_vl"), tensors["kimi_vl"])
    bf16 = encoder_from_checkpoint_tensors(config_for("kimi_vl"), tensors["kimi_vl"], dtype=torch.bfloat16)
    got = bf16(batch)
    assert got.dtype == torch.bfloat16 and bf16.dtype == torch.bfloat16
    assert rel_err(got, f32(batch)) < 2e-2


@torch.inference_mode()
def test_rope_table_growth_and_batch_order_do_not_change_results(tensors):
    model = encoder_from_checkpoint_tensors(config_for("kimi_vl"), tensors["kimi_vl"])
    small, tall = make_images([(6, 4)], seed=4), make_images([(130, 2)], seed=5)
    first = model(pack_images(small))
    model(pack_images(tall))  # grows the lazily built RoPE table past 64 rows
    torch.testing.assert_close(model(pack_images(small)), first, atol=0, rtol=0)
    both = model(pack_images(tall + small))
    torch.testing.assert_close(both[-first.shape[0] :], first, atol=1e-5, rtol=1e-5)


def test_tiny_preset_properties_and_grad_free():
    model = load_encoder(None)
    assert model.config == PRESETS["tiny"] and model.config.head_dim == 72
    assert model.device == torch.device("cpu") and model.dtype == torch.float32 and model.output_dim == 256
    assert not any(p.requires_grad for p in model.parameters())
    out = model(pack_images(make_images([(2, 2)])))  # runs without inference_mode too
    assert out.shape == (1, 256) and torch.isfinite(out).all()
    empty = PackedBatch(torch.empty(0, 3, 14, 14), (), torch.zeros(1, dtype=torch.int32), 0, ())
    assert model(empty).shape == (0, 256)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.inference_mode()
def test_cuda_bfloat16_matches_cpu_float32(tensors):
    images = make_images(GRIDS, seed=6)
    cpu = encoder_from_checkpoint_tensors(config_for("kimi_vl"), tensors["kimi_vl"])
    gpu = encoder_from_checkpoint_tensors(config_for("kimi_vl"), tensors["kimi_vl"], device="cuda", dtype="bfloat16")
    batch = pack_images(images, pin_memory=True)
    out = torch.empty(batch.num_tokens, 256, device="cuda", dtype=torch.bfloat16)
    got = gpu(batch, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert rel_err(got.cpu(), cpu(batch)) < 2e-2


def test_sdpa_uniform_equals_per_segment():
    from mmproc.layers.attention import sdpa_uniform

    gen = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(3, 4 * 6, 3, 8, generator=gen).unbind(0)  # 4 segments of 6, (L, H, dh)
    meta = VarlenMeta.from_cu_seqlens(torch.tensor([0, 6, 12, 18, 24], dtype=torch.int32), 6)
    assert meta.uniform == 6
    torch.testing.assert_close(sdpa_uniform(q, k, v, meta), sdpa_segments(q, k, v, meta), atol=1e-6, rtol=1e-5)
    assert VarlenMeta.from_cu_seqlens(torch.tensor([0, 6, 13], dtype=torch.int32), 7).uniform == 0


def tower_inputs(model: VisionEncoder, batch: PackedBatch, **kernel_changes) -> TowerInputs:
    """What `VisionEncoder.forward` hands the tower, built the slow way on the CPU (kernels optionally replaced)."""
    tower = model.tower
    cos_t, sin_t = tower.rope_table(
        torch.device("cpu"), max(h for h, _ in batch.grid_hws), max(w for _, w in batch.grid_hws)
    )
    cos, sin = rope_cos_sin(batch.grid_hws, cos_t, sin_t)
    kernels = dataclasses.replace(tower.kernels(model.device, model.dtype), **kernel_changes)
    meta = VarlenMeta.from_cu_seqlens(batch.cu_seqlens, batch.max_seqlen)
    return TowerInputs(batch.grid_hws, cos, sin, meta, kernels)


def per_block_formula(model: VisionEncoder, x: torch.Tensor, inputs: TowerInputs) -> torch.Tensor:
    """The encoder as the checkpoint's modules define it, block by block: x + attn(norm0 x), x + mlp(norm1 x)."""
    cfg, seq = model.config, x.shape[0]
    for blk in model.tower.encoder.blocks:
        q, k, v = blk.wqkv(blk.norm0(x)).view(seq, 3, cfg.num_heads, cfg.head_dim).unbind(1)
        q, k = apply_rope(q, k, inputs.cos, inputs.sin)
        x = x + blk.wo(sdpa_segments(q, k, v, inputs.attn).reshape(seq, -1))
        x = x + blk.mlp(blk.norm1(x), linear_gelu_tanh)
    return model.tower.encoder.final_layernorm(x)


@torch.inference_mode()
def test_encoder_pairs_each_residual_add_with_the_next_layernorm(tensors):
    # 3 layers so that a block's MLP residual meets the NEXT block's norm0 and the last one final_layernorm; every
    # LayerNorm has its own weights, so pairing an add with the wrong norm changes the result.
    config = dataclasses.replace(config_for("kimi_vl"), num_layers=3)
    model = encoder_from_random(config)
    norms = [m.weight for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len({tuple(w[:4].tolist()) for w in norms}) == len(norms) == 2 * 3 + 2
    batch = pack_images(make_images([(4, 6), (10, 8), (2, 2)], seed=8))
    inputs = tower_inputs(model, batch)
    assert inputs.kernels.names[3] == "eager" and inputs.kernels.add_norm is add_norm
    x = model.tower.patch_embed(batch.pixel_values, batch.grid_hws)
    want = per_block_formula(model, x.clone(), inputs)
    torch.testing.assert_close(model.tower.encoder(x.clone(), inputs), want, atol=0, rtol=0)  # same ops, same bits

    # The fused kernel's contract, emulated in torch: x += y IN PLACE, then LayerNorm. The encoder must not read
    # a residual it has handed to add_norm (aliasing), so the result is the same up to float32 rounding.
    def in_place(x, y, norm):
        x.add_(y)
        return x, torch.nn.functional.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)

    fused = tower_inputs(model, batch, add_norm=in_place)
    x_in = x.clone()
    torch.testing.assert_close(model.tower.encoder(x_in, fused), want, atol=1e-6, rtol=1e-6)
    assert not torch.equal(x_in, x), "the emulated fused path should have updated the residual stream in place"


def encoder_from_random(config: VisionConfig) -> VisionEncoder:
    from mmproc.models.loader import build_encoder, expected_shapes
    from mmproc.models.random_init import random_state_dict

    return build_encoder(config, random_state_dict(expected_shapes(config), seed=4))


def test_kernel_options_name_the_add_norm_choice():
    model = load_encoder(None, preset="tiny")
    kernels = model.tower.kernels(model.device, model.dtype)
    assert len(kernels.names) == 4 and kernels.names[3] == "eager"  # CPU: the plain path
    assert model.tower.options.fused_add_norm  # on by default; CUDA picks Triton when it passes its probe
    model.tower.set_options(fused_add_norm=False)
    assert model.tower.kernels(model.device, model.dtype).add_norm is add_norm


def test_cuda_graph_cache_stays_eager_on_the_cpu() -> None:
    model = load_encoder(None, preset="tiny")
    model.use_cuda_graphs(capacity=2, max_patches=4096, min_hits=1)
    batch = pack_images(make_images([(4, 6)]))
    with torch.inference_mode():
        want = model(batch)
        assert torch.equal(model(batch), want)
    assert not model.graphs.graphs and not model.graphs.sightings  # never looked at off CUDA
    with pytest.raises(ValueError, match="capacity"):
        model.use_cuda_graphs(capacity=1, max_patches=0)
