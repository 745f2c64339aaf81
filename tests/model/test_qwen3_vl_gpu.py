"""The Qwen3-VL tower on CUDA (skipped without a GPU): bf16 against CPU float32, the fast paths against the plain
ones, no device-to-host sync in a forward, CUDA-graph replay equal to the eager forward. Full-width tower (1152
wide, 16 heads of 72, MLP 4304) cut to 3 layers with two DeepStack levels."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mmproc.batching import pack_images
from mmproc.models import PRESETS, VisionEncoder
from mmproc.models.loader import build_encoder, expected_shapes
from mmproc.models.random_init import random_state_dict
from tests.support.common import rel_err
from tests.support.preprocessed import make_images

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CONFIG = dataclasses.replace(PRESETS["qwen3-vl-8b"], num_layers=3, deepstack_layers=(0, 2), text_hidden_size=512)
GRIDS = [(28, 28), (4, 4), (64, 64), (6, 10), (2, 2), (30, 46)]  # one >= 2048 patches (its own SDPA call)


def make(device: str, dtype: torch.dtype) -> VisionEncoder:
    return build_encoder(CONFIG, random_state_dict(expected_shapes(CONFIG), seed=3), device=device, dtype=dtype)


@pytest.fixture(scope="module")
def gpu() -> VisionEncoder:
    return make("cuda", torch.bfloat16)


@pytest.fixture(scope="module")
def batch():
    return pack_images(make_images(GRIDS, patch=16), pin_memory=True)


@torch.inference_mode()
def test_bfloat16_matches_cpu_float32_with_and_without_fast_paths(gpu, batch):
    want = make("cpu", torch.float32)(batch)
    got = gpu(batch)
    assert got.shape == (batch.num_tokens, 3 * 512)
    for level in range(3):
        cols = slice(512 * level, 512 * (level + 1))
        assert rel_err(got[:, cols].float().cpu(), want[:, cols]) < 2e-2, level
    gpu.tower.set_options(fused_gelu=False, fused_rope=False, fused_add_norm=False)
    try:
        assert rel_err(gpu(batch).float().cpu(), want) < 2e-2
    finally:
        gpu.tower.set_options(fused_gelu=True, fused_rope=True, fused_add_norm=True)


@torch.inference_mode()
def test_no_device_to_host_sync_in_forward(gpu, batch):
    out = torch.empty(batch.num_tokens, 3 * 512, device="cuda", dtype=torch.bfloat16)
    gpu(batch)  # warm-up: tables, probes, compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gpu(batch)
        gpu(batch, out=out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@torch.inference_mode()
def test_cuda_graph_replay_matches_eager(gpu):
    small = pack_images(make_images([(28, 28), (4, 8)], seed=5, patch=16), pin_memory=True)
    want = gpu(small)
    gpu.use_cuda_graphs(capacity=2, max_patches=4096, min_hits=2)
    try:
        gpu(small)
        got = gpu(small)  # second sighting: captured and replayed
        assert len(gpu.graphs.graphs) == 1 and rel_err(got.float(), want.float()) < 1e-3
        assert rel_err(gpu(small).float(), want.float()) < 1e-3
    finally:
        gpu.use_cuda_graphs(capacity=0, max_patches=1)
