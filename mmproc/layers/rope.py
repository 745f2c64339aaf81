"""2D rotary position embedding of MoonViT (Kimi-VL `Rope2DPosEmb`), as pure functions.

Element layout (interleaved, as in the reference's `view_as_complex(x.view(..., -1, 2))`): the complex pairs
of a head are (x[2j], x[2j+1]) for j in 0..dh/2-1. With dh/4 frequencies f_k = 1 / theta**(4k / dh):

    pair j = 2k     rotates by  col * f_k   (even pairs = column / x axis)
    pair j = 2k + 1 rotates by  row * f_k   (odd pairs = row / y axis)

One table is built for the largest grid and sliced per image; the angles are computed in float32 exactly as
the reference does, so a table of any size holds the same values at the same (row, col).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor


def build_rope_table(
    head_dim: int, max_h: int = 512, max_w: int = 512, theta: float = 10000.0
) -> tuple[Tensor, Tensor]:
    """cos, sin tables, each (max_h, max_w, head_dim // 2) float32 on the CPU."""
    if head_dim % 4:
        raise ValueError(f"head_dim {head_dim} must be divisible by 4 for 2D RoPE")
    # freqs_k = 1 / theta ** (4k / dh), computed like the reference: arange(0, dh, 4) / dh in float32.
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 4, dtype=torch.float32)[: head_dim // 4] / head_dim))
    col_angles = torch.outer(torch.arange(max_w, dtype=torch.float32), freqs)  # (max_w, dh/4)
    row_angles = torch.outer(torch.arange(max_h, dtype=torch.float32), freqs)  # (max_h, dh/4)
    angles = torch.empty(max_h, max_w, head_dim // 4, 2, dtype=torch.float32)
    angles[..., 0] = col_angles.unsqueeze(0)  # even pairs: column
    angles[..., 1] = row_angles.unsqueeze(1)  # odd pairs: row
    angles = angles.view(max_h, max_w, head_dim // 2)
    return angles.cos(), angles.sin()


def rope_row_index(grid_hws: Sequence[tuple[int, int]], table_w: int) -> Tensor:
    """Flat row of every patch in a (max_h * table_w, dh/2) view of the table: (sum h*w,) int64 on the CPU.

    Patches are row-major per image, images in order (the packed sequence order).
    """
    for _, w in grid_hws:
        if w > table_w:
            raise ValueError(f"grid width {w} exceeds the RoPE table width {table_w}")
    if not grid_hws:
        return torch.zeros(0, dtype=torch.int64)
    return torch.cat([_image_rope_rows(h, w, table_w) for h, w in grid_hws])


@functools.lru_cache(maxsize=256)  # per grid size: a batch of equal images builds it once (read-only: cat copies)
def _image_rope_rows(h: int, w: int, table_w: int) -> Tensor:
    return (torch.arange(h, dtype=torch.int64).unsqueeze(1) * table_w + torch.arange(w, dtype=torch.int64)).view(-1)


def gather_rope(cos_table: Tensor, sin_table: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """cos, sin (L, dh/2) float32 for flat table rows `rows` (L,) int64 on the tables' device."""
    half = cos_table.shape[-1]
    return cos_table.reshape(-1, half).index_select(0, rows), sin_table.reshape(-1, half).index_select(0, rows)


def rope_cos_sin(grid_hws: Sequence[tuple[int, int]], cos_table: Tensor, sin_table: Tensor) -> tuple[Tensor, Tensor]:
    """Per-patch cos, sin, each (sum h*w, head_dim // 2) float32 on the tables' device.

    The row index is built on the CPU from Python ints and copied once (no device sync).
    """
    max_h, max_w = cos_table.shape[0], cos_table.shape[1]
    for h, w in grid_hws:
        if h > max_h or w > max_w:
            raise ValueError(f"grid {(h, w)} exceeds the RoPE table {(max_h, max_w)}")
    rows = rope_row_index(grid_hws, max_w).to(cos_table.device, non_blocking=True)
    return gather_rope(cos_table, sin_table, rows)


def _rotate(x: Tensor, cis: Tensor) -> Tensor:
    # x (L, H, dh) any float; cis (L, 1, dh/2) complex64. The interleaved pairs (x[2j], x[2j+1]) are the real and
    # imaginary parts of dh/2 complex numbers; one complex multiply rotates them all:
    # (a + ib)(c + is) = (ac - bs) + i(as + bc). Three kernels per tensor (to float32, multiply, back).
    xf = x.float()  # no copy when x is already float32
    if xf.storage_offset() % 2 or any(stride % 2 for stride in xf.stride()[:-1]) or xf.stride(-1) != 1:
        xf = xf.contiguous()  # view_as_complex needs (real, imag) adjacent and complex-aligned
    pairs = torch.view_as_complex(xf.unflatten(-1, (-1, 2)))  # (L, H, dh/2) complex64, a view
    return torch.view_as_real(pairs * cis).flatten(-2).to(x.dtype)


def apply_rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate q, k (L, H, dh), any float dtype, by cos/sin (L, dh/2) float32.

    Math in float32; returns new tensors in the input dtype (the inputs are not modified).
    """
    cis = torch.complex(cos, sin).unsqueeze(1)  # (L, 1, dh/2) complex64: shared by all heads
    return _rotate(q, cis), _rotate(k, cis)


# -- one table per axis (towers whose grids get long: Qwen3-VL reaches ~3,600 patches on a side) -----------------


def build_rope_axis_table(head_dim: int, size: int, theta: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos, sin (size, head_dim // 4) float32 on the CPU: position p at frequency f_k, the same angles (and bits) as
    `build_rope_table` holds at row or column p."""
    if head_dim % 4:
        raise ValueError(f"head_dim {head_dim} must be divisible by 4 for 2D RoPE")
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 4, dtype=torch.float32)[: head_dim // 4] / head_dim))
    angles = torch.outer(torch.arange(size, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def rope_axis_index(grid_hws: Sequence[tuple[int, int]]) -> Tensor:
    """(2 * sum h*w,) int64 on the CPU: (column, row) of every patch, patches row-major per image, images in order."""
    if not grid_hws:
        return torch.zeros(0, dtype=torch.int64)
    return torch.cat([_image_axis_index(h, w) for h, w in grid_hws])


@functools.lru_cache(maxsize=256)
def _image_axis_index(h: int, w: int) -> Tensor:
    rows = torch.arange(h, dtype=torch.int64).repeat_interleave(w)
    cols = torch.arange(w, dtype=torch.int64).repeat(h)
    return torch.stack((cols, rows), dim=1).view(-1)


def gather_rope_axes(cos_axis: Tensor, sin_axis: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """cos, sin (L, dh/2) float32 in the interleaved layout above (pair 2k: column, 2k + 1: row) from the per-axis
    tables (N, dh/4) and `rope_axis_index` (2L,) int64 on the tables' device."""
    quarter = cos_axis.shape[-1]

    def gather(table: Tensor) -> Tensor:
        # (2L, dh/4) -> (L, 2, dh/4) -> (L, dh/4, 2): column and row angle of frequency k side by side
        return table.index_select(0, index).view(-1, 2, quarter).transpose(1, 2).reshape(-1, 2 * quarter)

    return gather(cos_axis), gather(sin_axis)
