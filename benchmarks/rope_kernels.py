"""`mmproc bench rope`: per-layer Q/K rotation time of MoonViT's 2D RoPE, plain vs fused (Triton, in place).

Paths plain, plain-view, fused and fused-qkv on the fused wqkv's output; medians of `triton.testing.do_bench`
with L2 flushed, GB/s of the bytes a rotation must move, speedups against `plain` in the same run
(docs/bench.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from mmproc.bench.provenance import git_commit
from mmproc.bench.report import Progress
from mmproc.layers import rope_triton
from mmproc.layers.rope import apply_rope

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
DTYPES |= {"float32": torch.float32, "fp32": torch.float32}
BUFFER_BUDGET = 512 * 2**20  # bytes of rotated inputs per path: ~10x the H200's 50 MB L2
PATHS = ("plain", "plain-view", "fused", "fused-qkv")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmproc bench rope", description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[256, 1024, 4096, 8192], help="sequence lengths L")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=72)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--warmup", type=float, default=25.0, help="do_bench warm-up time per case, ms")
    p.add_argument("--rep", type=float, default=200.0, help="do_bench measuring time per case, ms")
    p.add_argument("--sweep", action="store_true", help="also time block/warp/pair-load variants of fused-qkv")
    p.add_argument("--sweep-tokens", type=int, default=4096)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", type=Path, default=None, help="write machine-readable results here")
    return p.parse_args(argv)


def _must_move(seq: int, heads: int, head_dim: int, dtype: torch.dtype) -> int:
    # q and k read + written once, cos/sin (float32, dh/2 per token) read once.
    qk = 2 * 2 * seq * heads * head_dim * torch.empty((), dtype=dtype).element_size()
    return qk + 2 * seq * (head_dim // 2) * 4


class Inputs:
    """Rotating buffers for one (L, H, dh, dtype): `n` fused-projection outputs and `n` contiguous q/k pairs."""

    def __init__(self, seq: int, heads: int, head_dim: int, dtype: torch.dtype) -> None:
        self.shape = (seq, 3, heads, head_dim)
        size = seq * 3 * heads * head_dim * torch.empty((), dtype=dtype).element_size()
        self.n = max(2, min(16, BUFFER_BUDGET // max(1, size)))
        gen = torch.Generator(device="cuda").manual_seed(seq)
        self.qkv = [
            torch.randn(seq, 3 * heads * head_dim, device="cuda", generator=gen).to(dtype) for _ in range(self.n)
        ]
        self.qk = [(t.view(self.shape)[:, 0].contiguous(), t.view(self.shape)[:, 1].contiguous()) for t in self.qkv]
        angles = torch.rand(seq, head_dim // 2, device="cuda", generator=gen) * 512  # (L, dh/2) float32
        self.cos, self.sin = angles.cos(), angles.sin()
        self.i = 0

    def next(self) -> int:
        self.i = (self.i + 1) % self.n
        return self.i


def _path_fn(name: str, inp: Inputs, heads: int) -> Callable[[], object]:
    cos, sin = inp.cos, inp.sin
    if name == "plain":

        def run() -> object:
            view = inp.qkv[inp.next()].view(inp.shape)
            return apply_rope(view[:, 0].contiguous(), view[:, 1].contiguous(), cos, sin)
    elif name == "plain-view":

        def run() -> object:
            view = inp.qkv[inp.next()].view(inp.shape)
            return apply_rope(view[:, 0], view[:, 1], cos, sin)
    elif name == "fused":

        def run() -> object:
            q, k = inp.qk[inp.next()]
            return rope_triton.apply_rope_(q, k, cos, sin)
    else:

        def run() -> object:
            return rope_triton.apply_rope_qkv_(inp.qkv[inp.next()], cos, sin, heads)

    return run


def _max_error(inp: Inputs, heads: int) -> float:
    # Fused-qkv vs plain on the same data, in units of the output (sanity check before timing).
    qkv = inp.qkv[0].clone()
    view = qkv.view(inp.shape)
    ref_q, ref_k = apply_rope(view[:, 0], view[:, 1], inp.cos, inp.sin)
    rope_triton.apply_rope_qkv_(qkv, inp.cos, inp.sin, heads)
    err = torch.maximum(
        (view[:, 0].float() - ref_q.float()).abs().max(), (view[:, 1].float() - ref_k.float()).abs().max()
    )
    return float(err)


def _time(fn: Callable[[], object], args: argparse.Namespace) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median"))


def _ptx_summary(inp: Inputs, heads: int, **overrides: int) -> dict[str, int]:
    # Memory instructions of the compiled kernel: 16-byte vectors show up as ld/st.global.v4.
    view = inp.qkv[0].view(inp.shape)
    kernel = rope_triton._launch(view[:, 0], view[:, 1], inp.cos, inp.sin, **overrides)
    ptx = getattr(kernel, "asm", {}).get("ptx", "")
    ops = re.findall(r"\b((?:ld|st)\.global(?:\.v\d)?\.\w+)", ptx)
    return {op: ops.count(op) for op in sorted(set(ops))}


def _sweep(args: argparse.Namespace, dtype: torch.dtype) -> list[dict[str, object]]:
    seq = args.sweep_tokens
    inp = Inputs(seq, args.heads, args.head_dim, dtype)
    moved = _must_move(seq, args.heads, args.head_dim, dtype)
    rows: list[dict[str, object]] = []
    for pairs, pname in ((rope_triton.PAIRS_RESHAPE, "reshape"), (rope_triton.PAIRS_STRIDED, "stride2")):
        for block_l in (1, 2, 4, 8):
            for num_warps in (2, 4, 8):
                cfg = {"pairs": pairs, "block_l": block_l, "num_warps": num_warps}

                def run(cfg: dict[str, int] = cfg) -> object:
                    view = inp.qkv[inp.next()].view(inp.shape)
                    return rope_triton._launch(view[:, 0], view[:, 1], inp.cos, inp.sin, **cfg)

                ms = _time(run, args)
                rows.append({"pairs": pname, "block_l": block_l, "num_warps": num_warps, "ms": ms})
                rows[-1]["gbps"] = moved / (ms * 1e-3) / 1e9
    print(f"\nsweep: fused-qkv at L={seq}, H={args.heads}, dh={args.head_dim}, {args.dtype} (fastest first)")
    default = ("reshape", rope_triton.default_blocks(args.heads, args.head_dim)[0], rope_triton._NUM_WARPS)
    print(f"{'pairs':>8} {'block_l':>7} {'warps':>5} {'ms':>9} {'GB/s':>7}  (* = default)")
    for r in sorted(rows, key=lambda r: r["ms"]):  # type: ignore[arg-type, return-value]
        mark = " *" if (r["pairs"], r["block_l"], r["num_warps"]) == default else ""
        print(f"{r['pairs']:>8} {r['block_l']:>7} {r['num_warps']:>5} {r['ms']:>9.4f} {r['gbps']:>7.0f}{mark}")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if not torch.cuda.is_available():
        print("mmproc bench rope: needs a CUDA GPU (none visible to torch); nothing measured.", file=sys.stderr)
        return 2
    if not rope_triton.available():
        print("mmproc bench rope: Triton is not installed; the fused path cannot run.", file=sys.stderr)
        return 2
    if args.head_dim % 2 or not 2 <= args.head_dim <= 256:
        print(f"mmproc bench rope: --head-dim {args.head_dim} must be even, <= 256", file=sys.stderr)
        return 2
    import triton

    dtype = DTYPES[args.dtype]
    gpu = torch.cuda.get_device_name()
    print(f"# {gpu} | torch {torch.__version__} | triton {triton.__version__} | H={args.heads} dh={args.head_dim} "
          f"{args.dtype} | median of do_bench, L2 flushed")  # fmt: skip
    header = f"{'tokens':>6} {'path':>10} {'ms':>9} {'GB/s':>7} {'speedup':>8}"
    print(header)
    results: list[dict[str, object]] = []
    ptx: dict[str, int] = {}
    progress = Progress(len(args.tokens), "rope", unit="size", enabled=False if args.quiet else None)
    for seq in args.tokens:
        inp = Inputs(seq, args.heads, args.head_dim, dtype)
        err = _max_error(inp, args.heads)
        moved = _must_move(seq, args.heads, args.head_dim, dtype)
        times = {name: _time(_path_fn(name, inp, args.heads), args) for name in PATHS}
        for name in PATHS:
            ms = times[name]
            row = {"tokens": seq, "path": name, "ms": ms, "gbps": moved / (ms * 1e-3) / 1e9, "bytes": moved}
            row["speedup_vs_plain"] = times["plain"] / ms
            results.append(row)
            progress.print(f"{seq:>6} {name:>10} {ms:>9.4f} {row['gbps']:>7.0f} {row['speedup_vs_plain']:>7.2f}x")
        progress.print(f"{'':>6} max |fused-qkv - plain| = {err:.3g} ({args.dtype} outputs)")
        if not ptx:
            ptx = _ptx_summary(inp, args.heads)
        del inp
        torch.cuda.empty_cache()
        progress.tick()
    progress.close()
    print(f"fused kernel memory ops per thread (PTX): {ptx}")
    sweep = _sweep(args, dtype) if args.sweep else []

    if args.json is not None:
        record = {
            "bench": "rope",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": git_commit(),
            "command": [sys.executable, "-m", "benchmarks.rope_kernels", *(sys.argv[1:] if argv is None else argv)],
            "gpu": gpu,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": triton.__version__,
            "python": platform.python_version(),
            "heads": args.heads,
            "head_dim": args.head_dim,
            "dtype": args.dtype,
            "timing": f"triton.testing.do_bench median, warmup {args.warmup} ms, rep {args.rep} ms, L2 flushed",
            "results": results,
            "ptx_memory_ops": ptx,
            "sweep": sweep,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
