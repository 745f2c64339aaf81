"""Learnable 2D absolute position embedding of MoonViT (Kimi-VL `Learnable2DInterpPosEmb`).

A (H0, W0, D) table (64 x 64 in the release) is bicubically resized to each image's (h, w) patch grid and added
to the patch embeddings. The reference recomputes the interpolation on every call; here results are cached per
(h, w, device, dtype) in a bounded LRU (entries and bytes), invalidated when the weight changes.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

logger = logging.getLogger(__name__)


def interpolate_pos_emb(table: Tensor, h: int, w: int) -> Tensor:
    """(H0, W0, D) table -> (h * w, D) row-major, in the table's dtype and device.

    Identity when (h, w) == (H0, W0); otherwise bicubic with align_corners=False (the reference's
    `F.interpolate(..., mode="bicubic")`). Interpolated in float32 (exact for a float32 table).
    """
    if (h, w) == (table.shape[0], table.shape[1]):
        return table.flatten(0, 1)
    src = table.float().permute(2, 0, 1).unsqueeze(0)  # (1, D, H0, W0)
    out = F.interpolate(src, size=(h, w), mode="bicubic", align_corners=False)  # (1, D, h, w)
    return out[0].permute(1, 2, 0).reshape(h * w, -1).to(table.dtype)


class Learnable2DInterpPosEmb(nn.Module):
    """`weight` (H0, W0, D) — checkpoint name `patch_embed.pos_emb.weight`."""

    def __init__(
        self, height: int, width: int, dim: int, *, max_cache_entries: int = 256, max_cache_bytes: int = 256 << 20
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(height, width, dim))
        self.max_cache_entries = max_cache_entries
        self.max_cache_bytes = max_cache_bytes
        self._cache: OrderedDict[tuple, Tensor] = OrderedDict()
        self._cache_bytes = 0
        self._cache_stamp: tuple[int, int] | None = None
        self.register_load_state_dict_post_hook(_clear_after_load)

    def clear_cache(self) -> None:
        """Forget every interpolated table (call after editing `weight` in place outside load_state_dict)."""
        self._cache.clear()
        self._cache_bytes = 0
        self._cache_stamp = None

    def _stamp(self) -> tuple[int, int]:
        # Storage address + version counter: changes on assign=True loads, .to(), and in-place edits.
        w = self.weight
        return (w.data_ptr(), -1 if w.is_inference() else w._version)

    def _lookup(self, h: int, w: int) -> Tensor:
        key = (h, w, self.weight.device, self.weight.dtype)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        # Cached tensors must not hold an autograd graph nor be inference tensors (usable in any mode).
        with torch.inference_mode(False), torch.no_grad():
            value = interpolate_pos_emb(self.weight, h, w)
        size = value.numel() * value.element_size()
        if size <= self.max_cache_bytes:
            self._cache[key] = value
            self._cache_bytes += size
            while len(self._cache) > self.max_cache_entries or self._cache_bytes > self.max_cache_bytes:
                _, old = self._cache.popitem(last=False)
                self._cache_bytes -= old.numel() * old.element_size()
        return value

    def forward(self, grid_hws: Sequence[tuple[int, int]]) -> Tensor:
        """Position embeddings of the packed sequence: (sum h*w, D) in the weight's dtype and device."""
        stamp = self._stamp()
        if stamp != self._cache_stamp:
            self.clear_cache()
            self._cache_stamp = stamp
        pieces = []
        for h, w in grid_hws:
            if (h, w) == (self.weight.shape[0], self.weight.shape[1]):
                pieces.append(self.weight.flatten(0, 1))  # the reference uses the table as is
            else:
                pieces.append(self._lookup(h, w))
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def _clear_after_load(module: nn.Module, incompatible_keys: object) -> None:
    assert isinstance(module, Learnable2DInterpPosEmb)
    module.clear_cache()
