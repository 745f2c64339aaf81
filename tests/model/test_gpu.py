"""The encoder on a CUDA GPU: no host syncs, bf16 parity with the CPU float32 path, `out=` into a byte pool.

Run on the GPU host with `bash scripts/gpu_encoder_check.sh` (or `pytest -m cuda tests/model/test_gpu.py`).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mmproc.batching import pack_images
from mmproc.layers.kernels import addmm_gelu_tanh, linear_gelu_tanh
from mmproc.models import PRESETS, VisionConfig, VisionEncoder
from mmproc.models.loader import build_encoder, expected_shapes
from mmproc.models.random_init import random_state_dict
from mmproc.types import PreprocessedImage
from tests.support.common import rel_err
from tests.support.preprocessed import make_images

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# Full-width towers cut to 2 layers, projector to a small LLM width: MoonViT (1152 wide, 16 heads of 72, mlp
# 4304, LayerNorm, biases) and MoonViT3d (Kimi K3: 1024 wide, 12 heads of 128, mlp 4096, RMSNorm, no biases,
# bilinear pos emb, post-norm projector), the second built from the K3 preset's own fields.
CONFIGS = {
    "moonvit": VisionConfig(
        family="kimi_vl", hidden_size=1152, num_layers=2, num_heads=16, intermediate_size=4304, text_hidden_size=512
    ),
    "moonvit3d": dataclasses.replace(PRESETS["kimi-k3"], num_layers=2, text_hidden_size=512),
}
TEXT_HIDDEN = 512
# Short segments (varlen), one >= 2048 patches (own SDPA call), odd sizes; a second batch of equal segments.
GRIDS = [(4, 4), (32, 32), (6, 10), (48, 48), (2, 2), (8, 14)]
UNIFORM = [(16, 16)] * 4


def make_encoder(config: VisionConfig, device: str, dtype: torch.dtype) -> VisionEncoder:
    return build_encoder(config, random_state_dict(expected_shapes(config), seed=3), device=device, dtype=dtype)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def config(request) -> VisionConfig:
    return CONFIGS[request.param]


@pytest.fixture(scope="module")
def gpu(config) -> VisionEncoder:
    return make_encoder(config, "cuda", torch.bfloat16)


@pytest.fixture(scope="module")
def batch():
    return pack_images(make_images(GRIDS), pin_memory=True)


def warm_then_forward_without_syncs(gpu: VisionEncoder, batch) -> torch.Tensor:
    """One warm-up forward (kernels selected again after set_options: probes and JIT compiles may sync), then one
    under sync-debug "error": any device-to-host sync in it raises."""
    gpu(batch)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return gpu(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@torch.inference_mode()
def test_no_device_to_host_sync_in_forward(gpu, batch):
    uniform = pack_images(make_images(UNIFORM, seed=1), pin_memory=True)
    out = torch.empty(batch.num_tokens, TEXT_HIDDEN, device="cuda", dtype=torch.bfloat16)
    assert gpu.tower.options.uniform_attention  # default: equal segments batched where the backend uses SDPA
    for b in (batch, uniform):
        gpu(b)  # warm-up: RoPE table, pos-emb cache, attention probe, Triton compile may sync once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gpu(batch)
        gpu(batch, out=out)
        gpu(uniform)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@torch.inference_mode()
def test_bfloat16_matches_cpu_float32(gpu, batch, config):
    cpu = make_encoder(config, "cpu", torch.float32)
    want = cpu(batch)
    assert rel_err(gpu(batch), want) < 2e-2
    gpu.tower.set_options(fused_gelu=False, fused_rope=False)
    try:
        assert rel_err(gpu(batch), want) < 2e-2  # the plain GPU path too
    finally:
        gpu.tower.set_options(fused_gelu=True, fused_rope=True)


@torch.inference_mode()
def test_out_into_a_uint8_pool_slice(gpu, batch):
    want = gpu(batch)
    nbytes = want.numel() * want.element_size()
    pool = torch.zeros(nbytes + 8192, dtype=torch.uint8, device="cuda")
    view = pool[4096 : 4096 + nbytes].view(torch.bfloat16).view(want.shape)  # a contiguous (T, hidden) slice
    got = gpu(batch, out=view)
    assert got.data_ptr() == view.data_ptr()
    assert torch.equal(view, want) and torch.equal(got, want)
    assert not pool[:4096].any() and not pool[4096 + nbytes :].any()


@torch.inference_mode()
def test_packed_equals_per_image(gpu, batch):
    packed = gpu(batch)
    singles = torch.cat([gpu(pack_images([im], pin_memory=True)) for im in make_images(GRIDS)])
    assert rel_err(packed, singles) < 1e-2


@torch.inference_mode()
def test_uniform_batched_attention_equals_varlen(gpu):
    uniform = pack_images(make_images(UNIFORM, seed=2), pin_memory=True)
    batched = gpu(uniform)
    gpu.tower.set_options(uniform_attention=False)
    try:
        assert rel_err(batched, gpu(uniform)) < 1e-2
    finally:
        gpu.tower.set_options(uniform_attention=True)


@torch.inference_mode()
def test_attention_runs_on_side_streams_give_the_same_result_without_syncs(gpu, batch):
    # GRIDS packs short / long (48x48 >= 2048 patches) / short segments: three runs spread over the side streams.
    want = gpu(batch)
    gpu.tower.set_options(attention_streams=3)
    try:
        assert "streams3" in gpu.tower.kernels(gpu.device, gpu.dtype).names[0]
        got = warm_then_forward_without_syncs(gpu, batch)
        assert rel_err(got, want) < 1e-3  # the same kernels on the same data: expected identical
    finally:
        gpu.tower.set_options(attention_streams=1)


@torch.inference_mode()
@pytest.mark.parametrize("backend", ["flash_attn_cute", "torch_varlen"])
def test_each_varlen_attention_backend_matches_per_segment_sdpa_without_syncs(gpu, batch, backend):
    # GRIDS has short and long (>= 2048 patches) segments: flash_attn_cute keeps the long one, torch_varlen hands
    # it to SDPA; the uniform batch is varlen too with uniform_attention off.
    gpu.tower.set_options(attention_backend="sdpa")
    want = gpu(batch)
    gpu.tower.set_options(attention_backend=backend, uniform_attention=False)
    try:
        if not gpu.tower.kernels(gpu.device, gpu.dtype).names[0].startswith(backend):
            pytest.skip(f"{backend} does not load or pass its probe on this host")
        assert rel_err(warm_then_forward_without_syncs(gpu, batch), want) < 1e-2
    finally:
        gpu.tower.set_options(attention_backend="auto", uniform_attention=True)


@torch.inference_mode()
@pytest.mark.parametrize("backend", ["cudnn", "flash"])
def test_preferred_sdpa_backend_gives_the_same_result(gpu, batch, backend):
    want = gpu(batch)
    gpu.tower.set_options(sdpa_backend=backend)
    try:
        assert rel_err(gpu(batch), want) < 1e-2
    finally:
        gpu.tower.set_options(sdpa_backend="auto")


@torch.inference_mode()
def test_fused_gelu_epilogue_matches_plain():
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(3000, 1152, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(4304, 1152, device="cuda", generator=gen) * 0.03).bfloat16()
    b = (torch.randn(4304, device="cuda", generator=gen) * 0.1).bfloat16()
    exact = torch.nn.functional.gelu(x.double() @ w.double().t() + b.double(), approximate="tanh")
    fused, plain = addmm_gelu_tanh(x, w, b), linear_gelu_tanh(x, w, b)
    assert fused.shape == plain.shape == (3000, 4304) and fused.dtype == torch.bfloat16
    assert rel_err(fused, exact) < 1e-2 and rel_err(plain, exact) < 1e-2
    assert rel_err(fused, plain) < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_packing_in_the_model_dtype_equals_the_cast_on_the_gpu(dtype):
    # Pixels cast on the CPU while packing (what the runner ships for a half-precision model) must be the same
    # bits as float32 pixels copied and cast on the GPU (what the encoder did before): both round to nearest even.
    gen = torch.Generator().manual_seed(4)
    patches = torch.randn(64, 3, 14, 14, generator=gen) * 300  # past fp16's range too: inf on both sides
    patches.view(-1)[:4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11])  # exact ties
    images = [PreprocessedImage(patches, (8, 8), 16)]
    direct = pack_images(images, pin_memory=True, dtype=dtype).pixel_values
    on_gpu = pack_images(images, pin_memory=True).pixel_values.cuda().to(dtype)
    assert direct.is_pinned() and direct.dtype == dtype
    assert torch.equal(direct.cuda().view(torch.int16), on_gpu.view(torch.int16))


@torch.inference_mode()
def test_bf16_pixels_give_the_float32_pixels_result(gpu):
    images = make_images(GRIDS)
    packed_bf16 = pack_images(images, pin_memory=True, dtype=torch.bfloat16)
    packed_f32 = pack_images(images, pin_memory=True)
    assert rel_err(gpu(packed_bf16), gpu(packed_f32)) < 1e-3  # same bits reach the model: expected 0


@torch.inference_mode()
def test_cuda_graph_replay_matches_eager_without_syncs(gpu):
    small = pack_images(make_images([(4, 4), (8, 14)], seed=5), pin_memory=True)
    other = pack_images(make_images([(16, 16)], seed=6), pin_memory=True)
    want, want_other = gpu(small), gpu(other)  # eager: no graphs yet
    gpu.use_cuda_graphs(capacity=1, max_patches=1024, min_hits=2)
    try:
        assert torch.equal(gpu(small), want) and not gpu.graphs.graphs  # first sighting: still eager
        got = gpu(small)  # second: captured, then replayed
        assert len(gpu.graphs.graphs) == 1 and rel_err(got, want) < 1e-3
        rows = torch.empty_like(want)
        chunks = [torch.empty(n, TEXT_HIDDEN, device="cuda", dtype=torch.bfloat16) for n in small.token_counts]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            gpu(small, out=rows)
            gpu(small, out=chunks)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.equal(rows, got) and torch.equal(torch.cat(chunks), got)
        gpu(other), gpu(other)  # a second key evicts the first (capacity 1)
        assert len(gpu.graphs.graphs) == 1 and rel_err(gpu(other), want_other) < 1e-3
        assert rel_err(gpu(small), want) < 1e-3  # evicted: eager again, same result
    finally:
        gpu.use_cuda_graphs(capacity=0, max_patches=1)
    assert gpu.graphs is None


@torch.inference_mode()
def test_graphs_share_one_output_buffer_and_leave_large_images_eager(gpu):
    small = pack_images(make_images([(4, 4), (8, 14)], seed=11), pin_memory=True)
    other = pack_images(make_images([(16, 16)], seed=12), pin_memory=True)
    large = pack_images(make_images([(32, 32)], seed=13), pin_memory=True)  # one image of 1,024 patches
    want = [gpu(batch) for batch in (small, other, large)]  # eager: no graphs yet
    gpu.use_cuda_graphs(capacity=2, max_patches=2048, min_hits=1, max_image_patches=512)
    try:
        for _ in range(2):  # alternating replays write one buffer: each result must still be its own
            got = [gpu(batch) for batch in (small, other, large)]
            assert all(rel_err(g, w) < 1e-3 for g, w in zip(got, want))
        assert len(gpu.graphs.graphs) == 2  # small and other; large (1,024 patches > 512 per image) ran eagerly
        assert gpu.graphs.shared_out.shape == (2048 // 4, TEXT_HIDDEN)  # one buffer for the largest batch allowed
    finally:
        gpu.use_cuda_graphs(capacity=0, max_patches=1)


def byte_images(grids, seed=0):
    """uint8 patches with one normalization table: what the decode workers ship for a CUDA encoder."""
    gen = torch.Generator().manual_seed(seed)
    lut = torch.rand(3, 256, generator=gen) * 2 - 1
    return [
        PreprocessedImage(
            torch.randint(0, 256, (h * w, 3, 14, 14), dtype=torch.uint8, generator=gen), (h, w), (h // 2) * (w // 2),
            lut=lut,
        )
        for h, w in grids
    ]  # fmt: skip


@torch.inference_mode()
def test_bytes_normalized_on_the_gpu_give_the_bf16_packed_result_without_syncs(gpu):
    images = byte_images(GRIDS, seed=7)
    from_bytes = pack_images(images, pin_memory=True)
    normalized = [dataclasses.replace(i, patches=i.normalized(), lut=None) for i in images]
    want = gpu(pack_images(normalized, pin_memory=True, dtype=torch.bfloat16))
    assert from_bytes.pixel_values.dtype == torch.uint8 and from_bytes.pixel_values.is_pinned()
    assert torch.equal(gpu(from_bytes), want)  # the table cast to bf16 == each float32 value cast: same bits
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gpu(from_bytes)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    small = pack_images(byte_images([(4, 4), (8, 14)], seed=8), pin_memory=True)
    eager = gpu(small)
    gpu.use_cuda_graphs(capacity=1, max_patches=1024, min_hits=2)
    try:
        gpu(small), gpu(small)  # captured on the second sighting
        assert len(gpu.graphs.graphs) == 1 and rel_err(gpu(small), eager) < 1e-3
    finally:
        gpu.use_cuda_graphs(capacity=0, max_patches=1)
