"""Dynamic per-token FP8 (e4m3) quantization of activations in one Triton pass (the fast path of
`fp8.quantize_rows`): each row's absolute max, its scale amax / 448 and the row divided by it, saturated and
rounded to e4m3. Reads the (M, K) bf16 input once and writes (M, K) bytes plus (M,) float32 scales, where the
plain torch path takes five passes. With `gelu_tanh`, GELU (tanh approximation) is applied first, in float32: the
MLP's fc0 output goes to fc1 in one pass instead of a GELU pass and a quantizer pass. Triton is optional: call
`available()` first.
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

__all__ = ["available", "quantize_rows"]

_MAX_WIDTH = 16384  # one row lives in registers, as in add_norm_triton


def available() -> bool:
    """True when the kernel can run: Triton is importable and a CUDA device is present."""
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _quantize_rows_kernel(
        x_ptr,  # (M, K) input, last dim contiguous
        q_ptr,  # (M, K) float8_e4m3fn output, contiguous
        s_ptr,  # (M,) float32 scales
        n_cols,  # K
        x_row_stride,
        fp8_max,  # 448.0
        min_scale,  # an all-zero row gets this scale, not 0 (no division by zero)
        BLOCK_K: tl.constexpr,  # power of two >= K; lanes >= K are masked
        GELU_TANH: tl.constexpr,  # gelu_tanh(x) is quantized instead of x
    ):
        row = tl.program_id(0).to(tl.int64)  # 64-bit offsets: M * K may pass 2**31
        cols = tl.arange(0, BLOCK_K)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        if GELU_TANH:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); tanh(u) = 1 - 2 / (exp(2u) + 1), inf-safe
            u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            x = 0.5 * x * (2.0 - 2.0 / (tl.exp(2.0 * u) + 1.0))
        scale = tl.maximum(tl.max(tl.abs(x), axis=0) / fp8_max, min_scale)
        q = tl.minimum(tl.maximum(x / scale, -fp8_max), fp8_max)  # saturate: e4m3fn has no inf
        tl.store(q_ptr + row * n_cols + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(s_ptr + row, scale)


def quantize_rows(x: Tensor, fp8_max: float, min_scale: float, gelu_tanh: bool = False) -> tuple[Tensor, Tensor]:
    """x (M, K) bf16/fp16/fp32 CUDA -> (M, K) float8_e4m3fn, (M, 1) float32 scales (of gelu_tanh(x) if asked)."""
    m, k = x.shape
    if k > _MAX_WIDTH:
        raise ValueError(f"rows of {k} elements exceed the kernel's {_MAX_WIDTH}")
    if x.stride(1) != 1:
        x = x.contiguous()
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        block = triton.next_power_of_2(k)
        warps = 4 if block <= 2048 else 8
        _quantize_rows_kernel[(m,)](
            x, q, scales, k, x.stride(0), fp8_max, min_scale, BLOCK_K=block, GELU_TANH=gelu_tanh, num_warps=warps
        )
    return q, scales
