"""Video chunks in a MoonViT tower (Kimi K2.5 `divided_fixed` + `sd2_tpool`): a fixed time embedding per frame,
and the frames of a chunk averaged after the tower.

A chunk of t frames of (h, w) patches is packed as t*h*w rows, frame-major; it is one attention segment, each
frame gets the spatial position embedding and the 2D RoPE of an (h, w) image, plus time row f + 1 (frame f)
of a sinusoid table whose row 0 is zero, so that t == 1 (an image, or a one-frame last chunk) adds nothing.
After the final norm the t frames are averaged, before the 2x2 merge gather and the projector's pre_norm
(transformers 5.23 `Kimi_K25VisionModel.forward`: `hidden_states[merge_index].mean(dim=1)`, a gather of the t
frames of each merged sub-token; the mean of each patch's frames followed by the merge gather is the same).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def time_embedding_table(rows: int, dim: int) -> Tensor:
    """(rows + 1, dim) float32 on the CPU: a zero row, then [sin | cos] of position m at frequency
    10000 ** (-2i / dim) for m < rows (MAE's 1-D sincos table)."""
    position = torch.arange(rows, dtype=torch.float32)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))
    freqs = torch.outer(position, inv_freq)  # (rows, dim/2)
    table = torch.cat([freqs.sin(), freqs.cos()], dim=1)
    return torch.cat([table.new_zeros(1, dim), table])


def frame_time_index(grid_hws: Sequence[tuple[int, int]], frames: Sequence[int]) -> Tensor:
    """Row of the time table for every packed patch: (sum t*h*w,) int64 on the CPU (0 for one-frame items)."""
    parts = []
    for (h, w), t in zip(grid_hws, frames, strict=True):
        if t == 1:
            parts.append(torch.zeros(h * w, dtype=torch.int64))
        else:
            parts.append(torch.arange(1, t + 1, dtype=torch.int64).repeat_interleave(h * w))
    return torch.cat(parts)


def frame_grids(grid_hws: Sequence[tuple[int, int]], frames: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """One (h, w) per frame: the grids the spatial position embedding and RoPE see."""
    return tuple(hw for hw, t in zip(grid_hws, frames, strict=True) for _ in range(t))


def temporal_pool(hidden: Tensor, grid_hws: Sequence[tuple[int, int]], frames: Sequence[int]) -> Tensor:
    """hidden (sum t*h*w, D) -> (sum h*w, D): each chunk's frames averaged patch by patch; one-frame items are
    copied as they are."""
    parts, start = [], 0
    for (h, w), t in zip(grid_hws, frames, strict=True):
        rows = t * h * w
        piece = hidden[start : start + rows]
        parts.append(piece if t == 1 else piece.view(t, h * w, -1).mean(dim=0))
        start += rows
    return parts[0] if len(parts) == 1 else torch.cat(parts)
