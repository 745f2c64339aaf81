"""Encoded images as the engine hands them to the front ends, for the reply-serialization tests."""

from __future__ import annotations

import torch

from service.pipeline.requests import EncodedImage


def results_of(token_counts: list[int], hidden: int) -> list[EncodedImage]:
    """One bf16 embedding of `n` tokens per count, seeded."""
    gen = torch.Generator().manual_seed(0)
    return [
        EncodedImage(
            index=i, grid_hw=(2, 2 * n), num_tokens=n, embedding=torch.randn(n, hidden, generator=gen).bfloat16()
        )
        for i, n in enumerate(token_counts)
    ]
