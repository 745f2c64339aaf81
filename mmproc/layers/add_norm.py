"""Residual add + norm of the MoonViT blocks (LayerNorm for Kimi-VL / K2.5, RMSNorm for K3): the plain path, the
fused Triton path, and the choice between them. Both return (x + y, norm(x + y)); the fused one updates x in place.

RMSNorm eps: K3 builds `nn.RMSNorm(dim)` without one, so torch uses float32's (1.19e-7) even for bf16 input;
`rms_eps` gives the fused kernel the same value.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmproc.layers import add_norm_triton

logger = logging.getLogger(__name__)

Norm = nn.LayerNorm | nn.RMSNorm

# (x (L, D), y (L, D), norm) -> (x + y, norm(x + y)). The fused path updates x in place and returns it.
AddNormFn = Callable[[Tensor, Tensor, Norm], tuple[Tensor, Tensor]]


def make_norm(kind: str, dim: int, eps: float | None) -> Norm:
    """ "layernorm" (weight + bias) or "rmsnorm" (weight only; eps None = torch's default, see above)."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=1e-5 if eps is None else eps)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")


def rms_eps(norm: nn.RMSNorm, dtype: torch.dtype) -> float:
    """The eps torch's RMSNorm uses for inputs of `dtype` (eps None: that of its float32 or float64 math)."""
    if norm.eps is not None:
        return norm.eps
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def apply_norm(x: Tensor, norm: Norm) -> Tensor:
    """norm(x) as the module computes it (F.layer_norm / F.rms_norm)."""
    if isinstance(norm, nn.RMSNorm):
        return F.rms_norm(x, norm.normalized_shape, norm.weight, rms_eps(norm, x.dtype))
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def add_norm(x: Tensor, y: Tensor, norm: Norm) -> tuple[Tensor, Tensor]:
    """Plain path: a new residual tensor x + y, then the norm over it."""
    x = x + y
    return x, apply_norm(x, norm)


def fused_add_norm(x: Tensor, y: Tensor, norm: Norm) -> tuple[Tensor, Tensor]:
    """Fused path: x += y in place and its norm in one Triton launch (float32 math, same rounding of the sum)."""
    if isinstance(norm, nn.RMSNorm):
        return x, add_norm_triton.add_rms_norm_(x, y, norm.weight, rms_eps(norm, x.dtype))
    return x, add_norm_triton.add_layer_norm_(x, y, norm.weight, norm.bias, norm.eps)


def select_add_norm(device: torch.device, dtype: torch.dtype, width: int, kind: str) -> tuple[str, AddNormFn]:
    """Fused Triton add + norm on CUDA when available and it passes a probe, else the plain `add_norm`."""
    if device.type == "cuda" and add_norm_triton.available() and _probe_add_norm(device, dtype, width, kind):
        return "triton", fused_add_norm
    return "eager", add_norm


def _probe_add_norm(device: torch.device, dtype: torch.dtype, width: int, kind: str) -> bool:
    """Run the fused kernel once on (3, width) rows (compiling it) and compare with the plain path; a failure
    (a Triton/driver problem on this host) means the plain path, with a warning, never a failed service."""
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(3, width, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
    norm = make_norm(kind, width, None).to(device=device, dtype=dtype)
    try:
        with torch.no_grad():
            for param in norm.parameters():
                param.copy_(0.1 * torch.randn(width, generator=gen))
            norm.weight.add_(1.0)
            want_x, want = add_norm(x, y, norm)
            got_x, got = fused_add_norm(x.clone(), y, norm)
        close = (torch.allclose(a.float(), b.float(), atol=2e-2, rtol=2e-2) for a, b in ((got_x, want_x), (got, want)))
        return all(close)
    except Exception:
        logger.warning("fused add + %s failed its probe on %s/%s", kind, device, dtype, exc_info=True)
        return False
