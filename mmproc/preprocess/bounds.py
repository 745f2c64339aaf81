"""Upper bound on the patches one image can produce, for batching budgets (pure int arithmetic).

Both families shrink an image so that a patch *count* stays under a limit `L` and then round each side up
(or, Kimi-VL without padding, down) to a multiple of the merge kernel. A sliver-shaped image therefore
yields more than `L` patches: a 7125x125 image under Kimi-VL's rules has 508x8 = 4064 <= 4096 whole
patches, so it is not resized, and padding makes its grid 510x10 = 5100 patches. This module bounds that
excess exactly enough for the batcher to guarantee that any accepted image fits one batch.

Derivation (shared by both families; `p` patch size, `(kh, kw)` merge kernel):

- Every accepted image has reals `u, v >= 0` with `u * v <= L` such that its width in patches before the
  rounding, `t_w`, satisfies `t_w < u + 1` (and likewise `t_h < v + 1`):
  - not resized: `u = w // p`, `v = h // p` (the limit test passed, so `u * v <= L`), `t_w = w / p < u + 1`;
  - resized by `s < 1` with `s**2 * A * B <= L` (`A`, `B` the whole-patch counts used in the limit
    test): `u = A * s`, `v = B * s`; `t_w = int(w * s) / p <= w * s / p < (A + 1) * s <= u + 1`.
- The grid side is a multiple of the kernel, `gw = kw * ceil(t_w / kw)` (or `floor`, which is smaller).
  So `gw > t_w - kw` hence `u > gw - kw - 1 =: d`, and then `v <= L / u < L / d`, which caps
  `gh <= kh * ceil((L / d + 1) / kh)`. Each side is also capped by the family's side limit (`max_gh`, `max_gw`).
- Taking the largest `gh` allowed for each possible `gw` and the best product gives the bound. It is an
  upper bound (the true maximum is a little lower because `u`, `v` come from integers); the tests check
  that it is within 5 % of sizes actually found for the released configs. With Kimi-VL `pad_input: false`
  (rounding down) it is about 20 % loose, which is safe.

Floating-point rounding in the resize (`s * s * A * B` may exceed `L` by an ulp) is absorbed by using
`L // (d * kh) + 1` for the ceiling, which is never smaller than the exact ceiling.
"""

from __future__ import annotations


def max_patches_bound(limit: int, kernel: tuple[int, int], max_grid_hw: tuple[int, int]) -> int:
    """Largest `grid_h * grid_w` an accepted image can reach (see the module docstring for the proof).

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
