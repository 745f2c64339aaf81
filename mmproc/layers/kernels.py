"""The tower's optional fast paths, chosen once per (device, dtype) with a plain fallback for each.

`KernelOptions` says which fast paths a tower may use; `select_kernels` turns them into the functions one
(device, dtype) runs, with names for the start-up log and the benches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mmproc.layers import rope_triton
from mmproc.layers.add_norm import AddNormFn, add_norm, select_add_norm
from mmproc.layers.attention import LONG_SEGMENT, AttentionFn, select_attention
from mmproc.layers.rope import apply_rope

# (q, k, cos, sin) -> rotated (q, k); q/k are views of the wqkv output and may be rotated in place.
RopeFn = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]

# (x (L, D_in), weight (D_out, D_in), bias (D_out,) or None) -> gelu_tanh(x @ weight.T + bias) (L, D_out)
LinearGeluFn = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]


def _fused_rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    rope_triton.apply_rope_(q, k, cos, sin)  # in place, one launch for q and k
    return q, k


def select_rope(device: torch.device) -> tuple[str, RopeFn]:
    """Fused Triton RoPE on CUDA when available, else the plain `apply_rope` (same math, float32)."""
    if device.type == "cuda" and rope_triton.available():
        return "triton", _fused_rope
    return "eager", apply_rope


def linear_gelu_tanh(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Plain path: matmul (+ bias in the epilogue), then a separate GELU(tanh) pass over the (L, D_out) output."""
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def addmm_gelu_tanh(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Fused path: cuBLASLt's GELU_BIAS epilogue (the tanh approximation, on the float32 accumulator), so the
    (L, D_out) output is written once instead of written, read and written again. Bias-free layers (K3) pass
    a zero bias: the epilogue needs one, and adding 0 changes no value."""
    if bias is None:
        bias = _zero_bias(weight.shape[0], weight.dtype, weight.device)
    return torch._addmm_activation(bias, x, weight.t(), use_gelu=True)


@functools.lru_cache(maxsize=16)
def _zero_bias(size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """One zero (size,) tensor per shape, dtype and device, made once (not per layer and forward); read-only."""
    with torch.inference_mode(False):  # a plain tensor, usable in and out of inference mode
        return torch.zeros(size, dtype=dtype, device=device)


@dataclass(frozen=True)
class KernelOptions:
    """Which optional fast paths the tower may use where the device/dtype allows; chosen once, never per call.

    fused_rope: Triton RoPE (CUDA). fused_gelu: cuBLASLt bias+GELU epilogue for mlp.fc0 (CUDA, fp16/bf16).
    uniform_attention: a batch of equal-size images runs one batched SDPA call instead of the varlen kernel.
    long_segment: patches from which a segment leaves the varlen kernel for its own SDPA call.
    sdpa_backend: "auto" or the SDPA backend to try first ("cudnn", "flash", "efficient"; CUDA only).
    fused_add_norm: each residual add and the norm after it as one Triton kernel (CUDA).
    attention_streams: CUDA streams the per-segment attention calls of a mixed batch are spread over (1: none).
    attention_backend: "auto" (the fastest that loads and passes its probe) or one name of ATTENTION_BACKENDS.
    The defaults were chosen by `mmproc bench encoder --variants` (docs/benchmarks/encoder.md).
    """

    fused_rope: bool = True
    fused_gelu: bool = True
    uniform_attention: bool = True
    long_segment: int = LONG_SEGMENT
    sdpa_backend: str = "auto"
    fused_add_norm: bool = True
    attention_streams: int = 1
    attention_backend: str = "auto"


@dataclass(frozen=True)
class Kernels:
    """The functions selected for one (device, dtype) under `KernelOptions`, with names for logs and benches."""

    attn_fn: AttentionFn
    rope_fn: RopeFn
    fc0_gelu: LinearGeluFn
    add_norm: AddNormFn
    names: tuple[str, str, str, str]  # (attention, rope, fc0+gelu, add+norm)


def select_kernels(
    device: torch.device,
    dtype: torch.dtype,
    *,
    num_heads: int,
    head_dim: int,
    width: int,
    norm: str,
    options: KernelOptions,
) -> Kernels:
    """Kernels for a tower of `num_heads` x `head_dim` attention and residual `width` normalised by `norm`."""
    attn_name, attn_fn = select_attention(
        device,
        dtype,
        num_heads,
        head_dim,
        backend=options.attention_backend,
        long_segment=options.long_segment,
        uniform_batched=options.uniform_attention,
        sdpa_backend=options.sdpa_backend,
        streams=options.attention_streams,
    )
    rope_name, rope_fn = select_rope(device) if options.fused_rope else ("eager", apply_rope)
    fused_gelu = options.fused_gelu and device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
    gelu_name, gelu_fn = ("addmm_gelu", addmm_gelu_tanh) if fused_gelu else ("eager", linear_gelu_tanh)
    norm_name, norm_fn = select_add_norm(device, dtype, width, norm) if options.fused_add_norm else ("eager", add_norm)
    return Kernels(attn_fn, rope_fn, gelu_fn, norm_fn, (attn_name, rope_name, gelu_name, norm_name))
