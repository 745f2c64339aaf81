"""Fused residual add + LayerNorm / RMSNorm for the MoonViT blocks (the fast path of `add_norm.add_norm`), in Triton.

One program per row, math in float32: `x <- round(x + y)` in place, then the norm of that rounded sum, as the
plain path does (so the residual stream is bit-identical to torch's add). 4 x D elements of traffic instead of
5 x D and one launch instead of two. Triton is optional: call `available()` first.
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

__all__ = ["add_layer_norm_", "add_rms_norm_", "available"]

_MAX_WIDTH = 16384  # one row lives in registers: 16k float32 lanes over 8 warps is 64 per thread
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def available() -> bool:
    """True when the fused kernel can run: Triton is importable and a CUDA device is present."""
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _add_layer_norm_kernel(
        x_ptr,  # (L, D) residual stream, updated in place
        y_ptr,  # (L, D) branch output added to it
        out_ptr,  # (L, D) LayerNorm of the sum
        w_ptr,  # (D,) LayerNorm weight
        b_ptr,  # (D,) LayerNorm bias (unused when RMS)
        n_cols,  # D
        x_row_stride,  # row strides in elements (the last dim is contiguous)
        y_row_stride,
        out_row_stride,
        eps,
        BLOCK_D: tl.constexpr,  # power of two >= D; lanes >= D are masked
        RMS: tl.constexpr,  # RMSNorm: no mean subtraction, no bias
    ):
        row = tl.program_id(0).to(tl.int64)  # 64-bit row offsets: L * D may pass 2**31
        cols = tl.arange(0, BLOCK_D)
        mask = cols < n_cols
        x_ptrs = x_ptr + row * x_row_stride + cols
        x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + row * y_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        s = (x + y).to(x_ptr.dtype.element_ty)  # round once, like torch's add in the storage dtype
        tl.store(x_ptrs, s, mask=mask)
        s = s.to(tl.float32)  # masked lanes hold 0 + 0 = 0 and add nothing to the sum
        if RMS:  # noqa: SIM108 - a constexpr branch, resolved when Triton compiles
            diff = s
        else:
            diff = tl.where(mask, s - tl.sum(s, axis=0) / n_cols, 0.0)
        var = tl.sum(diff * diff, axis=0) / n_cols
        rstd = tl.rsqrt(var + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        out = diff * rstd * w
        if not RMS:
            out += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * out_row_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def launch_config(width: int) -> tuple[int, int]:
    """(BLOCK_D, num_warps) for rows of `width`: 1152 -> (2048, 8), i.e. 8 lanes per thread (16-byte bf16 loads)."""
    block = max(16, _next_pow2(width))
    return block, min(8, max(1, block // 256))


def _check(x: Tensor, y: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    # Shape/dtype/stride checks only (host metadata, no device sync).
    if x.dim() != 2 or x.shape != y.shape:
        raise ValueError(f"x, y must both be (L, D); got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.dtype != y.dtype or x.dtype not in _DTYPES:
        raise ValueError(f"x, y must share a dtype in bf16/fp16/fp32; got {x.dtype}, {y.dtype}")
    width = x.shape[1]
    if not 1 <= width <= _MAX_WIDTH:
        raise ValueError(f"row width {width} must be in 1..{_MAX_WIDTH}")
    if x.stride(1) != 1 or y.stride(1) != 1:
        raise ValueError("x, y must be contiguous in the last dim (stride 1)")
    for name, t in (("weight", weight), ("bias", weight if bias is None else bias)):
        if tuple(t.shape) != (width,) or not t.is_contiguous() or t.dtype not in _DTYPES:
            raise ValueError(f"{name} must be a contiguous float ({width},) tensor; got {t.dtype} {tuple(t.shape)}")
    if not (x.device == y.device == weight.device == (weight if bias is None else bias).device):
        raise ValueError("x, y, weight, bias must be on one device")


def add_layer_norm_(x: Tensor, y: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """x += y IN PLACE, then return LayerNorm(x) over the last dim as a new (L, D) tensor in x's dtype.

    x, y: (L, D) bf16/fp16/fp32 on CUDA, same dtype, last dim contiguous (any row stride), D <= 16384.
    weight, bias: (D,) contiguous, same device. Math in float32; one launch; no sync.
    """
    return _launch(x, y, weight, bias, eps)


def add_rms_norm_(x: Tensor, y: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x += y IN PLACE, then return RMSNorm(x) (weight only) as a new (L, D) tensor; as `add_layer_norm_`."""
    return _launch(x, y, weight, None, eps)


def _launch(x: Tensor, y: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    _check(x, y, weight, bias)
    if triton is None:
        raise RuntimeError("Triton is not installed: the fused add + norm path is unavailable (see available())")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # (L, D), contiguous
    rows, width = x.shape
    if rows == 0:
        return out
    block, num_warps = launch_config(width)
    _add_layer_norm_kernel[(rows,)](
        x,
        y,
        out,
        weight,
        weight if bias is None else bias,
        width,
        x.stride(0),
        y.stride(0),
        out.stride(0),
        eps,
        BLOCK_D=block,
        RMS=bias is None,
        num_warps=num_warps,
    )
    return out
