"""Pack preprocessed images into one varlen batch (CPU side) and split the embeddings back per image.

The dynamic-batching runner (token budget, queues) lives elsewhere; this module only builds `PackedBatch`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mmproc.types import PackedBatch, PreprocessedImage


def pack_images(
    images: Sequence[PreprocessedImage], merge_kernel_size: tuple[int, int] = (2, 2), pin_memory: bool = False
) -> PackedBatch:
    """One `torch.cat` of the patches into a (pinned when asked) (sum L, 3, P, P) float32 buffer.

    cu_seqlens (N + 1,) int32 CPU; max_seqlen and token_counts as Python ints. Pin only for a CUDA consumer.
    """
    if not images:
        raise ValueError("pack_images needs at least one image")
    kh, kw = merge_kernel_size
    grids, token_counts, offsets = [], [], [0]
    for i, image in enumerate(images):
        h, w = image.grid_hw
        if image.patches.shape[0] != h * w or h % kh or w % kw:
            raise ValueError(
                f"image {i}: {image.patches.shape[0]} patches do not form a grid {(h, w)} divisible by {(kh, kw)}"
            )
        tokens = (h // kh) * (w // kw)
        if image.num_tokens != tokens:
            raise ValueError(f"image {i}: num_tokens {image.num_tokens} != {tokens} for grid {(h, w)}")
        grids.append((h, w))
        token_counts.append(tokens)
        offsets.append(offsets[-1] + h * w)
    patch_shape = images[0].patches.shape[1:]  # (3, P, P)
    pixel_values = torch.empty((offsets[-1], *patch_shape), dtype=torch.float32, pin_memory=pin_memory)
    torch.cat([image.patches for image in images], out=pixel_values)
    return PackedBatch(
        pixel_values=pixel_values,
        grid_hws=tuple(grids),
        cu_seqlens=torch.tensor(offsets, dtype=torch.int32),
        max_seqlen=max(h * w for h, w in grids),
        token_counts=tuple(token_counts),
    )


def split_by_image(embeddings: Tensor, token_counts: Sequence[int]) -> list[Tensor]:
    """Views of `embeddings` (sum tokens, hidden), one (tokens_i, hidden) per image; no copies."""
    if sum(token_counts) != embeddings.shape[0]:
        raise ValueError(f"token counts sum to {sum(token_counts)}, embeddings have {embeddings.shape[0]} rows")
    return list(torch.split(embeddings, list(token_counts), dim=0))
