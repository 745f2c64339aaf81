"""Patch merger (2x2 by default) and the multimodal projector.

Merger (Kimi-VL `patch_merger`): sub-tokens top-left, top-right, bottom-left, bottom-right, as one
`index_select` with a CPU-built index. `Projector` (Kimi-VL, K2.5): LayerNorm per sub-token, Linear, exact
GELU, Linear. `PostNormProjector` (K3 `PatchMergerMLPV2`): bias-free Linear, GELU, Linear, then RMSNorm.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def merge_gather_index(grid_hws: Sequence[tuple[int, int]], kernel: tuple[int, int] = (2, 2)) -> Tensor:
    """Source row of every merged sub-token: (sum (h/kh)*(w/kw)*kh*kw,) int64 on the CPU.

    Row-major over output tokens, then (ih, iw) row-major within the kernel: TL, TR, BL, BR for 2x2.
    """
    kh, kw = kernel
    for h, w in grid_hws:
        if h % kh or w % kw:
            raise ValueError(f"grid {(h, w)} is not divisible by the merge kernel {kernel}")
    if not grid_hws:
        return torch.zeros(0, dtype=torch.int64)
    sizes = [h * w for h, w in grid_hws]
    starts = torch.tensor([0, *itertools.accumulate(sizes[:-1])], dtype=torch.int64)  # each image's first row
    local = torch.cat([_image_merge_index(h, w, kh, kw) for h, w in grid_hws])
    return local + starts.repeat_interleave(torch.tensor(sizes))


@functools.lru_cache(maxsize=256)  # per grid size: a batch of equal images builds it once (read-only: cat copies)
def _image_merge_index(h: int, w: int, kh: int, kw: int) -> Tensor:
    """One image's gather order from its own row 0: (h/kh, w/kw, kh, kw) flattened."""
    return torch.arange(h * w, dtype=torch.int64).view(h // kh, kh, w // kw, kw).permute(0, 2, 1, 3).reshape(-1)


class Projector(nn.Module):
    """pre_norm (D), linear_1 (kk*D -> kk*D), GELU, linear_2 (kk*D -> text_hidden).

    Checkpoint names: Kimi-VL `multi_modal_projector.{pre_norm,linear_1,linear_2}`; K2.5
    `mm_projector.{pre_norm,proj.0,proj.2}` (mapped by the loader).
    """

    def __init__(self, hidden_size: int, kernel: tuple[int, int], text_hidden_size: int, eps: float) -> None:
        super().__init__()
        self.merged_dim = hidden_size * kernel[0] * kernel[1]
        self.pre_norm = nn.LayerNorm(hidden_size, eps=eps)
        self.linear_1 = nn.Linear(self.merged_dim, self.merged_dim)
        self.linear_2 = nn.Linear(self.merged_dim, text_hidden_size)

    def forward(
        self, x: Tensor, merge_index: Tensor, out: Tensor | list[Tensor] | None = None, taps: tuple[Tensor, ...] = ()
    ) -> Tensor | None:
        """x (L, D) tower output, merge_index (T*kk,) int64 on x's device -> (T, text_hidden), into `out` if given.
        `taps` (DeepStack levels) must be empty: this projector has none.

        `out` may be a list of (n_i, text_hidden) tensors with sum n_i == T: consecutive row ranges written
        into separate destinations (e.g. one IPC pool slice per request in the batch); returns None then.
        """
        # LayerNorm is per token, so normalising before the gather equals the reference's norm after the merge.
        x = self.pre_norm(x)
        h = x.index_select(0, merge_index).view(-1, self.merged_dim)  # (T, kk*D)
        h = F.gelu(self.linear_1(h))  # exact GELU (GELUActivation / nn.GELU)
        return _linear_into(h, self.linear_2, out)


class PostNormProjector(nn.Module):
    """linear_1 (kk*D -> kk*D), GELU, linear_2 (kk*D -> text_hidden), post_norm RMSNorm (text_hidden); no biases.

    Checkpoint names: K3 `mm_projector.{proj.0,proj.2,post_norm}` (mapped by the family's layout).
    """

    def __init__(self, hidden_size: int, kernel: tuple[int, int], text_hidden_size: int, eps: float) -> None:
        super().__init__()
        self.merged_dim = hidden_size * kernel[0] * kernel[1]
        self.linear_1 = nn.Linear(self.merged_dim, self.merged_dim, bias=False)
        self.linear_2 = nn.Linear(self.merged_dim, text_hidden_size, bias=False)
        self.post_norm = nn.RMSNorm(text_hidden_size, eps=eps)

    def forward(
        self, x: Tensor, merge_index: Tensor, out: Tensor | list[Tensor] | None = None, taps: tuple[Tensor, ...] = ()
    ) -> Tensor | None:
        """As `Projector.forward`: x (L, D), merge_index (T*kk,) -> (T, text_hidden), into `out` if given."""
        h = F.gelu(self.linear_1(x.index_select(0, merge_index).view(-1, self.merged_dim)))  # (T, kk*D)
        y = self.post_norm(self.linear_2(h))  # (T, text_hidden)
        if out is None:
            return y
        if isinstance(out, list):
            _split_copy(y, out)
            return None
        return out.copy_(y)


class PatchMergerMLP(nn.Module):
    """norm, 2x2 shuffle, linear_fc1 (kk*D -> kk*D), exact GELU, linear_fc2 (kk*D -> out); biases everywhere.
    postshuffle_norm False: LayerNorm(D) per sub-token (Qwen3-VL `merger`); True: LayerNorm(kk*D) over the
    shuffled row (its DeepStack mergers). Checkpoint names: `norm`, `linear_fc1`, `linear_fc2`."""

    def __init__(
        self, hidden_size: int, kernel: tuple[int, int], out_size: int, eps: float, *, postshuffle_norm: bool
    ) -> None:
        super().__init__()
        self.kk = kernel[0] * kernel[1]
        self.merged_dim = hidden_size * self.kk
        self.postshuffle_norm = postshuffle_norm
        self.norm = nn.LayerNorm(self.merged_dim if postshuffle_norm else hidden_size, eps=eps)
        self.linear_fc1 = nn.Linear(self.merged_dim, self.merged_dim)
        self.linear_fc2 = nn.Linear(self.merged_dim, out_size)

    def forward(self, x: Tensor, merge_index: Tensor, out: Tensor | list[Tensor] | None = None) -> Tensor | None:
        """x (L, D), merge_index (T*kk,) int64 on x's device -> (T, out), into `out` if given."""
        if self.postshuffle_norm:
            h = self.norm(x.index_select(0, merge_index).view(-1, self.merged_dim))
        else:  # per-token norm: before the gather, as Projector does
            h = self.norm(x).index_select(0, merge_index).view(-1, self.merged_dim)
        return _linear_into(F.gelu(self.linear_fc1(h)), self.linear_fc2, out)  # (T, kk*D) -> (T, out)


def _split_copy(y: Tensor, out: list[Tensor]) -> None:
    start = 0
    for chunk in out:
        chunk.copy_(y[start : start + chunk.shape[0]])
        start += chunk.shape[0]


def _linear_into(h: Tensor, linear: nn.Linear, out: Tensor | list[Tensor] | None) -> Tensor | None:
    """linear(h) (T, out_features), written straight into `out` (a tensor or consecutive row chunks) when given,
    e.g. slices of the IPC pool: no extra copy."""
    if out is None:
        return linear(h)
    if not isinstance(linear, nn.Linear):  # quantized (mmproc/models/quantize.py): its own matmul, then the copy
        y, start = linear(h), 0
        for chunk in out if isinstance(out, list) else [out]:
            chunk.copy_(y[start : start + chunk.shape[0]])
            start += chunk.shape[0]
        return None if isinstance(out, list) else out
    if isinstance(out, list):
        start = 0
        for chunk in out:
            rows = chunk.shape[0]
            torch.addmm(linear.bias, h[start : start + rows], linear.weight.t(), out=chunk)
            start += rows
        return None
    return torch.addmm(linear.bias, h, linear.weight.t(), out=out)


# VisionConfig.projector -> class
PROJECTORS: dict[str, type[Projector] | type[PostNormProjector]] = {
    "pre_norm_mlp": Projector,
    "mlp_post_norm": PostNormProjector,
}
