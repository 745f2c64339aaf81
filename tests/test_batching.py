"""Packing preprocessed images into one varlen batch and splitting embeddings back."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmproc.batching import pack_images, split_by_image
from mmproc.types import PreprocessedImage


def image(h: int, w: int, fill: float = 0.0, patch: int = 14) -> PreprocessedImage:
    return PreprocessedImage(torch.full((h * w, 3, patch, patch), float(fill)), (h, w), (h // 2) * (w // 2))


@pytest.mark.parametrize(
    ("grids", "cu", "max_seqlen", "tokens"),
    [
        ([(2, 2)], [0, 4], 4, (1,)),
        ([(4, 4), (6, 10), (2, 2)], [0, 16, 76, 80], 60, (4, 15, 1)),
        ([(64, 64), (8, 14)], [0, 4096, 4208], 4096, (1024, 28)),
    ],
)
def test_pack_metadata(grids, cu, max_seqlen, tokens):
    images = [image(h, w, fill=i) for i, (h, w) in enumerate(grids)]
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
    batch = pack_images([image(2, 4)], pin_memory=False)
    assert not batch.pixel_values.is_pinned()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_pin_memory_true():
    assert pack_images([image(2, 4)], pin_memory=True).pixel_values.is_pinned()


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
    batch = pack_images([image(h, w, patch=2) for h, w in grids])
    sizes = [h * w for h, w in grids]
    assert batch.cu_seqlens[1:].tolist() == torch.tensor(sizes).cumsum(0).tolist()
    assert batch.max_seqlen == max(sizes) and batch.token_counts == tuple(s // 4 for s in sizes)
    parts = split_by_image(torch.zeros(batch.num_tokens, 2), batch.token_counts)
    assert [p.shape[0] for p in parts] == list(batch.token_counts)
