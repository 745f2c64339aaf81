"""FP8 linear layers of the towers, one at a time (CUDA, sm_89+): where an FP8 forward's time goes.

Per linear shape of a preset's block (wqkv, wo, fc0, fc1) at M tokens: the bf16 matmul, the FP8 scaled matmul
alone (inputs already quantized; also with `use_fast_accum`, which the layers do not use), the activation
quantizer alone (Triton and plain torch), and the whole `Fp8Linear`. Median of CUDA-event-timed calls after warm-up. `python3 -m benchmarks.fp8_linear [--tokens N]`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from mmproc.layers.fp8 import Fp8Linear, quantize_rows, select_fp8_kernels
from mmproc.models import PRESETS


def _time(fn: Callable[[], object], reps: int) -> float:
    """Median ms of `reps` calls, each between two CUDA events, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _try_time(fn: Callable[[], object], reps: int) -> float:
    """`_time`, or NaN (and one line on stderr) where this torch refuses the call: the other columns still count."""
    try:
        return _time(fn, reps)
    except RuntimeError as exc:
        print(f"# refused: {str(exc)[:160]}", file=sys.stderr)
        return float("nan")


def shapes(preset: str) -> dict[str, tuple[int, int]]:
    """name -> (in, out) of one block's linears and the merger's first."""
    c = PRESETS[preset]
    d, a, i = c.hidden_size, c.qkv_width, c.intermediate_size
    return {"wqkv": (d, 3 * a), "wo": (a, d), "fc0": (d, i), "fc1": (i, d), "merger": (c.merged_dim, c.merged_dim)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.fp8_linear", description=__doc__.split("\n")[0])
    p.add_argument("--presets", nargs="+", default=["kimi-k2.5", "kimi-k3"], choices=sorted(PRESETS))
    p.add_argument("--tokens", type=int, default=16384, help="M: rows per matmul (448² x 16 = 16,384 patches)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        print("benchmarks.fp8_linear: needs a CUDA GPU of compute capability >= 8.9", file=sys.stderr)
        return 2
    device, dtype = torch.device("cuda"), torch.bfloat16
    kernels = select_fp8_kernels(device, dtype)
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | M = {args.tokens} | fp8 kernels "
          f"{kernels.names} | median of {args.reps}")  # fmt: skip
    print(f"{'preset':>10} {'layer':>7} {'K':>5} {'N':>5} {'bf16 ms':>8} {'fp8 mm':>8} {'fast acc':>8} {'quant':>8} {'q eager':>8} "
          f"{'Fp8Linear':>9} {'speedup':>7} {'bf16 TF/s':>9} {'fp8 TF/s':>9}")  # fmt: skip
    rows = []
    with torch.inference_mode():
        for preset in args.presets:
            for name, (k, n) in shapes(preset).items():
                linear = torch.nn.Linear(k, n, bias=PRESETS[preset].mlp_bias).to(device, dtype)
                layer = Fp8Linear.from_linear(linear, kernels)
                x = torch.randn(args.tokens, k, device=device, dtype=dtype)
                q, s = kernels.quantize(x)
                w_t = layer.qweight.t()
                row = {
                    "preset": preset, "layer": name, "k": k, "n": n,
                    "bf16_ms": _time(lambda: F.linear(x, linear.weight, linear.bias), args.reps),  # noqa: B023
                    "fp8_mm_ms": _time(lambda: kernels.matmul(q, s, w_t, layer.weight_scale, layer.bias, dtype),  # noqa: B023
                                       args.reps),
                    "fp8_mm_fast_accum_ms": _try_time(lambda: torch._scaled_mm(q, w_t, scale_a=s, scale_b=layer.weight_scale,  # noqa: B023
                                                  out_dtype=dtype, use_fast_accum=True), args.reps),
                    "quant_ms": _time(lambda: kernels.quantize(x), args.reps),  # noqa: B023
                    "quant_eager_ms": _time(lambda: quantize_rows(x), args.reps),  # noqa: B023
                    "fp8_linear_ms": _time(lambda: layer(x), args.reps),  # noqa: B023
                }  # fmt: skip
                flops = 2 * args.tokens * k * n
                row |= {"speedup": row["bf16_ms"] / row["fp8_linear_ms"], "bf16_tflops": flops / row["bf16_ms"] / 1e9,
                        "fp8_mm_tflops": flops / row["fp8_mm_ms"] / 1e9}  # fmt: skip
                rows.append(row)
                print(f"{preset:>10} {name:>7} {k:>5} {n:>5} {row['bf16_ms']:>8.3f} {row['fp8_mm_ms']:>8.3f} "
                      f"{row['fp8_mm_fast_accum_ms']:>8.3f} "
                      f"{row['quant_ms']:>8.3f} {row['quant_eager_ms']:>8.3f} {row['fp8_linear_ms']:>9.3f} "
                      f"{row['speedup']:>6.2f}x {row['bf16_tflops']:>9.1f} {row['fp8_mm_tflops']:>9.1f}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "kernels": kernels.names,
                                         "tokens": args.tokens, "rows": rows}, indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
