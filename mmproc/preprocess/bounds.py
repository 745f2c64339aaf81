"""Upper bound on the patches one image can produce, for batching budgets (pure int arithmetic).

Rounding each side up to the merge kernel lets a sliver-shaped image exceed the patch limit `L` (7125x125 under
Kimi-VL: 4064 whole patches, 5100 after padding); the bound covers that so any accepted image fits one batch.
Derivation: docs/media.md.
"""

from __future__ import annotations


def max_patches_bound(limit: int, kernel: tuple[int, int], max_grid_hw: tuple[int, int]) -> int:
    """Largest `grid_h * grid_w` an accepted image can reach (the proof: docs/media.md, "The patch bound").

    limit: the patch-count limit of the resize rule (Kimi-VL `in_token_limit`, K2.5 `in_patch_limit`).
    kernel: (kh, kw) merge kernel; grid sides are multiples of it.
    max_grid_hw: largest grid side allowed, per axis, each a multiple of its kernel side.
    """
    kh, kw = kernel
    max_gh, max_gw = max_grid_hw
    best = 0
    for gw in range(kw, max_gw + 1, kw):
        d = gw - kw - 1
        # d <= 0: the width can come from an arbitrarily narrow image, whose height is then only side-capped.
        gh = max_gh if d <= 0 else min(max_gh, kh * ((limit + d) // (d * kh) + 1))
        best = max(best, gw * gh)
    return best
