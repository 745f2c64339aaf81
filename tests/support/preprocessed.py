"""Preprocessed images made directly (no decoding), for the model, batching and runner tests."""

from __future__ import annotations

import torch

from mmproc.types import PreprocessedImage


def make_images(grids, seed=0, patch=14) -> list[PreprocessedImage]:
    """Preprocessed-looking images: normalised pixels in [-1, 1] (mean 0.5, std 0.5), row-major patches."""
    gen = torch.Generator().manual_seed(seed)
    return [
        PreprocessedImage(torch.rand(h * w, 3, patch, patch, generator=gen) * 2 - 1, (h, w), (h // 2) * (w // 2))
        for h, w in grids
    ]


def constant_image(h: int, w: int, fill: float = 0.0, patch: int = 14) -> PreprocessedImage:
    """An h x w patch grid filled with `fill`, which identifies the image in a batch."""
    return PreprocessedImage(torch.full((h * w, 3, patch, patch), float(fill)), (h, w), (h // 2) * (w // 2))
