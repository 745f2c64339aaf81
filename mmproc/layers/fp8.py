"""FP8 (e4m3) linear layers: weights quantized once per output channel, activations per token at run time.

y = (q_x * s_x) @ (q_w * s_w).T + b, with q_x (M, K) and q_w (N, K) float8_e4m3fn, s_x (M, 1) and s_w (1, N)
float32: `torch._scaled_mm`'s row-wise recipe (sm_89+), which accumulates in float32 and applies both scales and
the bias in its epilogue, writing bf16. Scales are amax / 448 (e4m3's largest finite value), so every row uses the
format's whole range; values past it saturate (e4m3fn has no inf). On the CPU the same math is emulated
(dequantize, float32 matmul) for tests and `bench accuracy`, never for serving (mmproc/models/quantize.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmproc.errors import ConfigError
from mmproc.layers import fp8_triton

logger = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
MIN_SCALE = 1e-12  # the scale of an all-zero row or channel: any positive value dequantizes it to zeros

# (x (M, K) float) -> (q (M, K) float8_e4m3fn, scales (M, 1) float32)
QuantizeFn = Callable[[Tensor], tuple[Tensor, Tensor]]
# (q_x (M, K) fp8, s_x (M, 1) f32, q_w.T (K, N) fp8 column-major, s_w (1, N) f32, bias (N,) or None, out dtype)
ScaledMmFn = Callable[[Tensor, Tensor, Tensor, Tensor, "Tensor | None", torch.dtype], Tensor]


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Plain path: x (M, K) -> q (M, K) float8_e4m3fn, scales (M, 1) float32; scale = max |row| / 448."""
    xf = x.float()
    scales = xf.abs().amax(dim=1, keepdim=True).div_(FP8_MAX).clamp_min_(MIN_SCALE)
    return quantize_with_scales(xf, scales), scales


def quantize_with_scales(x: Tensor, scales: Tensor) -> Tensor:
    """x / scales, saturated at +-448 and rounded to e4m3 (nearest, ties to even): float8_e4m3fn like x."""
    return (x.float() / scales).clamp_(-FP8_MAX, FP8_MAX).to(FP8)  # not in place: x.float() may be x


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight (N, K) float -> q (N, K) float8_e4m3fn, scales (N,) float32: one scale per output channel."""
    q, scales = quantize_rows(weight)
    return q, scales.view(-1)


def dequantize(q: Tensor, scales: Tensor) -> Tensor:
    """q (M, K) float8 and scales broadcastable to it -> float32 (M, K)."""
    return q.float() * scales


def within_one_step(q: Tensor, want: Tensor, scales: Tensor) -> bool:
    """Whether two quantizations of the same rows (scales (M, 1)) differ by at most one e4m3 step anywhere: a
    division rounded differently (GPU vs CPU) may move a value to its neighbour, never further."""
    a, b = dequantize(q, scales), dequantize(want, scales)
    step = torch.maximum(b.abs() * 2.0**-3, scales * 2.0**-9)  # a normal binade's step / the subnormal step
    return bool(((a - b).abs() <= step * 1.001).all())


def fast_quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Fused path of `quantize_rows` (one Triton pass, CUDA)."""
    return fp8_triton.quantize_rows(x, FP8_MAX, MIN_SCALE)


def quantize_gelu_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Plain path: quantize_rows(gelu_tanh(x)), the GELU rounded to x's dtype in between (as the bf16 model)."""
    return quantize_rows(F.gelu(x, approximate="tanh"))


def fast_quantize_gelu_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Fused path of `quantize_gelu_rows`: the GELU in float32 inside the quantizer's pass (CUDA)."""
    return fp8_triton.quantize_rows(x, FP8_MAX, MIN_SCALE, gelu_tanh=True)


def scaled_mm(
    q_x: Tensor, s_x: Tensor, w_t: Tensor, s_w: Tensor, bias: Tensor | None, out_dtype: torch.dtype
) -> Tensor:
    """torch._scaled_mm, row-wise scales, bias in the epilogue (CUDA, sm_89+)."""
    return torch._scaled_mm(q_x, w_t, scale_a=s_x, scale_b=s_w, bias=bias, out_dtype=out_dtype)


def scaled_mm_bias_after(
    q_x: Tensor, s_x: Tensor, w_t: Tensor, s_w: Tensor, bias: Tensor | None, out_dtype: torch.dtype
) -> Tensor:
    """torch._scaled_mm, then the bias as its own pass: for a torch whose row-wise epilogue refuses a bias."""
    y = torch._scaled_mm(q_x, w_t, scale_a=s_x, scale_b=s_w, out_dtype=out_dtype)
    return y if bias is None else y.add_(bias)


def emulated_scaled_mm(
    q_x: Tensor, s_x: Tensor, w_t: Tensor, s_w: Tensor, bias: Tensor | None, out_dtype: torch.dtype
) -> Tensor:
    """The scaled matmul's math on any device: dequantize, float32 matmul and bias, one rounding to out_dtype."""
    y = dequantize(q_x, s_x) @ dequantize(w_t, s_w)
    return (y if bias is None else y + bias.float()).to(out_dtype)


@dataclass(frozen=True)
class Fp8Kernels:
    """The activation quantizer and scaled matmul one device runs, with names for the start-up log and benches."""

    quantize: QuantizeFn
    quantize_gelu: QuantizeFn  # of gelu_tanh(x): the MLP's fc1 input
    matmul: ScaledMmFn
    names: tuple[str, str]  # (quantize, matmul)


EMULATED = Fp8Kernels(quantize_rows, quantize_gelu_rows, emulated_scaled_mm, ("eager", "emulated"))


class Fp8Linear(nn.Module):
    """nn.Linear with an FP8 weight (N, K), its per-channel scales (1, N) float32 and the bias kept in the model
    dtype. Input and output are in the model dtype; only the matmul's operands are FP8."""

    def __init__(self, qweight: Tensor, weight_scale: Tensor, bias: Tensor | None, kernels: Fp8Kernels) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight)  # (N, K) float8_e4m3fn, row-major: .t() is the column-major B
        self.register_buffer("weight_scale", weight_scale.reshape(1, -1).float().contiguous())  # (1, N)
        self.register_buffer("bias", bias)
        self.kernels = kernels

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernels: Fp8Kernels) -> Fp8Linear:
        """Quantize a loaded linear's weight (float32 math on its device); the bias stays as it is."""
        with torch.no_grad():
            qweight, scale = quantize_weight(linear.weight)
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(qweight, scale, bias, kernels)

    def forward(self, x: Tensor) -> Tensor:
        # x (..., K) model dtype -> (..., N) model dtype
        return self._matmul(*self.kernels.quantize(x.reshape(-1, self.in_features)), x)

    def forward_gelu_tanh(self, x: Tensor) -> Tensor:
        """self(gelu_tanh(x)), the GELU inside the activation quantizer's pass (the MLP's fc1)."""
        return self._matmul(*self.kernels.quantize_gelu(x.reshape(-1, self.in_features)), x)

    def _matmul(self, q: Tensor, scales: Tensor, x: Tensor) -> Tensor:
        y = self.kernels.matmul(q, scales, self.qweight.t(), self.weight_scale, self.bias, x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernels={self.kernels.names}"


def gelu_tanh_linear(linear: nn.Module, x: Tensor) -> Tensor:
    """linear(gelu_tanh(x)) (..., N): fused into the quantizer when `linear` is an Fp8Linear."""
    if isinstance(linear, Fp8Linear):
        return linear.forward_gelu_tanh(x)
    return linear(F.gelu(x, approximate="tanh"))


def select_fp8_kernels(device: torch.device, dtype: torch.dtype) -> Fp8Kernels:
    """The fused quantizer where Triton runs and matches the plain path, and the scaled matmul with the bias in its
    epilogue where this torch accepts it; each probed once on small tensors (a failure logs and takes the
    fallback, never fails the service). The caller has checked the device can run FP8 matmuls."""
    quantize, quantize_gelu, quantize_name = quantize_rows, quantize_gelu_rows, "eager"
    if fp8_triton.available() and _probe_quantize(device, dtype):
        quantize, quantize_gelu, quantize_name = fast_quantize_rows, fast_quantize_gelu_rows, "triton"
    matmul, matmul_name = scaled_mm, "scaled_mm"
    if not _probe_matmul(scaled_mm, device, dtype):
        matmul, matmul_name = scaled_mm_bias_after, "scaled_mm+bias"
        if not _probe_matmul(scaled_mm_bias_after, device, dtype):  # at start-up, not on the first request
            raise ConfigError(f"quantization fp8: torch {torch.__version__} has no row-wise FP8 matmul on {device}")
    return Fp8Kernels(quantize, quantize_gelu, matmul, (quantize_name, matmul_name))


def _probe_quantize(device: torch.device, dtype: torch.dtype) -> bool:
    x = torch.randn(5, 144, generator=torch.Generator().manual_seed(0)).mul_(3).to(device=device, dtype=dtype)
    try:
        q, s = fast_quantize_rows(x)
        want_q, want_s = quantize_rows(x)
        plain = torch.allclose(s, want_s, rtol=1e-6) and within_one_step(q, want_q, want_s)
        # GELU in float32 against GELU rounded to bf16 first: scales within bf16's rounding, values within a step
        q, s = fast_quantize_gelu_rows(x)
        want_q, want_s = quantize_gelu_rows(x)
        return plain and torch.allclose(s, want_s, rtol=2**-7) and within_one_step(q, want_q, want_s)
    except Exception:
        logger.warning("fused FP8 quantization failed its probe on %s/%s", device, dtype, exc_info=True)
        return False


def _probe_matmul(matmul: ScaledMmFn, device: torch.device, dtype: torch.dtype) -> bool:
    gen = torch.Generator().manual_seed(0)
    x, w, b = (
        torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for shape in ((32, 64), (48, 64), (48,))
    )
    try:
        q_x, s_x = quantize_rows(x)
        q_w, s_w = quantize_weight(w)
        got = matmul(q_x, s_x, q_w.t(), s_w.view(1, -1), b, dtype).float()
        want = emulated_scaled_mm(q_x, s_x, q_w.t(), s_w.view(1, -1), b, torch.float32)
        return torch.allclose(got, want, rtol=2e-2, atol=2e-2)
    except Exception:
        logger.warning(
            "FP8 scaled matmul (%s) failed its probe on %s/%s", matmul.__name__, device, dtype, exc_info=True
        )
        return False
