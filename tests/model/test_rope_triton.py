"""Fused in-place RoPE (mmproc/layers/rope_triton.py) against a float32 complex-number reference.

Tolerances: the kernel rotates in float32 and rounds once to the storage dtype, so it differs from the float32
reference by at most half an ulp of the output (relative 2**-9 in bf16, 2**-12 in fp16) plus float32
reassociation noise (~1e-7). We allow two machine epsilons (bf16 eps 2**-7 -> 1.6e-2; fp16 eps 2**-10 ->
2e-3) as both rtol and atol: loose enough for a 1-ulp rounding flip, while a wrong pairing, sign or angle
(cos/sin of another pair or token) gives errors of order 1 on unit-variance inputs.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import Tensor

from mmproc.layers import rope_triton
from tests.support.python_subprocess import run_python

HEADS, HEAD_DIM = 16, 72  # MoonViT: hidden 1152 = 16 heads x 72
TOLERANCE = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
TOKENS = [1, 480, 5660, 8360]  # one patch; a small image; two large ones (packed varlen batches)

# `cuda` lets the root conftest skip these without a GPU; the skipif also covers a CUDA host without Triton.
requires_fused = pytest.mark.skipif(not rope_triton.available(), reason="needs CUDA and Triton")


def reference_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (L, H, dh) any float; cos/sin (L, dh/2) float32 -> (L, H, dh) float32.

    Interleaved pairs (x[2j], x[2j+1]) are complex numbers multiplied by exp(i * angle[l, j]), as in Kimi-VL's
    `apply_rope` (view_as_complex on (..., dh/2, 2)).
    """
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())  # (L, H, dh/2) c64
    rot = torch.complex(cos, sin).unsqueeze(1)  # (L, 1, dh/2): same angle for every head
    return torch.view_as_real(pairs * rot).flatten(-2)


def make_inputs(seq: int, dtype: torch.dtype, device: str, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """qkv (L, 3*H*dh) in dtype, cos/sin (L, dh/2) float32, all on device."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(seq, 3 * HEADS * HEAD_DIM, generator=gen).to(dtype)
    # Angles as large as a 512-wide grid's (position x frequency up to 512 rad), not just [0, 2pi).
    angles = torch.rand(seq, HEAD_DIM // 2, generator=gen) * 512
    return qkv.to(device), angles.cos().to(device), angles.sin().to(device)


def assert_rotated(out: Tensor, original: Tensor, cos: Tensor, sin: Tensor) -> None:
    tol = TOLERANCE[out.dtype]
    torch.testing.assert_close(out.float(), reference_rope(original, cos, sin), rtol=tol, atol=tol)


@pytest.mark.cuda
@requires_fused
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("seq", TOKENS)
def test_contiguous_in_place(seq: int, dtype: torch.dtype) -> None:
    qkv, cos, sin = make_inputs(seq, dtype, "cuda")
    original = qkv.view(seq, 3, HEADS, HEAD_DIM)
    q, k = (
        original[:, 0].clone(memory_format=torch.contiguous_format),
        original[:, 1].clone(memory_format=torch.contiguous_format),
    )
    q_ptr, k_ptr = q.data_ptr(), k.data_ptr()
    assert rope_triton.apply_rope_(q, k, cos, sin) is None
    assert (q.data_ptr(), k.data_ptr()) == (q_ptr, k_ptr)
    assert_rotated(q, original[:, 0], cos, sin)
    assert_rotated(k, original[:, 1], cos, sin)


@pytest.mark.cuda
@requires_fused
@pytest.mark.parametrize("entry", ["views", "qkv"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("seq", TOKENS)
def test_strided_from_qkv_in_place(seq: int, dtype: torch.dtype, entry: str) -> None:
    qkv, cos, sin = make_inputs(seq, dtype, "cuda")
    before = qkv.clone()
    ptr = qkv.data_ptr()
    if entry == "qkv":
        rope_triton.apply_rope_qkv_(qkv, cos, sin, HEADS)
    else:
        view = qkv.view(seq, 3, HEADS, HEAD_DIM)  # q, k: strided views, row stride 3*H*dh
        rope_triton.apply_rope_(view[:, 0], view[:, 1], cos, sin)
    assert qkv.data_ptr() == ptr
    out, ref = qkv.view(seq, 3, HEADS, HEAD_DIM), before.view(seq, 3, HEADS, HEAD_DIM)
    assert torch.equal(out[:, 2], ref[:, 2]), "v must be untouched"
    assert_rotated(out[:, 0], ref[:, 0], cos, sin)
    assert_rotated(out[:, 1], ref[:, 1], cos, sin)


@pytest.mark.cuda
@requires_fused
def test_matches_plain_rope_on_real_tables() -> None:
    # Same numbers as the plain path the encoder falls back to, on the real 2D tables of a packed batch.
    from mmproc.layers.rope import apply_rope, build_rope_table, rope_cos_sin

    grids = [(34, 48), (60, 80), (1, 1)]  # (h, w) patches per image
    cos_t, sin_t = (t.cuda() for t in build_rope_table(HEAD_DIM, 64, 96))
    cos, sin = rope_cos_sin(grids, cos_t, sin_t)  # (L, dh/2)
    qkv, _, _ = make_inputs(cos.shape[0], torch.bfloat16, "cuda", seed=3)
    view = qkv.view(-1, 3, HEADS, HEAD_DIM)
    plain_q, plain_k = apply_rope(view[:, 0], view[:, 1], cos, sin)
    rope_triton.apply_rope_qkv_(qkv, cos, sin, HEADS)
    tol = TOLERANCE[torch.bfloat16]
    torch.testing.assert_close(view[:, 0], plain_q, rtol=tol, atol=tol)
    torch.testing.assert_close(view[:, 1], plain_k, rtol=tol, atol=tol)


@pytest.mark.cuda
@requires_fused
def test_cuda_graph_capture_and_replay() -> None:
    seq = 2048
    static_qkv, static_cos, static_sin = make_inputs(seq, torch.bfloat16, "cuda")
    # Warm up (compiles the kernel) on a side stream, as torch.cuda.graphs requires before capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        rope_triton.apply_rope_qkv_(static_qkv, static_cos, static_sin, HEADS)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rope_triton.apply_rope_qkv_(static_qkv, static_cos, static_sin, HEADS)
    for seed in (1, 2):
        qkv, cos, sin = make_inputs(seq, torch.bfloat16, "cuda", seed=seed)
        static_qkv.copy_(qkv)
        static_cos.copy_(cos)
        static_sin.copy_(sin)
        graph.replay()
        out, ref = static_qkv.view(seq, 3, HEADS, HEAD_DIM), qkv.view(seq, 3, HEADS, HEAD_DIM)
        assert torch.equal(out[:, 2], ref[:, 2])
        assert_rotated(out[:, 0], ref[:, 0], cos, sin)
        assert_rotated(out[:, 1], ref[:, 1], cos, sin)


def test_rejects_bad_layouts_before_launch() -> None:
    # Shape checks run on the host before any Triton use, so this runs everywhere.
    qkv, cos, sin = make_inputs(4, torch.bfloat16, "cpu")
    view = qkv.view(4, 3, HEADS, HEAD_DIM)
    with pytest.raises(ValueError, match="stride 1"):
        rope_triton.apply_rope_(view[:, 0].transpose(1, 2), view[:, 1].transpose(1, 2), cos, sin)
    with pytest.raises(ValueError, match="cos must be"):
        rope_triton.apply_rope_(view[:, 0], view[:, 1], cos.double(), sin)
    with pytest.raises(ValueError, match="even"):
        odd = torch.zeros(4, HEADS, 7, dtype=torch.bfloat16)
        rope_triton.apply_rope_(odd, odd.clone(), torch.zeros(4, 3), torch.zeros(4, 3))
    with pytest.raises(ValueError, match="qkv must be"):
        rope_triton.apply_rope_qkv_(qkv[:, :-1], cos, sin, HEADS)


def test_imports_without_triton() -> None:
    done = run_python(
        """
        import sys
        sys.modules["triton"] = None  # makes `import triton` raise ImportError
        from mmproc.layers import rope_triton
        assert rope_triton.available() is False
        """
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (CPU interpreter)")
def test_interpreter_on_cpu() -> None:
    # The same kernel under TRITON_INTERPRET=1 on CPU tensors (the env var must be set before triton.jit runs,
    # hence the subprocess). Covers both pair-loading variants, unaligned strides (dh=6 -> 4-byte rows) and
    # head/token counts that are not multiples of the blocks.
    code = "import torch\nfrom mmproc.layers import rope_triton as rt\n" + _INTERPRETER_BODY
    done = run_python(code, TRITON_INTERPRET="1")
    assert done.returncode == 0, done.stdout + done.stderr


_INTERPRETER_BODY = """
def reference(x, cos, sin):
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * torch.complex(cos, sin).unsqueeze(1)).flatten(-2)

tol = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-5}
gen = torch.Generator().manual_seed(0)
for seq, heads, dh in [(1, 16, 72), (5, 16, 72), (3, 3, 6), (2, 5, 256), (3, 2, 2)]:
    for dtype in tol:
        for pairs in (rt.PAIRS_RESHAPE, rt.PAIRS_STRIDED):
            qkv = torch.randn(seq, 3 * heads * dh, generator=gen).to(dtype)
            angles = torch.rand(seq, dh // 2, generator=gen) * 512
            cos, sin = angles.cos(), angles.sin()
            before = qkv.clone().view(seq, 3, heads, dh)
            view = qkv.view(seq, 3, heads, dh)
            rt._check(view[:, 0], view[:, 1], cos, sin)
            rt._launch(view[:, 0], view[:, 1], cos, sin, pairs=pairs)
            assert torch.equal(view[:, 2], before[:, 2])
            for i in (0, 1):
                torch.testing.assert_close(view[:, i].float(), reference(before[:, i], cos, sin),
                                           rtol=tol[dtype], atol=tol[dtype])
            q, k = before[:, 0].clone(), before[:, 1].clone()
            rt.apply_rope_(q, k, cos, sin)
            torch.testing.assert_close(q.float(), reference(before[:, 0], cos, sin), rtol=tol[dtype], atol=tol[dtype])
            torch.testing.assert_close(k.float(), reference(before[:, 1], cos, sin), rtol=tol[dtype], atol=tol[dtype])
qkv = torch.randn(6, 3 * 16 * 72, generator=gen).to(torch.bfloat16)
angles = torch.rand(6, 36, generator=gen) * 512
before = qkv.clone().view(6, 3, 16, 72)
rt.apply_rope_qkv_(qkv, angles.cos(), angles.sin(), 16)
torch.testing.assert_close(qkv.view(6, 3, 16, 72)[:, 1].float(), reference(before[:, 1], angles.cos(), angles.sin()),
                           rtol=1.6e-2, atol=1.6e-2)
print("interpreter ok")
"""
