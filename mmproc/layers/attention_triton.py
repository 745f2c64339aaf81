"""Varlen block-diagonal attention for head dims that are not a power of two (MoonViT: 72), as one Triton kernel.

Why: the fast SDPA kernels (cuDNN, flash) pad dh = 72 to 128, so 44% of their tensor-core work is padding, and
they take one image per call for long segments. Here each head is split into a power-of-two part and a small
remainder (72 = 64 + 8, the 8 zero-padded to 16 lanes: the smallest tensor-core K), so only 10% of the work is
padding, and one launch covers every image of a packed batch, short or long.

One program computes BLOCK_M query rows of one (segment, head) with the online softmax (FlashAttention 2's
forward): scores and the running max/sum in float32, exp2 with the scale folded in, P cast to the input dtype
for the P @ V product. Segment bounds come from `cu_seqlens` on the device; programs past their segment's end
return at once, so the grid needs only the longest segment (a CPU int): no host sync, graph-capturable.

Triton is optional: this module imports without it; call `available()` first.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

try:  # optional: CPU-only installs never reach the fast path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None
    tl = None

__all__ = ["available", "split_head_dim", "varlen_attention"]

_LOG2_E = 1.4426950408889634


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


def split_head_dim(head_dim: int) -> tuple[int, int]:
    """(lo, hi) lanes: lo the largest power of two <= head_dim (at least 16), hi the remainder rounded up to a
    power of two of at least 16, or 0 when head_dim is a power of two. 72 -> (64, 16); 128 -> (128, 0)."""
    lo = max(16, 1 << (head_dim.bit_length() - 1))
    rest = head_dim - lo
    return lo, (max(16, 1 << (rest - 1).bit_length()) if rest > 0 else 0)


# Tiles (BLOCK_M, BLOCK_N, warps, stages), chosen per (head dim, short/long segments) by timing at the first call.
_CONFIGS = ((128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3))

if triton is not None:

    @triton.jit
    def _attend(
        q_lo,
        q_hi,
        acc_lo,
        acc_hi,
        row_max,
        row_sum,
        K,
        V,
        key0,  # first key row of this block, absolute
        keys_left,  # keys of the segment from key0 on
        stride_kl,
        stride_vl,
        qk_scale,
        HEAD_DIM: tl.constexpr,
        D_LO: tl.constexpr,
        D_HI: tl.constexpr,
        BLOCK_N: tl.constexpr,
        MASKED: tl.constexpr,  # only the segment's last, partial block needs the key mask
    ):
        """One BLOCK_N block of keys into the running (max, sum, acc) of the online softmax."""
        cols = tl.arange(0, BLOCK_N)
        lo = tl.arange(0, D_LO)
        key_ok = cols < keys_left
        k_cols = K + (key0 + cols).to(tl.int64)[None, :] * stride_kl  # K^T tiles (lanes x keys)
        v_rows = V + (key0 + cols).to(tl.int64)[:, None] * stride_vl
        if MASKED:
            k_lo = tl.load(k_cols + lo[:, None], mask=key_ok[None, :], other=0.0)
        else:
            k_lo = tl.load(k_cols + lo[:, None])
        scores = tl.dot(q_lo, k_lo)
        if D_HI > 0:
            hi = D_LO + tl.arange(0, D_HI)
            lane_ok = hi < HEAD_DIM  # lanes past the head are other heads' data (or past the end): never read
            if MASKED:
                k_hi = tl.load(k_cols + hi[:, None], mask=key_ok[None, :] & lane_ok[:, None], other=0.0)
            else:
                k_hi = tl.load(k_cols + hi[:, None], mask=lane_ok[:, None], other=0.0)
            scores = tl.dot(q_hi, k_hi, scores)
        scores = scores * qk_scale
        if MASKED:
            scores = tl.where(key_ok[None, :], scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        p = tl.math.exp2(scores - new_max[:, None])
        alpha = tl.math.exp2(row_max - new_max)
        row_sum = row_sum * alpha + tl.sum(p, 1)
        p = p.to(V.dtype.element_ty)
        if MASKED:
            v_lo = tl.load(v_rows + lo[None, :], mask=key_ok[:, None], other=0.0)
        else:
            v_lo = tl.load(v_rows + lo[None, :])
        acc_lo = tl.dot(p, v_lo, acc_lo * alpha[:, None])
        if D_HI > 0:
            hi = D_LO + tl.arange(0, D_HI)
            lane_ok = hi < HEAD_DIM
            if MASKED:
                v_hi = tl.load(v_rows + hi[None, :], mask=key_ok[:, None] & lane_ok[None, :], other=0.0)
            else:
                v_hi = tl.load(v_rows + hi[None, :], mask=lane_ok[None, :], other=0.0)
            acc_hi = tl.dot(p, v_hi, acc_hi * alpha[:, None])
        return acc_lo, acc_hi, new_max, row_sum

    @triton.jit
    def _varlen_fwd(
        Q,
        K,
        V,
        Out,
        cu_seqlens,
        stride_ql,
        stride_qh,
        stride_kl,
        stride_kh,
        stride_vl,
        stride_vh,
        stride_ol,
        stride_oh,
        num_heads,
        qk_scale,  # softmax scale * log2(e): exp2 of scaled scores
        HEAD_DIM: tl.constexpr,
        D_LO: tl.constexpr,
        D_HI: tl.constexpr,
        LONG: tl.constexpr,  # autotune key only: segments of 1024 patches or more
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        segment = tl.program_id(1) // num_heads
        head = tl.program_id(1) % num_heads
        start = tl.load(cu_seqlens + segment)
        seqlen = tl.load(cu_seqlens + segment + 1) - start
        m0 = tl.program_id(0) * BLOCK_M
        if m0 >= seqlen:
            return
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < seqlen
        lo = tl.arange(0, D_LO)
        hi = D_LO + tl.arange(0, D_HI if D_HI > 0 else 16)
        lane_ok = hi < HEAD_DIM
        q_rows = Q + (start + rows).to(tl.int64)[:, None] * stride_ql + head * stride_qh
        q_lo = tl.load(q_rows + lo[None, :], mask=row_ok[:, None], other=0.0)
        # Zero lanes past the head: they make the K lanes they meet irrelevant. (A 16-lane placeholder when the
        # head dim is a power of two; `_attend` then never reads it.)
        q_hi = tl.load(q_rows + hi[None, :], mask=row_ok[:, None] & lane_ok[None, :] & (D_HI > 0), other=0.0)
        row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        row_sum = tl.zeros([BLOCK_M], tl.float32)
        acc_lo = tl.zeros([BLOCK_M, D_LO], tl.float32)
        acc_hi = tl.zeros([BLOCK_M, D_HI if D_HI > 0 else 16], tl.float32)
        K += start.to(tl.int64) * stride_kl + head * stride_kh
        V += start.to(tl.int64) * stride_vl + head * stride_vh
        full_blocks_end = (seqlen // BLOCK_N) * BLOCK_N
        for n0 in range(0, full_blocks_end, BLOCK_N):
            acc_lo, acc_hi, row_max, row_sum = _attend(
                q_lo, q_hi, acc_lo, acc_hi, row_max, row_sum, K, V, n0, seqlen - n0, stride_kl, stride_vl,
                qk_scale, HEAD_DIM, D_LO, D_HI, BLOCK_N, False,
            )  # fmt: skip
        if full_blocks_end < seqlen:
            acc_lo, acc_hi, row_max, row_sum = _attend(
                q_lo, q_hi, acc_lo, acc_hi, row_max, row_sum, K, V, full_blocks_end, seqlen - full_blocks_end,
                stride_kl, stride_vl, qk_scale, HEAD_DIM, D_LO, D_HI, BLOCK_N, True,
            )  # fmt: skip
        o_rows = Out + (start + rows).to(tl.int64)[:, None] * stride_ol + head * stride_oh
        inv = 1.0 / row_sum
        tl.store(o_rows + lo[None, :], (acc_lo * inv[:, None]).to(Out.dtype.element_ty), mask=row_ok[:, None])
        if D_HI > 0:
            out_hi = (acc_hi * inv[:, None]).to(Out.dtype.element_ty)
            tl.store(o_rows + hi[None, :], out_hi, mask=row_ok[:, None] & lane_ok[None, :])

    _tuned_fwd = triton.autotune(
        configs=[triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in _CONFIGS],
        key=["HEAD_DIM", "LONG"],
    )(_varlen_fwd)


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int) -> Tensor:
    """q, k, v (L, H, dh) fp16/bf16 CUDA views with a contiguous last dim (row-strided views of one qkv tensor
    are fine); cu_seqlens (N + 1,) int32 on the same device; max_seqlen a Python int. Returns (L, H, dh)
    contiguous, softmax scale 1/sqrt(dh), attention within each segment only."""
    length, heads, head_dim = q.shape
    out = torch.empty((length, heads, head_dim), dtype=q.dtype, device=q.device)
    lo, hi = split_head_dim(head_dim)
    segments = cu_seqlens.shape[0] - 1

    def grid(meta: dict) -> tuple[int, int]:
        return (triton.cdiv(max_seqlen, meta["BLOCK_M"]), segments * heads)

    if q.device.type == "cuda":
        kernel, tiles = _tuned_fwd, {}
    else:  # Triton's interpreter (TRITON_INTERPRET=1, the CPU tests) cannot time configs
        kernel, tiles = _varlen_fwd, {"BLOCK_M": _CONFIGS[0][0], "BLOCK_N": _CONFIGS[0][1]}
    kernel[grid](
        q,
        k,
        v,
        out,
        cu_seqlens,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        heads,
        _LOG2_E / math.sqrt(head_dim),
        HEAD_DIM=head_dim,
        D_LO=lo,
        D_HI=hi,
        LONG=max_seqlen >= 1024,
        **tiles,
    )
    return out
