"""`quantize_fp8` on tiny towers of each family: which layers become FP8, what is left alone, the refusal off
Hopper/Ada. The FP8 math is emulated on the CPU (tests only); the `cuda` tests run the real kernels."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mmproc.batching import pack_images
from mmproc.bench.workloads import random_batch
from mmproc.errors import ConfigError
from mmproc.layers.fp8 import EMULATED, FP8, Fp8Linear, emulated_scaled_mm, quantize_rows, quantize_weight
from mmproc.models import load_encoder
from mmproc.models.quantize import KEEP, apply_quantization, check_fp8_device, quantize_fp8
from tests.support.preprocessed import make_images

# One MoonViT preset of each layout family (LayerNorm + biases, K2.5 rules) and the K3 tower (RMSNorm, bias-free).
PRESETS = ["tiny", "tiny-k2.5", "tiny-k3"]
BLOCK_LINEARS = ("wqkv", "wo", "mlp.fc0", "mlp.fc1")
GRIDS = [(16, 16), (8, 12), (4, 4)]
has_fp8_gpu = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def batch_for(model, dtype=torch.float32):
    cfg = model.config
    return random_batch(GRIDS, cfg.patch_size, cfg.merge_kernel_size, 0, dtype, False)


@pytest.mark.parametrize("preset", PRESETS)
def test_quantize_replaces_exactly_the_block_and_merger_linears(preset):
    model = load_encoder(None, preset=preset)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    replaced = quantize_fp8(model, emulate=True)
    want = [f"tower.encoder.blocks.{i}.{n}" for i in range(model.config.num_layers) for n in BLOCK_LINEARS]
    assert replaced == [*want, "projector.linear_1"]
    for name in replaced:
        layer = model.get_submodule(name)
        assert isinstance(layer, Fp8Linear) and layer.qweight.dtype == FP8
    assert type(model.get_submodule(KEEP[0])) is nn.Linear  # the output layer writes the embedding in bf16
    # Norms, the patch embedding (a Conv), the position table and the output layer: the very same values.
    after = model.state_dict()
    untouched = [n for n in before if not any(n.startswith(r + ".") for r in replaced)]
    assert any(".norm0." in n for n in untouched) and "tower.patch_embed.proj.weight" in untouched
    assert "tower.patch_embed.pos_emb.weight" in untouched
    for name in untouched:
        assert torch.equal(after[name], before[name]), name
    assert isinstance(model.tower.patch_embed.proj, nn.Conv2d)
    assert model.dtype == torch.float32  # the encoder's dtype (its output) is unchanged


@pytest.mark.parametrize("preset", PRESETS)
def test_emulated_fp8_encoder_stays_close_to_full_precision(preset):
    model = load_encoder(None, preset=preset)
    batch = batch_for(model)
    with torch.inference_mode():
        want = model(batch)
        quantize_fp8(model, emulate=True)
        got = model(batch)
    assert got.shape == want.shape and got.dtype == want.dtype
    cos = torch.nn.functional.cosine_similarity(got.double(), want.double(), dim=-1)
    assert cos.min() > 0.995 and cos.mean() > 0.998, (cos.min(), cos.mean())


def test_keep_takes_full_names_and_last_parts():
    model = load_encoder(None, preset="tiny-k3")
    replaced = quantize_fp8(model, emulate=True, keep=(*KEEP, "wo", "mlp.fc1"))
    assert replaced == [
        *(f"tower.encoder.blocks.{i}.{n}" for i in range(2) for n in ("wqkv", "mlp.fc0")),
        "projector.linear_1",
    ]
    assert (
        type(model.tower.encoder.blocks[1].wo) is nn.Linear and type(model.tower.encoder.blocks[0].mlp.fc1) is nn.Linear
    )


def test_features_not_multiple_of_16_stay_in_the_model_dtype():
    model = nn.Sequential(nn.Linear(32, 24), nn.Linear(24, 32), nn.Linear(32, 48))
    assert quantize_fp8(model, emulate=True, keep=()) == ["2"]  # 24 is not a multiple of 16
    assert type(model[0]) is nn.Linear and type(model[1]) is nn.Linear


def test_fp8_is_refused_on_the_cpu_with_the_need_named():
    model = load_encoder(None, preset="tiny-k3")
    with pytest.raises(ConfigError, match=r"quantization fp8 needs a CUDA device of compute capability >= 8\.9"):
        apply_quantization(model, "fp8")
    assert type(model.tower.encoder.blocks[0].wqkv) is nn.Linear  # nothing was converted
    assert apply_quantization(model, "none") is model


def test_fp8_is_refused_on_an_older_gpu_and_a_float32_model(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(ConfigError, match=r"capability >= 8\.9.*A100 \(8\.0\)"):
        check_fp8_device("cuda:0", torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_fp8_device("cuda:0", torch.bfloat16)
    for dtype in ("float32", "float16"):
        with pytest.raises(ConfigError, match=f"needs dtype bfloat16, got {dtype}"):
            check_fp8_device("cuda:0", getattr(torch, dtype))


def test_unknown_quantization_is_a_config_error():
    with pytest.raises(ConfigError, match="quantization must be one of"):
        apply_quantization(nn.Linear(16, 16), "int4")


# -- the real kernels (H100/H200 or Ada) ---------------------------------------------------------------------------
requires_fp8_gpu = pytest.mark.skipif(not has_fp8_gpu, reason="needs a CUDA GPU of compute capability >= 8.9")


@pytest.mark.cuda
@requires_fp8_gpu
@pytest.mark.parametrize("bias", [True, False])
def test_cuda_fp8_linear_equals_its_emulation(bias):
    from mmproc.layers.fp8 import select_fp8_kernels

    device = torch.device("cuda")
    linear = nn.Linear(1152, 4304, bias=bias).to(device, torch.bfloat16)
    kernels = select_fp8_kernels(device, torch.bfloat16)
    assert kernels.names[0] == "triton"  # the fused quantizer loads and passes its probe on the GPU host
    x = torch.randn(1000, 1152, device=device, dtype=torch.bfloat16)  # M not a multiple of 16
    got = Fp8Linear.from_linear(linear, kernels)(x).float()
    want = Fp8Linear.from_linear(linear, EMULATED)(x).float()
    assert ((got - want).norm() / want.norm()).item() < 1e-2  # one bf16 rounding, accumulation order


@pytest.mark.cuda
@requires_fp8_gpu
def test_cuda_triton_quantizer_equals_the_plain_path():
    from mmproc.layers.fp8 import fast_quantize_rows, within_one_step

    x = torch.randn(777, 4304, device="cuda", dtype=torch.bfloat16) * 3
    q, s = fast_quantize_rows(x)
    want_q, want_s = quantize_rows(x)
    torch.testing.assert_close(s, want_s, rtol=1e-6, atol=0)
    mismatch = (q.float() != want_q.float()).float().mean().item()
    assert mismatch < 1e-3  # a division may round the other way on a tie
    assert within_one_step(q, want_q, want_s)


@pytest.mark.cuda
@requires_fp8_gpu
def test_cuda_fused_gelu_quantizer_equals_gelu_then_quantize():
    from mmproc.layers.fp8 import fast_quantize_gelu_rows, quantize_gelu_rows, within_one_step

    y = torch.randn(513, 4304, device="cuda", dtype=torch.bfloat16) * 4  # fc0 outputs, tails included
    q, s = fast_quantize_gelu_rows(y)
    want_q, want_s = quantize_gelu_rows(y)  # GELU rounded to bf16 first: scales differ by that rounding at most
    torch.testing.assert_close(s, want_s, rtol=2**-7, atol=0)
    assert within_one_step(q, want_q, want_s)


@pytest.mark.cuda
@requires_fp8_gpu
@pytest.mark.parametrize("preset", ["tiny-k2.5", "tiny-k3"])
def test_cuda_fp8_encoder_matches_emulation_and_bf16(preset):
    model = load_encoder(None, preset=preset, device="cuda", dtype=torch.bfloat16)
    batch = batch_for(model, torch.bfloat16)
    with torch.inference_mode():
        bf16 = model(batch).float()
        apply_quantization(model, "fp8")
        fp8 = model(batch).float()
    cos = torch.nn.functional.cosine_similarity(fp8, bf16, dim=-1)
    assert cos.min() > 0.99 and cos.mean() > 0.998, (cos.min(), cos.mean())


@pytest.mark.cuda
@requires_fp8_gpu
@torch.inference_mode()
def test_cuda_fp8_forward_replays_as_a_cuda_graph_without_syncs():
    from mmproc.batching import pack_images
    from tests.support.preprocessed import make_images

    model = load_encoder(None, preset="tiny-k3", device="cuda", dtype=torch.bfloat16)
    apply_quantization(model, "fp8")
    small = pack_images(make_images([(4, 4), (8, 14)], seed=5), pin_memory=True)
    want = model(small)  # eager (compiles the Triton quantizers)
    model.use_cuda_graphs(capacity=1, max_patches=1024, min_hits=2)
    try:
        model(small)
        got = model(small)  # captured, then replayed
        assert len(model.graphs.graphs) == 1
        assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-3
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            model(small)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    finally:
        model.use_cuda_graphs(capacity=0, max_patches=1)


def test_emulation_and_quantized_weights_agree_on_the_cpu():
    """The emulated matmul of a layer is the dequantized weight times the dequantized activations."""
    linear = nn.Linear(64, 32)
    layer = Fp8Linear.from_linear(linear, EMULATED)
    x = torch.randn(5, 64)
    q_x, s_x = quantize_rows(x)
    q_w, s_w = quantize_weight(linear.weight)
    want = emulated_scaled_mm(q_x, s_x, q_w.t(), s_w.view(1, -1), linear.bias, torch.float32)
    assert torch.equal(layer(x), want)


def test_a_torch_without_row_wise_fp8_matmuls_is_refused_at_start_up(monkeypatch):
    from mmproc.layers import fp8

    def refuse(*args, **kwargs):
        raise RuntimeError("rowwise scaling not supported")

    monkeypatch.setattr(torch, "_scaled_mm", refuse)
    monkeypatch.setattr(fp8.fp8_triton, "available", lambda: False)
    with pytest.raises(ConfigError, match="no row-wise FP8 matmul"):
        fp8.select_fp8_kernels(torch.device("cpu"), torch.bfloat16)


@pytest.mark.parametrize("preset", ["tiny-qwen3-vl", "tiny-qwen3.6"])
def test_emulated_fp8_qwen_tower_stays_close_and_writes_every_level_into_its_destination(preset):
    """Qwen's blocks read fc1's weight themselves and its mergers write straight into the destination: quantized,
    both take the Fp8Linear's own matmul, the rows land in `out` chunks, and the embedding stays close."""
    model = load_encoder(None, preset=preset)
    batch = pack_images(make_images([(8, 8), (4, 12), (6, 6)], seed=5, patch=model.config.patch_size))
    with torch.inference_mode():
        want = model(batch)
        replaced = quantize_fp8(model, emulate=True)
        got = model(batch)
        chunks = [torch.full((n, want.shape[1]), float("nan")) for n in batch.token_counts]
        model(batch, out=chunks)
    assert any(".mlp.linear_fc1" in n for n in replaced) and any("merger" in n for n in replaced)
    assert got.shape == want.shape and torch.equal(torch.cat(chunks), got)
    cos = torch.nn.functional.cosine_similarity(got.double(), want.double(), dim=-1)
    assert cos.min() > 0.99 and cos.mean() > 0.995, (cos.min(), cos.mean())
