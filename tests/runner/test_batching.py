"""Packing preprocessed images into one varlen batch and splitting embeddings back."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmproc.batching import pack_images, pixel_transfer_dtype, split_by_image
from mmproc.types import PreprocessedImage
from tests.support.preprocessed import constant_image


@pytest.mark.parametrize(
    ("grids", "cu", "max_seqlen", "tokens"),
    [
        ([(2, 2)], [0, 4], 4, (1,)),
        ([(4, 4), (6, 10), (2, 2)], [0, 16, 76, 80], 60, (4, 15, 1)),
        ([(64, 64), (8, 14)], [0, 4096, 4208], 4096, (1024, 28)),
    ],
)
def test_pack_metadata(grids, cu, max_seqlen, tokens):
    images = [constant_image(h, w, fill=i) for i, (h, w) in enumerate(grids)]
    batch = pack_images(images)
    assert batch.cu_seqlens.dtype == torch.int32 and batch.cu_seqlens.device.type == "cpu"
    assert batch.cu_seqlens.tolist() == cu
    assert batch.max_seqlen == max_seqlen and isinstance(batch.max_seqlen, int)
    assert batch.token_counts == tokens and batch.grid_hws == tuple(grids)
    assert batch.num_patches == cu[-1] and batch.num_tokens == sum(tokens)
    assert batch.pixel_values.shape == (cu[-1], 3, 14, 14) and batch.pixel_values.dtype == torch.float32
    for i in range(len(grids)):  # each image's patches land in its segment
        assert torch.all(batch.pixel_values[cu[i] : cu[i + 1]] == i)


def test_pin_memory_false_on_cpu():
    batch = pack_images([constant_image(2, 4)], pin_memory=False)
    assert not batch.pixel_values.is_pinned()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_pin_memory_true():
    assert pack_images([constant_image(2, 4)], pin_memory=True).pixel_values.is_pinned()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="device-resident patches need CUDA")
@pytest.mark.parametrize("normalized_first", [False, True])
def test_patches_already_on_the_gpu_pack_there_beside_cpu_ones(normalized_first):
    """GPU-decoded images (uint8 patches on the device) beside the decode workers' (on the CPU): one batch on the
    device with the values the all-CPU pack gives; beside a normalized item (a video chunk) all are normalized."""
    lut = torch.linspace(-1, 1, 768).reshape(3, 256)
    gen = torch.Generator().manual_seed(0)
    byte_images = [
        PreprocessedImage(torch.randint(0, 256, (h * w, 3, 14, 14), generator=gen, dtype=torch.uint8), (h, w), h * w // 4,
                          lut=lut)
        for h, w in ((2, 2), (4, 6), (2, 8))
    ]  # fmt: skip
    first = [constant_image(2, 2, fill=0.25)] if normalized_first else []
    on_cpu = first + byte_images
    mixed = first + [byte_images[0], replace(byte_images[1], patches=byte_images[1].patches.cuda()), byte_images[2]]
    for dtype in (torch.float32, torch.bfloat16):
        want = pack_images(on_cpu, dtype=dtype)
        got = pack_images(mixed, pin_memory=True, dtype=dtype)
        assert got.pixel_values.device.type == "cuda" and (got.lut is None) == normalized_first
        assert got.pixel_values.dtype == want.pixel_values.dtype
        assert torch.equal(got.pixel_values.cpu(), want.pixel_values), dtype
        assert got.cu_seqlens.device.type == "cpu" and got.grid_hws == want.grid_hws


def test_merge_kernel_size_is_honoured():
    img = PreprocessedImage(torch.zeros(36, 3, 14, 14), (6, 6), 4)
    assert pack_images([img], merge_kernel_size=(3, 3)).token_counts == (4,)


def test_inconsistent_images_are_refused():
    with pytest.raises(ValueError, match="at least one"):
        pack_images([])
    with pytest.raises(ValueError, match="grid"):
        pack_images([PreprocessedImage(torch.zeros(5, 3, 14, 14), (2, 2), 1)])
    with pytest.raises(ValueError, match="divisible"):
        pack_images([PreprocessedImage(torch.zeros(6, 3, 14, 14), (2, 3), 1)])
    with pytest.raises(ValueError, match="num_tokens"):
        pack_images([PreprocessedImage(torch.zeros(16, 3, 14, 14), (4, 4), 3)])


def test_split_by_image_returns_views():
    emb = torch.arange(30.0).view(10, 3)
    parts = split_by_image(emb, (4, 1, 5))
    assert [p.shape[0] for p in parts] == [4, 1, 5]
    assert all(p.untyped_storage().data_ptr() == emb.untyped_storage().data_ptr() for p in parts)
    assert parts[1].data_ptr() == emb[4].data_ptr()
    emb[4, 0] = -1.0
    assert parts[1][0, 0] == -1.0  # a view, not a copy
    with pytest.raises(ValueError, match="sum"):
        split_by_image(emb, (4, 4))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), min_size=1, max_size=6))
def test_pack_prefix_sums_property(half_grids):
    grids = [(2 * h, 2 * w) for h, w in half_grids]
    batch = pack_images([constant_image(h, w, patch=2) for h, w in grids])
    sizes = [h * w for h, w in grids]
    assert batch.cu_seqlens[1:].tolist() == torch.tensor(sizes).cumsum(0).tolist()
    assert batch.max_seqlen == max(sizes) and batch.token_counts == tuple(s // 4 for s in sizes)
    parts = split_by_image(torch.zeros(batch.num_tokens, 2), batch.token_counts)
    assert [p.shape[0] for p in parts] == list(batch.token_counts)


def awkward_patches(n: int, seed: int) -> torch.Tensor:
    """(n, 3, 14, 14) float32: random bit patterns (every exponent, subnormals, +-0, +-inf; NaN replaced) plus exact
    round-to-nearest-even ties of bf16 and fp16 and values past the fp16 range."""
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31 - 1, (n, 3, 14, 14), generator=gen, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32).clone()
    x[x.isnan()] = 0.5
    flat = x.view(-1)
    # bf16 keeps 7 mantissa bits: 1 + 2**-8 is halfway between 1 and 1 + 2**-7 (ties to the even 1.0), and
    # 1 + 3 * 2**-8 halfway between 1 + 2**-7 and 1 + 2**-6 (ties up); likewise for fp16 (10 bits).
    ties = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1 + 2**-11, 1 + 3 * 2**-11, 65520.0, 70000.0, 1e-8, -0.0]
    flat[: len(ties)] = torch.tensor(ties)
    flat[len(ties) : 2 * len(ties)] = torch.rand(len(ties), generator=gen) * 2 - 1  # typical normalised pixels
    return x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_packing_in_the_model_dtype_equals_packing_float32_then_casting(dtype):
    grids = [(2, 4), (6, 2)]
    images = [PreprocessedImage(awkward_patches(h * w, seed=h), (h, w), (h // 2) * (w // 2)) for h, w in grids]
    direct = pack_images(images, dtype=dtype)
    via_float32 = pack_images(images)
    assert direct.pixel_values.dtype == dtype and via_float32.pixel_values.dtype == torch.float32
    want = via_float32.pixel_values.to(dtype)
    assert torch.equal(direct.pixel_values.view(torch.int16), want.view(torch.int16)), "not bit-identical"
    assert direct.cu_seqlens.tolist() == via_float32.cu_seqlens.tolist()
    # Round to nearest, ties to even (not truncation): the tie cases land where the device cast puts them.
    first = direct.pixel_values.view(-1)
    if dtype == torch.bfloat16:
        assert first[:3].tolist() == [1.0, 1 + 2**-6, -1.0]
    else:
        assert first[3:7].tolist() == [1.0, 1 + 2**-9, float("inf"), float("inf")]


def test_pixel_transfer_dtype_is_the_model_dtype_only_for_half_precision_on_cuda():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert pixel_transfer_dtype(cuda, torch.bfloat16) == torch.bfloat16
    assert pixel_transfer_dtype(cuda, torch.float16) == torch.float16
    assert pixel_transfer_dtype(cuda, torch.float32) == torch.float32
    assert pixel_transfer_dtype(cpu, torch.bfloat16) == torch.float32
    with pytest.raises(ValueError, match="dtype"):
        pack_images([constant_image(2, 2)], dtype=torch.float64)
