"""Fused in-place 2D RoPE for MoonViT (the fast path of `mmproc.layers.rope.apply_rope`), as Triton kernels.

The pair layout lives in the per-token cos/sin rows (see rope.py), so the kernel is a plain per-pair rotation of
q and k together, in place, in one memory-bound pass, math in float32. q and k may be strided views straight out
of the fused wqkv, so the plain path's split copies and upcasts disappear. CUDA-graph safe (no sync, no
allocation), but the first call per (dtype, dh, H, alignment) compiles: warm up before capture. Triton is
optional: call `available()` first.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton is an optional dependency: CPU-only installs (CI, laptops) never reach the fast path.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None
    tl = None

__all__ = ["apply_rope_", "apply_rope_qkv_", "available"]

_MAX_HEAD_DIM = 256
# Tile of one program, in padded lanes per tensor (MoonViT: 2 tokens x 16 heads): enough programs per SM to hide
# memory latency (docs/benchmarks/rope.md); `python -m benchmarks.rope_kernels --sweep` times the neighbours.
_TILE = 4096
_NUM_WARPS = 4
# How the interleaved pairs are read. Reshape (default): contiguous tiles with 16-byte vector accesses, pairs split
# in registers. Stride-2: even/odd pointers, scalar accesses only (8x the memory instructions). Both are swept.
PAIRS_RESHAPE = 0
PAIRS_STRIDED = 1


def available() -> bool:
    """True when the fused kernels can run: Triton is importable and a CUDA device is present."""
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _rope_kernel(
        q_ptr,
        k_ptr,
        cos_ptr,
        sin_ptr,
        seq_len,
        num_heads,
        q_sl,  # strides of q/k in units of VEC elements (so the compiler can prove 16-byte alignment)
        q_sh,
        k_sl,
        k_sh,
        cs_sl,  # row stride of cos/sin in elements (= dh/2 for contiguous tables)
        DH: tl.constexpr,  # head dim (even)
        DP: tl.constexpr,  # next power of two >= DH (lanes per head, masked above DH)
        VEC: tl.constexpr,  # every q/k row/head offset is a multiple of VEC elements
        BLOCK_L: tl.constexpr,
        BLOCK_H: tl.constexpr,
        PAIRS: tl.constexpr,  # PAIRS_RESHAPE or PAIRS_STRIDED
        I64: tl.constexpr,  # 64-bit offsets when the views span >= 2**31 elements
    ):
        # Program (pid_l, pid_h) rotates tokens [pid_l * BLOCK_L, +BLOCK_L) x heads [pid_h * BLOCK_H, +BLOCK_H)
        # of both q and k; the cos/sin rows of its tokens are loaded once and shared by all heads and by q, k.
        pid_l = tl.program_id(0)
        pid_h = tl.program_id(1)
        rows = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)  # (BLOCK_L,)
        heads = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)  # (BLOCK_H,)
        if I64:
            rows = rows.to(tl.int64)
        pairs = tl.arange(0, DP // 2)  # (DP/2,)
        row_ok = rows < seq_len
        head_ok = heads < num_heads

        # cos/sin (BLOCK_L, 1, DP/2) float32, broadcast over heads.
        cs_off = rows[:, None] * cs_sl + pairs[None, :]
        cs_mask = row_ok[:, None] & (pairs[None, :] < DH // 2)
        c = tl.load(cos_ptr + cs_off, mask=cs_mask, other=0.0)[:, None, :]
        s = tl.load(sin_ptr + cs_off, mask=cs_mask, other=0.0)[:, None, :]

        # Start of each (token, head) row, (BLOCK_L, BLOCK_H, 1); a multiple of VEC by construction.
        q_row = (rows[:, None] * (q_sl * VEC) + heads[None, :] * (q_sh * VEC))[:, :, None]
        k_row = (rows[:, None] * (k_sl * VEC) + heads[None, :] * (k_sh * VEC))[:, :, None]
        rh_ok = (row_ok[:, None] & head_ok[None, :])[:, :, None]  # (BLOCK_L, BLOCK_H, 1)

        if PAIRS == 0:
            # Contiguous (BLOCK_L, BLOCK_H, DP) tiles: 16-byte vector loads/stores; the interleaved pairs are
            # separated in registers by a reshape to (..., DP/2, 2) + split (no data movement between threads).
            lanes = tl.arange(0, DP)[None, None, :]
            mask = rh_ok & (lanes < DH)
            q_ptrs = q_ptr + (q_row + lanes)
            k_ptrs = k_ptr + (k_row + lanes)
            xq = tl.load(q_ptrs, mask=mask, other=0.0)
            xk = tl.load(k_ptrs, mask=mask, other=0.0)
            q0, q1 = tl.split(tl.reshape(xq.to(tl.float32), (BLOCK_L, BLOCK_H, DP // 2, 2)))
            k0, k1 = tl.split(tl.reshape(xk.to(tl.float32), (BLOCK_L, BLOCK_H, DP // 2, 2)))
            yq = tl.reshape(tl.join(q0 * c - q1 * s, q0 * s + q1 * c), (BLOCK_L, BLOCK_H, DP))
            yk = tl.reshape(tl.join(k0 * c - k1 * s, k0 * s + k1 * c), (BLOCK_L, BLOCK_H, DP))
            tl.store(q_ptrs, yq.to(q_ptr.dtype.element_ty), mask=mask)
            tl.store(k_ptrs, yk.to(k_ptr.dtype.element_ty), mask=mask)
        else:
            # Even and odd lanes through stride-2 pointers: no shuffles, but scalar (2-byte) accesses.
            even = 2 * pairs[None, None, :]
            mask = rh_ok & (pairs[None, None, :] < DH // 2)
            q_ptrs = q_ptr + (q_row + even)
            k_ptrs = k_ptr + (k_row + even)
            q0 = tl.load(q_ptrs, mask=mask, other=0.0).to(tl.float32)
            q1 = tl.load(q_ptrs + 1, mask=mask, other=0.0).to(tl.float32)
            k0 = tl.load(k_ptrs, mask=mask, other=0.0).to(tl.float32)
            k1 = tl.load(k_ptrs + 1, mask=mask, other=0.0).to(tl.float32)
            tl.store(q_ptrs, (q0 * c - q1 * s).to(q_ptr.dtype.element_ty), mask=mask)
            tl.store(q_ptrs + 1, (q0 * s + q1 * c).to(q_ptr.dtype.element_ty), mask=mask)
            tl.store(k_ptrs, (k0 * c - k1 * s).to(k_ptr.dtype.element_ty), mask=mask)
            tl.store(k_ptrs + 1, (k0 * s + k1 * c).to(k_ptr.dtype.element_ty), mask=mask)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def default_blocks(num_heads: int, head_dim: int) -> tuple[int, int]:
    """(BLOCK_L, BLOCK_H) of one program: all heads (up to 2048 padded lanes), then tokens up to _TILE lanes.

    For MoonViT (H=16, dh=72 -> 128 lanes): (2, 16), i.e. 2 tokens x 16 heads of q and k per program.
    """
    dp = _next_pow2(head_dim)
    block_h = min(_next_pow2(num_heads), max(1, _TILE // 2 // dp))
    return max(1, _TILE // (block_h * dp)), block_h


def _vec(t: Tensor, *strides: int) -> int:
    # Largest power-of-two element count <= 16 bytes that divides every stride: lets the kernel use vector
    # accesses (8 x bf16/fp16, 4 x fp32) when the views allow it and stay correct when they do not.
    vec = max(1, 16 // t.element_size())
    while vec > 1 and any(st % vec for st in strides):
        vec //= 2
    return vec


def _check(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> None:
    # Shape/stride checks only (host metadata, no device sync).
    if q.dim() != 3 or q.shape != k.shape:
        raise ValueError(f"q, k must both be (L, H, dh); got {tuple(q.shape)} and {tuple(k.shape)}")
    if q.dtype != k.dtype or q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"q, k must share a dtype in bf16/fp16/fp32; got {q.dtype}, {k.dtype}")
    seq, _, dh = q.shape
    if dh % 2 or not 2 <= dh <= _MAX_HEAD_DIM:
        raise ValueError(f"head dim {dh} must be even and <= {_MAX_HEAD_DIM}")
    if q.stride(2) != 1 or k.stride(2) != 1:
        raise ValueError("q, k must be contiguous in the head dim (stride 1)")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype != torch.float32 or tuple(t.shape) != (seq, dh // 2) or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous float32 ({seq}, {dh // 2}); got {t.dtype} {tuple(t.shape)}")
    if not (q.device == k.device == cos.device == sin.device):
        raise ValueError("q, k, cos, sin must be on one device")


def _launch(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    *,
    pairs: int = PAIRS_RESHAPE,
    block_l: int | None = None,
    block_h: int | None = None,
    num_warps: int = _NUM_WARPS,
) -> object:
    """Launch the kernel on validated inputs; returns Triton's compiled-kernel handle (None when empty).

    The keyword overrides are for the benchmark sweep (`benchmarks.rope_kernels --sweep`) only.
    """
    if triton is None:
        raise RuntimeError("Triton is not installed: the fused RoPE path is unavailable (see available())")
    seq, heads, dh = q.shape
    if seq == 0 or heads == 0:
        return None
    dp = _next_pow2(dh)
    default_l, default_h = default_blocks(heads, dh)
    bl, bh = block_l or default_l, block_h or default_h
    vec = _vec(q, q.stride(0), q.stride(1), k.stride(0), k.stride(1))
    span = max((seq - 1) * t.stride(0) + (heads - 1) * t.stride(1) + dh for t in (q, k))
    grid = (triton.cdiv(seq, bl), triton.cdiv(heads, bh))
    return _rope_kernel[grid](
        q,
        k,
        cos,
        sin,
        seq,
        heads,
        q.stride(0) // vec,
        q.stride(1) // vec,
        k.stride(0) // vec,
        k.stride(1) // vec,
        cos.stride(0),
        DH=dh,
        DP=dp,
        VEC=vec,
        BLOCK_L=bl,
        BLOCK_H=bh,
        PAIRS=pairs,
        I64=span >= 2**31 or seq * cos.stride(0) >= 2**31,
        num_warps=num_warps,
    )


def apply_rope_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> None:
    """Rotate q and k IN PLACE by the per-token angles: the fused equivalent of `rope.apply_rope`.

    q, k: (L, H, dh) bf16/fp16/fp32 on CUDA, any strides with the head dim contiguous (e.g. the q/k views of
    `qkv.view(L, 3, H, dh)`); dh even, <= 256. cos, sin: (L, dh/2) float32 contiguous, same device.
    Math in float32, results stored in the input dtype. One launch for both tensors; no sync, no allocation.
    """
    _check(q, k, cos, sin)
    _launch(q, k, cos, sin)


def apply_rope_qkv_(qkv: Tensor, cos: Tensor, sin: Tensor, num_heads: int) -> None:
    """Rotate the q and k parts of a fused projection output IN PLACE; v is untouched.

    qkv: (L, 3 * H * dh) with the last dim contiguous (the wqkv output), laid out as (L, 3, H, dh).
    cos, sin: (L, dh/2) float32 contiguous.
    """
    if qkv.dim() != 2 or qkv.shape[1] % (3 * num_heads) or qkv.stride(1) != 1:
        raise ValueError(f"qkv must be (L, 3 * {num_heads} * dh) with a contiguous last dim; got {tuple(qkv.shape)}")
    seq = qkv.shape[0]
    view = qkv.view(seq, 3, num_heads, qkv.shape[1] // (3 * num_heads))  # (L, 3, H, dh), no copy
    apply_rope_(view[:, 0], view[:, 1], cos, sin)
