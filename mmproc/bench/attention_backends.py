"""`mmproc bench encoder --attention`: one image's attention per SDPA and varlen backend (CUDA), with the head also
zero-padded to wider dh; TFLOP/s count the model's real head dim."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmproc.bench.timing import time_forward
from mmproc.layers.attention import VARLEN_BACKENDS, VarlenMeta
from mmproc.models import VisionConfig

ATTN_SEQS = (1024, 5476, 11660)  # 448^2, 1024^2 and the largest mixed-set image, in patches


def attention_table(config: VisionConfig, dtype: torch.dtype, reps: int = 10) -> list[dict]:
    """One image's attention (1, H, L, dh) per SDPA backend, on q/k/v views of a fused qkv and contiguous."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads, dh = config.num_heads, config.head_dim
    rows = []
    for seq in ATTN_SEQS:
        qkv = torch.randn(seq, 3, heads, dh, device="cuda", dtype=dtype)
        strided = [t.transpose(0, 1)[None] for t in qkv.unbind(1)]  # (1, H, L, dh), row stride 3*H*dh
        dense = [t.contiguous() for t in strided]
        flops = 4 * seq * seq * heads * dh
        padded = {pad: [F.pad(t, (0, pad - dh)) for t in dense] for pad in (80, 96, 128) if pad > dh}  # zeros
        layouts = [("strided", strided), ("contiguous", dense), *((f"pad{p}", v) for p, v in padded.items())]
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            for layout, qkv_views in layouts:
                row = {"seq": seq, "backend": backend.name, "layout": layout}
                try:
                    with sdpa_kernel([backend]):
                        t = time_forward(lambda b, v=qkv_views: F.scaled_dot_product_attention(*v), None, 2, reps)
                except RuntimeError as exc:
                    rows.append(row | {"error": str(exc)[:80]})
                    continue
                rows.append(row | {"ms": t["ms"], "tflops": flops / t["ms"] / 1e9})
        cu = torch.tensor([0, seq], dtype=torch.int32)
        meta = VarlenMeta.from_cu_seqlens(cu, seq, cu.cuda())
        tower_views = (*qkv.unbind(1), meta)  # (L, H, dh) row-strided views, as the tower passes them
        for name, (make, _) in VARLEN_BACKENDS.items():
            fn = make(qkv.device)
            if fn is None:
                continue
            t = time_forward(lambda b, f=fn, a=tower_views: f(*a), None, 2, reps)
            rows.append(
                {"seq": seq, "backend": name, "layout": "varlen", "ms": t["ms"], "tflops": flops / t["ms"] / 1e9}
            )
        del qkv, strided, dense, padded, tower_views
    for r in rows:
        perf = f"{r['ms']:8.3f} ms {r['tflops']:6.1f} TFLOP/s" if "ms" in r else r["error"]
        print(f"attention L={r['seq']:>6} {r['backend']:>20} {r['layout']:>10} {perf}")
    return rows
