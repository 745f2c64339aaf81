"""FP8 quantization math (mmproc/layers/fp8.py) on small tensors against a float64 reference, on the CPU.

e4m3: 3 mantissa bits, so rounding to nearest moves a normal value (|v| >= 2**-6) by at most 2**-4 of itself, and
a subnormal one by at most half the subnormal step, 2**-10. The scaled matmul is emulated here (dequantize,
float32 matmul); the real kernel is checked against this emulation on a GPU (test_fp8_cuda.py).
"""

from __future__ import annotations

import pytest
import torch

from mmproc.layers.fp8 import (
    EMULATED,
    FP8,
    FP8_MAX,
    Fp8Linear,
    dequantize,
    emulated_scaled_mm,
    gelu_tanh_linear,
    quantize_rows,
    quantize_weight,
    quantize_with_scales,
    within_one_step,
)

U = 2.0**-4  # relative rounding bound of a normal e4m3 value
SUBNORMAL_HALF_STEP = 2.0**-10  # absolute rounding bound below e4m3's smallest normal (2**-6), in scaled units


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rounding_bound(x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Per element: the most quantize -> dequantize may move x (float64), normal or subnormal."""
    return torch.maximum(U * x.abs(), SUBNORMAL_HALF_STEP * scales.double())


def test_weight_scales_are_per_channel_amax_over_448():
    w = (
        torch.randn(24, 64, generator=gen(), dtype=torch.float64)
        * torch.logspace(-3, 2, 24, dtype=torch.float64)[:, None]
    )
    q, scales = quantize_weight(w.float())
    assert q.dtype == FP8 and q.shape == (24, 64) and scales.shape == (24,) and scales.dtype == torch.float32
    want = w.abs().amax(dim=1) / 448
    torch.testing.assert_close(scales.double(), want, rtol=2e-7, atol=0)  # one float32 rounding
    # Each channel's largest magnitude lands on e4m3's largest finite value: the whole range is used.
    assert torch.equal(q.float().abs().amax(dim=1), torch.full((24,), FP8_MAX))


def test_values_past_the_range_saturate_at_448_never_nan():
    x = torch.tensor([[1e6, -1e6, 500.0, 448.0, 463.0, -470.0, 1.0]])
    q = quantize_with_scales(x, torch.ones(1, 1))
    assert q.float().tolist() == [[448.0, -448.0, 448.0, 448.0, 448.0, -448.0, 1.0]]
    assert not torch.isnan(q.float()).any()
    # (torch's CPU cast happens to saturate too; the clamp makes it so on every backend and kernel.)


def test_all_zero_rows_quantize_to_zero_without_dividing_by_zero():
    q, scales = quantize_rows(torch.zeros(3, 32))
    assert torch.equal(q.float(), torch.zeros(3, 32)) and (scales > 0).all()


@pytest.mark.parametrize("spread", [1.0, 1e3], ids=["gaussian", "wide"])
def test_round_trip_error_is_within_the_e4m3_bound(spread):
    x = torch.randn(64, 256, generator=gen(1), dtype=torch.float64)
    x *= torch.logspace(0, torch.log10(torch.tensor(spread)).item(), 256, dtype=torch.float64)  # outlier channels
    q, scales = quantize_rows(x.float())
    err = (dequantize(q, scales).double() - x).abs()
    assert (err <= rounding_bound(x, scales) * (1 + 1e-6) + 1e-12).all()
    normal = x.abs() >= 2**-6 * scales.double()
    assert (err[normal] / x.abs()[normal]).max() <= U
    # RMS relative error of normal values: an e4m3 step is 2**-3 of its binade, the rounding error uniform within
    # half of it, so about 2**-3 / sqrt(12) over the mantissa's spread; measured 0.0266 (max 0.0588) here.
    rms = ((err[normal] / x.abs()[normal]) ** 2).mean().sqrt().item()
    assert rms < 0.03


def test_activation_scales_are_per_token():
    x = torch.randn(4, 64, generator=gen(2))
    q, scales = quantize_rows(x)
    loud = x.clone()
    loud[2] *= 1000  # one token with a large norm changes only its own scale
    q2, scales2 = quantize_rows(loud)
    assert scales.shape == (4, 1)
    torch.testing.assert_close(scales2[2], scales[2] * 1000, rtol=1e-6, atol=0)
    keep = [0, 1, 3]
    assert torch.equal(scales2[keep], scales[keep]) and torch.equal(q2[keep].float(), q[keep].float())
    torch.testing.assert_close(scales.double().squeeze(1), x.double().abs().amax(1) / 448, rtol=2e-7, atol=0)


def test_quantize_rows_leaves_a_float32_input_alone():
    x = torch.randn(3, 32, generator=gen(3))
    before = x.clone()
    quantize_rows(x)
    assert torch.equal(x, before)


def test_emulated_scaled_mm_is_the_float64_matmul_of_the_dequantized_operands():
    qx, sx = quantize_rows(torch.randn(8, 64, generator=gen(4)))
    qw, sw = quantize_weight(torch.randn(32, 64, generator=gen(5)))
    bias = torch.randn(32, generator=gen(6))
    got = emulated_scaled_mm(qx, sx, qw.t(), sw.view(1, -1), bias, torch.float32).double()
    want = (qx.double() * sx.double()) @ (qw.double() * sw.double()[:, None]).t() + bias.double()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # float32 accumulation only


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_fp8_linear_output_is_within_its_bound_of_float64(dtype):
    """|y_fp8 - y| <= sum_k |x_k| e_w + |w_k| e_x + e_x e_w (e_*: each operand's rounding bound), plus the output's
    own rounding to `dtype`; and the relative error of the whole output stays small (measured ~0.03)."""
    linear = torch.nn.Linear(128, 48).to(torch.float64)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 128, generator=gen(7), dtype=torch.float64) * 0.05)
        linear.bias.copy_(torch.randn(48, generator=gen(8), dtype=torch.float64) * 0.05)
    x = torch.randn(16, 128, generator=gen(9), dtype=torch.float64)
    x[:, 5] *= 20  # an outlier channel, as real activations have
    fp8 = Fp8Linear.from_linear(linear.to(dtype), EMULATED)
    x_in = x.to(dtype)
    got = fp8(x_in).double()
    assert got.dtype == torch.float64 and fp8(x_in).dtype == dtype
    w, b, xd = linear.weight.double(), linear.bias.double(), x_in.double()  # the operands as the layer saw them
    want = xd @ w.t() + b
    _, sx = quantize_rows(x_in)
    _, sw = quantize_weight(linear.weight)
    ex, ew = rounding_bound(xd, sx), rounding_bound(w, sw[:, None])
    bound = xd.abs() @ ew.t() + ex @ w.abs().t() + ex @ ew.t()
    out_rounding = want.abs() * (2.0**-8 if dtype == torch.bfloat16 else 2.0**-24)
    assert ((got - want).abs() <= bound + out_rounding + 1e-6).all()
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 0.05, rel


def test_fp8_linear_keeps_leading_dims_and_no_bias():
    linear = torch.nn.Linear(32, 16, bias=False)
    fp8 = Fp8Linear.from_linear(linear, EMULATED)
    assert fp8.bias is None and fp8.weight_scale.shape == (1, 16) and fp8.qweight.dtype == FP8
    x = torch.randn(2, 3, 32, generator=gen(10))
    assert fp8(x).shape == (2, 3, 16)
    rel = ((fp8(x) - linear(x)).norm() / linear(x).norm()).item()
    assert rel < 0.05


def test_within_one_step_accepts_a_neighbour_and_refuses_two_steps():
    scales = torch.ones(1, 1)
    want = torch.tensor([[1.0, 2.0, 0.5]]).to(FP8)
    assert within_one_step(torch.tensor([[1.125, 2.0, 0.5]]).to(FP8), want, scales)  # 1 -> its upper neighbour
    assert not within_one_step(torch.tensor([[1.25, 2.0, 0.5]]).to(FP8), want, scales)


def test_gelu_tanh_linear_is_the_linear_of_the_gelu():
    linear = torch.nn.Linear(64, 32)
    y = torch.randn(7, 64, generator=gen(11)) * 2
    fp8 = Fp8Linear.from_linear(linear, EMULATED)
    want = fp8(torch.nn.functional.gelu(y, approximate="tanh"))
    assert torch.equal(gelu_tanh_linear(fp8, y), want)  # the plain path: GELU, then the quantizer
    torch.testing.assert_close(gelu_tanh_linear(linear, y), linear(torch.nn.functional.gelu(y, approximate="tanh")))
