"""The Triton split-head varlen attention (mmproc/layers/attention_triton.py) against exact per-segment attention.

Tolerance "within bf16 noise": the kernel's error against a float32 reference may be at most twice that of
torch's own bf16 SDPA on the same inputs (plus 1e-3), while a wrong segment bound, head, lane split or softmax
scale gives errors of order 0.1-1 on unit-variance inputs. On a CPU-only machine with Triton installed the same
kernel runs in Triton's interpreter (small shapes); without Triton those checks skip.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from mmproc.layers import attention_triton
from mmproc.layers.attention import VarlenMeta, sdpa_segments, select_attention
from tests.python_subprocess import run_python

HEADS, HEAD_DIM = 16, 72  # MoonViT
requires_fused = pytest.mark.skipif(not attention_triton.available(), reason="needs CUDA and Triton")


def packed(lengths: list[int], heads: int, head_dim: int, device: str, dtype: torch.dtype):
    """q, k, v as (L, H, dh) row-strided views of one fused qkv tensor (the model's layout), and its meta."""
    gen = torch.Generator().manual_seed(sum(lengths) + head_dim)
    qkv = torch.randn(sum(lengths), 3, heads, head_dim, generator=gen).to(device=device, dtype=dtype)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return (*qkv.unbind(1), VarlenMeta.from_cu_seqlens(cu, max(lengths), cu.to(device)))


def test_split_head_dim_pads_little():
    assert attention_triton.split_head_dim(72) == (64, 16)  # 80 lanes for 72: 10% padding, not 44%
    assert attention_triton.split_head_dim(96) == (64, 32)
    assert attention_triton.split_head_dim(128) == (128, 0)
    assert attention_triton.split_head_dim(40) == (32, 16)


@pytest.mark.cuda
@requires_fused
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lengths", [[1], [480], [256] * 12, [5660, 1, 8360, 480], [11660]])
def test_matches_exact_attention_within_bf16_noise(lengths, dtype):
    q, k, v, meta = packed(lengths, HEADS, HEAD_DIM, "cuda", dtype)
    reference = sdpa_segments(q.float(), k.float(), v.float(), meta)
    torch_error = (sdpa_segments(q, k, v, meta).float() - reference).abs().max().item()
    got = attention_triton.varlen_attention(q, k, v, meta.cu_seqlens_device, meta.max_seqlen)
    assert got.shape == q.shape and got.dtype == dtype
    assert (got.float() - reference).abs().max().item() <= 2 * torch_error + 1e-3


@pytest.mark.cuda
@requires_fused
def test_chosen_for_head_dim_72_and_not_for_powers_of_two():
    assert select_attention("cuda", torch.bfloat16, HEADS, HEAD_DIM)[0] == "triton"
    assert select_attention("cuda", torch.bfloat16, 12, 128)[0] != "triton"  # cuDNN/flash need no padding there
    assert select_attention("cuda", torch.bfloat16, HEADS, HEAD_DIM, kernel="varlen")[0] != "triton"
    assert select_attention("cpu", torch.float32, HEADS, HEAD_DIM)[0] == "sdpa"  # CPU machines unchanged


def test_unknown_kernel_name_is_refused():
    with pytest.raises(ValueError, match="attention kernel"):
        select_attention("cpu", torch.float32, HEADS, HEAD_DIM, kernel="fast")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (its interpreter runs on CPU)")
def test_interpreted_kernel_matches_on_cpu():
    """The same kernel in Triton's interpreter: segment bounds, head split and masking on small shapes."""
    result = run_python(
        """
        import torch
        from mmproc.layers.attention_triton import varlen_attention
        from tests.test_attention_triton import packed
        from mmproc.layers.attention import sdpa_segments
        for heads, dh, lengths in [(2, 72, [5, 130, 64]), (3, 64, [17, 70]), (2, 96, [40]), (1, 80, [33, 1])]:
            q, k, v, meta = packed(lengths, heads, dh, "cpu", torch.float16)
            got = varlen_attention(q, k, v, meta.cu_seqlens, meta.max_seqlen).float()
            want = sdpa_segments(q.float(), k.float(), v.float(), meta)
            assert (got - want).abs().max().item() < 5e-3, (heads, dh, lengths)
        print("ok")
        """,
        TRITON_INTERPRET="1",
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
