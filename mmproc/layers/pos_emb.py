"""Learnable 2D absolute position embedding (Kimi-VL `Learnable2DInterpPosEmb`, K2.5/K3 `divided_fixed`, Qwen3-VL
`pos_embed`).

The (H0, W0, D) table is resized to each image's patch grid (bicubic for Kimi-VL and K2.5, bilinear for K3;
align_corners=False, no antialias; Qwen3-VL: bilinear with align_corners=True, its table stored flat as
(H0 * W0, D)) and added to the patch embeddings. Unlike the reference, resized tables are
cached per (h, w, device, dtype) in a bounded LRU that never evicts the current batch's sizes for one another.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor, nn

logger = logging.getLogger(__name__)


_CUBIC_A = -0.75  # torch's (and PIL's) bicubic convolution coefficient


def bicubic_weights(n_in: int, n_out: int, device: torch.device) -> Tensor:
    """(n_out, n_in) float64 matrix M with M @ column == torch's 1-D bicubic resize of the column to n_out points
    (`F.interpolate(mode="bicubic", align_corners=False)`: source x = (i + 0.5) * n_in / n_out - 0.5, taps at
    floor(x) - 1 .. floor(x) + 2 clamped to the border, Keys' cubic with A = -0.75). Built on `device` with tensor
    ops only (no host round trip)."""
    a = _CUBIC_A
    src = (torch.arange(n_out, device=device, dtype=torch.float64) + 0.5) * (n_in / n_out) - 0.5
    floor = src.floor()
    t = src - floor

    def near(x: Tensor) -> Tensor:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: Tensor) -> Tensor:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = torch.stack((far(t + 1), near(t), near(1 - t), far(2 - t)), dim=1)  # (n_out, 4)
    taps = (floor.long()[:, None] + torch.arange(-1, 3, device=device)).clamp_(0, n_in - 1)  # (n_out, 4)
    return torch.zeros(n_out, n_in, device=device, dtype=torch.float64).scatter_add_(1, taps, weights)


def bilinear_weights(n_in: int, n_out: int, device: torch.device) -> Tensor:
    """(n_out, n_in) float64 matrix M with M @ column == torch's 1-D linear resize of the column to n_out points
    (`F.interpolate(mode="bilinear", align_corners=False)`: source x = (i + 0.5) * n_in / n_out - 0.5, clamped
    at 0; taps floor(x) and floor(x) + 1, the upper one clamped to the border)."""
    src = ((torch.arange(n_out, device=device, dtype=torch.float64) + 0.5) * (n_in / n_out) - 0.5).clamp_(min=0.0)
    lo = src.floor().long().clamp_(max=n_in - 1)
    frac = src - lo.to(torch.float64)
    hi = (lo + 1).clamp_(max=n_in - 1)
    out = torch.zeros(n_out, n_in, device=device, dtype=torch.float64)
    out.scatter_add_(1, lo[:, None], (1.0 - frac)[:, None])
    return out.scatter_add_(1, hi[:, None], frac[:, None])


def bilinear_corners_weights(n_in: int, n_out: int, device: torch.device) -> Tensor:
    """(n_out, n_in) float64 matrix of a 1-D linear resize with align_corners=True: source x = i * (n_in - 1) /
    max(n_out - 1, 1) (the ends map onto the ends), taps floor(x) and floor(x) + 1 clamped to the border
    (transformers' `get_vision_interpolation_indices_and_weights(mode="bilinear", align_corners=True)`)."""
    src = torch.arange(n_out, device=device, dtype=torch.float64) * ((n_in - 1) / max(n_out - 1, 1))
    lo = src.floor().long().clamp_(max=n_in - 1)
    frac = src - lo.to(torch.float64)
    hi = (lo + 1).clamp_(max=n_in - 1)
    out = torch.zeros(n_out, n_in, device=device, dtype=torch.float64)
    out.scatter_add_(1, lo[:, None], (1.0 - frac)[:, None])
    return out.scatter_add_(1, hi[:, None], frac[:, None])


RESIZE_WEIGHTS = {
    "bicubic": bicubic_weights,
    "bilinear": bilinear_weights,
    "bilinear_corners": bilinear_corners_weights,
}


def interpolate_pos_emb(table: Tensor, h: int, w: int, mode: str = "bicubic") -> Tensor:
    """(H0, W0, D) table -> (h * w, D) row-major, in the table's dtype and device.

    Identity when (h, w) == (H0, W0); otherwise `mode` ("bicubic" or "bilinear") with align_corners=False (the
    reference's `F.interpolate(..., mode=mode)`), computed as two float64 matmuls because both resizes are
    separable: rows first, then columns (torch's bicubic kernel loops over all channels per output pixel; figures
    in docs/benchmarks/encoder.md).
    """
    h0, w0, dim = table.shape
    if (h, w) == (h0, w0):
        return table.flatten(0, 1)
    weights = RESIZE_WEIGHTS[mode]
    src = table.to(torch.float64)
    rows = weights(h0, h, table.device) @ src.reshape(h0, w0 * dim)  # (h, W0 * D)
    out = weights(w0, w, table.device) @ rows.view(h, w0, dim)  # (w, W0) @ (h, W0, D) -> (h, w, D)
    return out.reshape(h * w, dim).to(table.dtype)


class Learnable2DInterpPosEmb(nn.Module):
    """`weight` (H0, W0, D) — checkpoint name `patch_embed.pos_emb.weight`; `mode` how it is resized. flat: the
    weight is stored (H0 * W0, D) as in the checkpoint (Qwen3-VL's `nn.Embedding`), viewed as (H0, W0, D)."""

    def __init__(
        self,
        height: int,
        width: int,
        dim: int,
        *,
        mode: str = "bicubic",
        flat: bool = False,
        max_cache_entries: int = 256,
        max_cache_bytes: int = 256 << 20,
    ) -> None:
        super().__init__()
        if mode not in RESIZE_WEIGHTS:
            raise ValueError(f"position embedding resize mode must be one of {sorted(RESIZE_WEIGHTS)}, got {mode!r}")
        self.grid = (height, width)
        self.weight = nn.Parameter(torch.empty(height * width, dim) if flat else torch.empty(height, width, dim))
        self.mode = mode
        self.max_cache_entries = max_cache_entries
        self.max_cache_bytes = max_cache_bytes
        self._cache: OrderedDict[tuple, Tensor] = OrderedDict()
        self._cache_bytes = 0
        self._cache_stamp: tuple[int, int] | None = None
        self.register_load_state_dict_post_hook(_clear_after_load)

    @property
    def cache_entries(self) -> int:
        """Interpolated tables kept (at most `max_cache_entries`)."""
        return len(self._cache)

    @property
    def cache_bytes(self) -> int:
        """Bytes of the interpolated tables kept (at most `max_cache_bytes`)."""
        return self._cache_bytes

    def clear_cache(self) -> None:
        """Forget every interpolated table (call after editing `weight` in place outside load_state_dict)."""
        self._cache.clear()
        self._cache_bytes = 0
        self._cache_stamp = None

    def _stamp(self) -> tuple[int, int]:
        # Storage address + version counter: changes on assign=True loads, .to(), and in-place edits.
        w = self.weight
        return (w.data_ptr(), -1 if w.is_inference() else w._version)

    def _lookup(self, h: int, w: int, in_use: set[tuple]) -> Tensor:
        """The (h*w, D) table, cached. `in_use`: keys the current call has looked up (this one included): they
        are never evicted for it, so a batch with more sizes than the cache holds keeps a stable part of them
        cached across calls instead of evicting each entry just before it is needed again (LRU thrash)."""
        key = (h, w, self.weight.device, self.weight.dtype)
        in_use.add(key)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        # Cached tensors must not hold an autograd graph nor be inference tensors (usable in any mode).
        with torch.inference_mode(False), torch.no_grad():
            value = interpolate_pos_emb(self.weight.view(*self.grid, -1), h, w, self.mode)
        size = value.numel() * value.element_size()
        if size <= self.max_cache_bytes:
            self._cache[key] = value
            self._cache_bytes += size
            self._evict(in_use)
        return value

    def _evict(self, in_use: set[tuple]) -> None:
        # Least recently used first, skipping what the current call uses; if only those are left, the newest
        # entry (the one just added) goes again, so the bounds always hold.
        for old in [k for k in self._cache if k not in in_use]:
            if len(self._cache) <= self.max_cache_entries and self._cache_bytes <= self.max_cache_bytes:
                return
            self._drop(old)
        while len(self._cache) > self.max_cache_entries or self._cache_bytes > self.max_cache_bytes:
            self._drop(next(reversed(self._cache)))

    def _drop(self, key: tuple) -> None:
        old = self._cache.pop(key)
        self._cache_bytes -= old.numel() * old.element_size()

    def tables(self, grid_hws: Sequence[tuple[int, int]]) -> list[Tensor]:
        """One (h*w, D) table per image, in the weight's dtype and device (shared objects for equal sizes)."""
        stamp = self._stamp()
        if stamp != self._cache_stamp:
            self.clear_cache()
            self._cache_stamp = stamp
        in_use: set[tuple] = set()
        tables: dict[tuple[int, int], Tensor] = {}
        for hw in grid_hws:
            if hw not in tables:
                if hw == self.grid:
                    tables[hw] = self.weight.view(self.grid[0] * self.grid[1], -1)  # the reference uses the table as is
                else:
                    tables[hw] = self._lookup(hw[0], hw[1], in_use)
        return [tables[hw] for hw in grid_hws]

    def forward(self, grid_hws: Sequence[tuple[int, int]]) -> Tensor:
        """Position embeddings of the packed sequence: (sum h*w, D) in the weight's dtype and device."""
        pieces = self.tables(grid_hws)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def add_to_(self, x: Tensor, grid_hws: Sequence[tuple[int, int]]) -> Tensor:
        """x (sum h*w, D) += the position embeddings, IN PLACE, without materialising them for the whole batch.

        Same values as `x + forward(grid_hws)`; instead of concatenating the tables (one more (L, D) write and
        read), each run of consecutive equal-size images gets one broadcast add: one launch for a batch of equal
        images (view (N, h*w, D)), one per image for a mixed batch.
        """
        start = 0
        for (h, w), count, table in _equal_runs(grid_hws, self.tables(grid_hws)):
            rows = count * h * w
            x[start : start + rows].view(count, h * w, -1).add_(table)
            start += rows
        return x


def _equal_runs(grid_hws: Sequence[tuple[int, int]], tables: list[Tensor]) -> list[tuple[tuple[int, int], int, Tensor]]:
    """Consecutive images of one size as ((h, w), count, table)."""
    runs: list[tuple[tuple[int, int], int, Tensor]] = []
    for hw, table in zip(grid_hws, tables, strict=True):
        if runs and runs[-1][0] == hw:
            runs[-1] = (hw, runs[-1][1] + 1, table)
        else:
            runs.append((hw, 1, table))
    return runs


def _clear_after_load(module: nn.Module, incompatible_keys: object) -> None:
    assert isinstance(module, Learnable2DInterpPosEmb)
    module.clear_cache()
