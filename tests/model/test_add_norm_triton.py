"""Fused residual add + LayerNorm (mmproc/layers/add_norm_triton.py) against the plain path and float64.

What must hold: the residual stream x after `x += y` is BIT-identical to torch's `x + y` (both add in float32 and
round once to the storage dtype), and the normalised output matches `F.layer_norm` of that sum within one rounding
of the storage dtype: the two differ only in the float32 reduction order (~1e-6 relative) before the final
rounding, so we allow two machine epsilons (bf16 2**-7 -> 1.6e-2, fp16 2**-10 -> 2e-3) and 1e-5 in float32. A
wrong mean, variance, eps, weight or bias gives errors of order 0.1-1 on these inputs (LayerNorm weight 1 + noise,
bias noise, rows with a nonzero mean and a scale far from 1).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from mmproc.layers import add_norm_triton
from tests.support.python_subprocess import run_python

WIDTH = 1152  # MoonViT hidden size
ROWS = [1, 480, 5660]  # one patch; a small image; a large one
TOLERANCE = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-5}
DTYPES = pytest.mark.parametrize("dtype", list(TOLERANCE), ids=["bf16", "fp16", "fp32"])
requires_fused = pytest.mark.skipif(not add_norm_triton.available(), reason="needs CUDA and Triton")


def make_inputs(rows: int, dtype: torch.dtype, device: str, width: int = WIDTH, seed: int = 0) -> tuple[Tensor, ...]:
    """x, y (rows, width) in dtype; weight, bias (width,) in dtype; all on device. Rows have a nonzero mean and
    a scale far from 1, like a residual stream."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=gen) * 3 + torch.randn(rows, 1, generator=gen)
    y = torch.randn(rows, width, generator=gen) * 0.5
    weight = 1 + 0.1 * torch.randn(width, generator=gen)
    bias = 0.1 * torch.randn(width, generator=gen)
    return tuple(t.to(device=device, dtype=dtype) for t in (x, y, weight, bias))


def plain(x: Tensor, y: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """What the encoder does without the fused kernel: (x + y, F.layer_norm(x + y)), same dtype."""
    s = x + y
    return s, F.layer_norm(s, (s.shape[-1],), weight, bias, eps)


def float64_layer_norm(s: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    s = s.double()
    mean = s.mean(-1, keepdim=True)
    var = ((s - mean) ** 2).mean(-1, keepdim=True)
    return (s - mean) / torch.sqrt(var + eps) * weight.double() + bias.double()


@pytest.mark.cuda
@requires_fused
@DTYPES
@pytest.mark.parametrize("rows", ROWS)
def test_fused_matches_plain(rows: int, dtype: torch.dtype) -> None:
    x, y, weight, bias = make_inputs(rows, dtype, "cuda")
    want_x, want = plain(x, y, weight, bias)
    ptr = x.data_ptr()
    got = add_norm_triton.add_layer_norm_(x, y, weight, bias, 1e-5)
    assert x.data_ptr() == ptr and got.shape == (rows, WIDTH) and got.dtype == dtype and got.is_contiguous()
    assert torch.equal(x, want_x), "the residual stream must be bit-identical to torch's add"
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    exact = float64_layer_norm(want_x, weight, bias)
    torch.testing.assert_close(got.double(), exact, rtol=tol, atol=tol)


@pytest.mark.cuda
@requires_fused
@DTYPES
@pytest.mark.parametrize("rows", ROWS)
def test_fused_rms_norm_matches_plain_and_float64(rows: int, dtype: torch.dtype) -> None:
    # Kimi K3's blocks: RMSNorm (weight only) at width 1024, eps = float32's (nn.RMSNorm built without one).
    x, y, weight, _ = make_inputs(rows, dtype, "cuda", width=1024)
    eps = torch.finfo(torch.float32).eps
    want_x = x + y
    want = F.rms_norm(want_x, (1024,), weight, eps)
    got = add_norm_triton.add_rms_norm_(x, y, weight, eps)
    assert torch.equal(x, want_x), "the residual stream must be bit-identical to torch's add"
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    s = want_x.double()
    exact = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    torch.testing.assert_close(got.double(), exact, rtol=tol, atol=tol)


@pytest.mark.cuda
@requires_fused
@pytest.mark.parametrize("width", [1, 72, 1000, 4304])
def test_other_widths_and_strided_rows(width: int) -> None:
    # Rows that are views of wider buffers (row stride != width) and a weight in float32 with bf16 data.
    x_wide, y_wide, _, _ = make_inputs(37, torch.bfloat16, "cuda", width=width + 8, seed=1)
    _, _, weight, bias = make_inputs(1, torch.float32, "cuda", width=width, seed=2)
    x, y = x_wide[:, :width], y_wide[:, 8:]
    before = x_wide.clone()
    want_x, want = plain(x, y, weight.bfloat16(), bias.bfloat16())
    got = add_norm_triton.add_layer_norm_(x, y, weight, bias, 1e-6)
    assert torch.equal(x, want_x) and torch.equal(x_wide[:, width:], before[:, width:]), "wrote outside the rows"
    exact = float64_layer_norm(want_x, weight, bias, 1e-6)
    torch.testing.assert_close(got.double(), exact, rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.cuda
@requires_fused
@pytest.mark.parametrize("preset", ["kimi-k2.5", "kimi-k3"])
def test_encoder_fused_add_norm_matches_plain_path(preset: str) -> None:
    # The whole tower on a full-width 2-layer config: fused vs plain add + LayerNorm (K3: RMSNorm), bf16.
    import dataclasses

    from mmproc.batching import pack_images
    from mmproc.models import PRESETS
    from mmproc.models.loader import build_encoder, expected_shapes
    from mmproc.models.random_init import random_state_dict
    from tests.support.preprocessed import make_images

    config = dataclasses.replace(PRESETS[preset], num_layers=2, text_hidden_size=512)
    model = build_encoder(config, random_state_dict(expected_shapes(config), seed=5), device="cuda", dtype="bfloat16")
    images = make_images([(4, 4), (32, 32), (48, 48), (6, 10)])
    batch = pack_images(images, pin_memory=True, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert model.tower.kernels(model.device, model.dtype).names[3] == "triton"
        fused = model(batch).float()
        model.tower.set_options(fused_add_norm=False)
        assert model.tower.kernels(model.device, model.dtype).names[3] == "eager"
        unfused = model(batch).float()
    assert ((fused - unfused).norm() / unfused.norm()).item() < 1e-2


def test_rejects_bad_inputs_before_launch() -> None:
    # Host-side checks run before any Triton use, so this runs everywhere.
    x, y, weight, bias = make_inputs(4, torch.bfloat16, "cpu", width=16)
    with pytest.raises(ValueError, match="x, y must both be"):
        add_norm_triton.add_layer_norm_(x, y[:3], weight, bias, 1e-5)
    with pytest.raises(ValueError, match="share a dtype"):
        add_norm_triton.add_layer_norm_(x, y.float(), weight, bias, 1e-5)
    with pytest.raises(ValueError, match="stride 1"):
        add_norm_triton.add_layer_norm_(x.t(), y.t(), torch.ones(4), torch.zeros(4), 1e-5)
    with pytest.raises(ValueError, match="weight must be"):
        add_norm_triton.add_layer_norm_(x, y, weight[:8], bias, 1e-5)
    with pytest.raises(ValueError, match="row width"):
        big = torch.zeros(1, 16385, dtype=torch.bfloat16)
        add_norm_triton.add_layer_norm_(big, big, torch.ones(16385), torch.zeros(16385), 1e-5)


def test_probe_failure_means_the_plain_path(caplog) -> None:
    # Without a working kernel (here: no Triton, or no CUDA device for a CPU tensor) the probe says no and logs
    # why; the encoder then runs the plain path instead of failing.
    from mmproc.layers import add_norm

    if importlib.util.find_spec("triton") is not None and os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter runs the kernel on CPU tensors")
    with caplog.at_level("WARNING"):
        assert add_norm._probe_add_norm(torch.device("cpu"), torch.float32, 64, "layernorm") is False
    assert "failed its probe" in caplog.text
    assert add_norm.select_add_norm(torch.device("cpu"), torch.float32, 64, "layernorm")[0] == "eager"


def test_launch_config_covers_the_row_with_power_of_two_lanes() -> None:
    for width in (1, 72, 1000, 1152, 1024, 4304, 16384):
        block, warps = add_norm_triton.launch_config(width)
        assert block >= width and block & (block - 1) == 0 and block < 2 * max(width, 16)
        assert warps in (1, 2, 4, 8)
    assert add_norm_triton.launch_config(1152) == (2048, 8)


def test_imports_without_triton() -> None:
    done = run_python(
        """
        import sys
        sys.modules["triton"] = None  # makes `import triton` raise ImportError
        from mmproc.layers import add_norm_triton
        assert add_norm_triton.available() is False
        """
    )
    assert done.returncode == 0, done.stderr


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (no GPU needed)")


@needs_triton
def test_interpreter_on_cpu() -> None:
    # The same kernel under TRITON_INTERPRET=1 on CPU tensors (set before triton.jit runs, hence the subprocess):
    # every dtype, widths below/at/above a power of two, one row and many, strided rows.
    done = run_python(_INTERPRETER_BODY, TRITON_INTERPRET="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "interpreter ok" in done.stdout


_INTERPRETER_BODY = """
import torch
import torch.nn.functional as F
from mmproc.layers import add_norm_triton as an

tol = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-5}
gen = torch.Generator().manual_seed(0)
for rows, width in [(1, 1152), (7, 1152), (3, 72), (2, 64), (5, 1), (4, 1000)]:
    for dtype in tol:
        x = (torch.randn(rows, width + 3, generator=gen) * 3 + 1).to(dtype)[:, :width]  # strided rows
        y = torch.randn(rows, width, generator=gen).to(dtype)
        w = (1 + 0.1 * torch.randn(width, generator=gen)).to(dtype)
        b = (0.1 * torch.randn(width, generator=gen)).to(dtype)
        want_x = x + y
        want = F.layer_norm(want_x.float(), (width,), w.float(), b.float(), 1e-5)
        got = an.add_layer_norm_(x, y, w, b, 1e-5)
        if dtype == torch.bfloat16:  # the interpreter truncates float32 -> bf16 (the GPU rounds to nearest even)
            torch.testing.assert_close(x, want_x, rtol=2**-7, atol=0)
        else:
            assert torch.equal(x, want_x), (rows, width, dtype)
        assert got.dtype == dtype and got.shape == (rows, width)
        torch.testing.assert_close(got.float(), want, rtol=tol[dtype], atol=tol[dtype])

# The whole tiny tower with the fused kernel in place of the plain path (x updated in place inside the blocks).
from mmproc.batching import pack_images
from mmproc.layers import add_norm, kernels
from mmproc.models import load_encoder
from mmproc.types import PreprocessedImage

images = [PreprocessedImage(torch.rand(h * w, 3, 14, 14, generator=gen) * 2 - 1, (h, w), h * w // 4)
          for h, w in [(4, 6), (8, 2)]]
batch = pack_images(images)
model = load_encoder(None, preset="tiny")
with torch.inference_mode():
    want = model(batch)
    kernels.select_add_norm = lambda device, dtype, width, kind: ("triton", add_norm.fused_add_norm)
    model.tower.set_options(fused_add_norm=True)  # selects the kernels again
    assert model.tower.kernels(model.device, model.dtype).names[3] == "triton"
    got = model(batch)
torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
for dtype in tol:  # the selection probe passes with the real kernel (and falls back without Triton: see below)
    assert add_norm._probe_add_norm(torch.device("cpu"), dtype, 1152), dtype
print("interpreter ok")
"""


@needs_triton
def test_compiles_for_hopper_without_a_gpu() -> None:
    # Triton compiles to a cubin for sm_90 with the ptxas it ships, no driver needed: a typo or a type error in the
    # kernel fails here, on a CPU machine, instead of in the first GPU run. Every dtype, the MoonViT width.
    done = run_python(_COMPILE_BODY)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("cubin ok") == 3


_COMPILE_BODY = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from mmproc.layers import add_norm_triton as an

block, warps = an.launch_config(1152)
for ty in ("bf16", "fp16", "fp32"):
    signature = {"x_ptr": f"*{ty}", "y_ptr": f"*{ty}", "out_ptr": f"*{ty}", "w_ptr": f"*{ty}", "b_ptr": f"*{ty}",
                 "n_cols": "i32", "x_row_stride": "i32", "y_row_stride": "i32", "out_row_stride": "i32",
                 "eps": "fp32", "BLOCK_D": "constexpr", "RMS": "constexpr"}
    for rms in (False, True):
        src = ASTSource(an._add_layer_norm_kernel, signature, constexprs={"BLOCK_D": block, "RMS": rms})
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        assert len(compiled.asm["cubin"]) > 0
    print("cubin ok", ty, compiled.metadata.num_warps, compiled.metadata.shared)
"""
