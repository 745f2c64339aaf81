"""Residual add + LayerNorm of the MoonViT blocks: the plain path, the fused Triton path, and the choice between them.

Both return (x + y, LayerNorm(x + y)); the fused one updates x in place (the caller's residual stream) and runs
one kernel (mmproc/model/add_norm_triton.py) instead of an add and a layer_norm pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmproc.model import add_norm_triton

logger = logging.getLogger(__name__)


# (x (L, D), y (L, D), norm) -> (x + y, norm(x + y)). The fused path updates x in place and returns it.
AddNormFn = Callable[[Tensor, Tensor, nn.LayerNorm], tuple[Tensor, Tensor]]


def add_layer_norm(x: Tensor, y: Tensor, norm: nn.LayerNorm) -> tuple[Tensor, Tensor]:
    """Plain path: a new residual tensor x + y, then `F.layer_norm` over it (what nn.LayerNorm runs)."""
    x = x + y
    return x, F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def fused_add_layer_norm(x: Tensor, y: Tensor, norm: nn.LayerNorm) -> tuple[Tensor, Tensor]:
    """Fused path: x += y in place and its LayerNorm in one Triton launch (float32 math, same rounding)."""
    return x, add_norm_triton.add_layer_norm_(x, y, norm.weight, norm.bias, norm.eps)


def select_add_norm(device: torch.device, dtype: torch.dtype, width: int) -> tuple[str, AddNormFn]:
    """Fused Triton add + LayerNorm on CUDA when available and it passes a probe, else the plain `add_layer_norm`."""
    if device.type == "cuda" and add_norm_triton.available() and _probe_add_norm(device, dtype, width):
        return "triton", fused_add_layer_norm
    return "eager", add_layer_norm


def _probe_add_norm(device: torch.device, dtype: torch.dtype, width: int) -> bool:
    """Run the fused kernel once on (3, width) rows (compiling it) and compare with the plain path; a failure
    (a Triton/driver problem on this host) means the plain path, with a warning, never a failed service."""
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(3, width, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
    norm = nn.LayerNorm(width, eps=1e-5, device=device, dtype=dtype)
    try:
        with torch.no_grad():
            norm.weight.copy_(1 + 0.1 * torch.randn(width, generator=gen))
            norm.bias.copy_(0.1 * torch.randn(width, generator=gen))
            want_x, want = add_layer_norm(x, y, norm)
            got_x, got = fused_add_layer_norm(x.clone(), y, norm)
        close = (torch.allclose(a.float(), b.float(), atol=2e-2, rtol=2e-2) for a, b in ((got_x, want_x), (got, want)))
        return all(close)
    except Exception:
        logger.warning("fused add + LayerNorm failed its probe on %s/%s", device, dtype, exc_info=True)
        return False
