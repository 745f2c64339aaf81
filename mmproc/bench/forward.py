"""`mmproc bench encoder`: packed tower + merger(s) throughput on CUDA vs the eager per-image baseline (MoonViT).

Method: docs/bench.md; `--device cpu` is a smoke test of the bench, not a measurement."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime as dt
import json
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from mmproc.batching import pixel_transfer_dtype
from mmproc.bench.forward_report import _format_checks, _format_row, _summary, plot_encoder
from mmproc.bench.peaks import device_peak
from mmproc.bench.provenance import git_commit, git_dirty
from mmproc.bench.report import Progress, save_plot
from mmproc.bench.timing import _sync, count_syncs, time_back_to_back, time_forward
from mmproc.bench.workloads import encoder_flops, random_batch, random_encoder, workload_grids, workload_name
from mmproc.models import PRESETS, VisionEncoder
from mmproc.preprocess import PreprocessConfig
from mmproc.types import PackedBatch

# our encoder with one fast path changed; `--variants` times each against the default in the same run
VARIANTS: dict[str, dict[str, object]] = {
    "no-fused-gelu": {"fused_gelu": False},
    "no-fused-rope": {"fused_rope": False},
    "no-uniform": {"uniform_attention": False},
    "all-sdpa": {"long_segment": 1},
    "no-fused-add-norm": {"fused_add_norm": False},
    "attn-streams=2": {"attention_streams": 2},
    "attn-streams=4": {"attention_streams": 4},
    "attn=torch_varlen": {"attention_backend": "torch_varlen"},  # the default before flash_attn_cute
    "attn=sdpa": {"attention_backend": "sdpa"},
}
# Our default encoder fed a batch packed in another pixel dtype: what shipping pixels in the model dtype is worth.
PIXEL_VARIANTS: dict[str, torch.dtype] = {"f32-pixels": torch.float32}


GPU_WORKLOADS = ("448x64", "1024x16", "mixed48")
CPU_WORKLOADS = ("224x4", "448x2", "mixed2")  # a first number in seconds, not minutes


def _cpu_sized(args: argparse.Namespace) -> argparse.Namespace:
    """The defaults left unset, sized for the device: a CPU forward is ~1000x slower than a GPU one."""
    cpu = args.device.startswith("cpu")
    args.preset = args.preset or ("tiny" if cpu else "kimi-k2.5")
    args.workloads = args.workloads or list(CPU_WORKLOADS if cpu else GPU_WORKLOADS)
    args.reps = args.reps if args.reps is not None else (3 if cpu else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if cpu else 3)
    return args


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmproc bench encoder", description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="default: kimi-k2.5 (tiny on the CPU)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="default: what the server uses on the device (bfloat16 on CUDA, float32 on the CPU)")  # fmt: skip
    p.add_argument("--device", default="cuda", help="cuda[:N], or cpu for a smoke test with the tiny preset")
    workloads = f"default {' '.join(GPU_WORKLOADS)}; CPU {' '.join(CPU_WORKLOADS)}"
    p.add_argument(
        "--workloads", nargs="+", type=workload_name, default=None, help=f"SIDExCOUNT | mixedN ({workloads})"
    )
    p.add_argument("--reps", type=int, default=None, help="default: 10 (3 on the CPU)")
    p.add_argument("--warmup", type=int, default=None, help="default: 3 (1 on the CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peak", type=float, default=None,
                   help="TFLOP/s for MFU (default: the peak measured on this device, none when unknown)")  # fmt: skip
    p.add_argument("--variants", nargs="*", default=None, metavar="NAME", choices=[*VARIANTS, *PIXEL_VARIANTS],
                   help="also time our encoder with each fast path switched (or only the NAMEd ones)")  # fmt: skip
    p.add_argument("--no-baseline", action="store_true", help="skip the eager per-image baseline")
    p.add_argument(
        "--fp8-keep",
        nargs="*",
        default=[],
        metavar="NAME",
        help="with --fp8: also keep these linears in bf16 (as `bench accuracy --keep`)",
    )
    p.add_argument("--fp8", action="store_true",
                   help="also time the same weights with FP8 linear layers (`serve --quantization fp8`; CUDA sm_89+, "
                        "emulated on the CPU): speed-up and agreement against the default (docs/benchmarks/fp8.md)")  # fmt: skip
    p.add_argument("--attention", action="store_true", help="also time one image's SDPA per backend and layout")
    p.add_argument("--profile", action="store_true", help="per workload, kernel time by category of one warm forward")
    p.add_argument("--latency", nargs="*", type=workload_name, default=None, metavar="WORKLOAD",
                   help="one batch at a time: p50/p99 latency eager and as a CUDA graph vs GPU busy time (CUDA; "
                        "default workloads 448x1 1024x1 256x4)")  # fmt: skip
    p.add_argument("--latency-reps", type=int, default=50)
    p.add_argument("--json", type=Path, default=None, help="write machine-readable results here")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of img/s and MFU per workload here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def _rel_err(a: Tensor, b: Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def _fp8_check(quantized: VisionEncoder, model: VisionEncoder, batch: PackedBatch, ours: dict, fp8: dict) -> dict:
    """fp8's speed-up over the default and its embeddings' agreement with the default's (token cosine)."""
    got, want = quantized(batch).float(), model(batch).float()
    cos = torch.nn.functional.cosine_similarity(got, want, dim=-1)
    return {"fp8_speedup": ours["ms"] / fp8["ms"], "fp8_rel_err": _rel_err(got, want),
            "fp8_token_cos_mean": cos.mean().item(), "fp8_token_cos_worst": cos.min().item()}  # fmt: skip


def _fp8_kernel_names(model: VisionEncoder) -> list[str]:
    return list(next(m.kernels.names for m in model.modules() if hasattr(m, "qweight")))


def _row(
    impl: str, name: str, batch: PackedBatch, flops: dict[str, int], t: dict[str, float], peak: float | None
) -> dict:
    sec = t["ms"] * 1e-3
    tflops = flops["total"] / sec / 1e12
    return {
        "workload": name,
        "impl": impl,
        "images": batch.num_images,
        "patches": batch.num_patches,
        "tokens": batch.num_tokens,
        "flops": flops,
        **t,
        "images_per_s": batch.num_images / sec,
        "tokens_per_s": batch.num_tokens / sec,
        "tflops": tflops,
        "mfu": None if peak is None else tflops / peak,
    }


def _variant_rows(
    model: VisionEncoder,
    name: str,
    batch: PackedBatch,
    grids: list[tuple[int, int]],
    flops: dict[str, int],
    ours: dict,
    args: argparse.Namespace,
    device: torch.device,
    peak: float | None,
) -> list[dict]:
    """Our encoder with each fast path switched (VARIANTS) and with other pixel dtypes (PIXEL_VARIANTS). A variant
    that fails is reported as a row with "error" and the bench goes on (the run's other figures are kept)."""
    config, reps = model.config, max(3, args.reps // 2)
    chosen = set(args.variants or (*VARIANTS, *PIXEL_VARIANTS))
    runs: list[tuple[str, dict[str, object], PackedBatch | torch.dtype]] = [
        *((variant, changes, batch) for variant, changes in VARIANTS.items() if variant in chosen),
        *(
            (variant, {}, dtype)
            for variant, dtype in PIXEL_VARIANTS.items()
            if variant in chosen and dtype != batch.pixel_values.dtype
        ),
    ]
    default = dataclasses.asdict(model.tower.options)
    rows = []
    for variant, changes, source in runs:
        try:
            model.tower.set_options(**changes)
            if isinstance(source, torch.dtype):
                source = random_batch(grids, config.patch_size, config.merge_kernel_size, args.seed, source)
            row = _row(variant, name, batch, flops, time_forward(model, source, 1, reps, device), peak)
            row["vs_default"] = ours["ms"] / row["ms"]
        except Exception as exc:  # keep the other variants' figures: GPU time is scarce
            print(f"{name:>8} {variant:>14} FAILED: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
            row = {"workload": name, "impl": variant, "error": f"{type(exc).__name__}: {exc}"[:500]}
        finally:
            model.tower.set_options(**default)
        rows.append(row)
    return rows


def _profile(model: VisionEncoder, name: str, batch: PackedBatch, device: torch.device) -> dict:
    """--profile: one warm forward of the default encoder under torch.profiler, printed and returned."""
    from mmproc.bench.profile import format_report, profile_forward  # only with --profile

    try:
        report = profile_forward(model, batch, device)
    except Exception as exc:  # the timed figures above are already in; do not lose them to the profiler
        print(f"profile {name} FAILED: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        return {"workload": name, "error": f"{type(exc).__name__}: {exc}"[:500]}
    print(format_report(name, report))
    return {"workload": name, **report}


def main(argv: Sequence[str] | None = None) -> int:
    args = _cpu_sized(_parse(argv))
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("mmproc bench encoder: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    from mmproc.bench.baseline import EagerBaseline  # imports torch only; kept lazy like the model

    args.dtype = args.dtype or ("float32" if device.type == "cpu" else "bfloat16")  # as `mmproc serve` picks it
    dtype = getattr(torch, args.dtype)
    peak, peak_note = (args.peak, f"peak {args.peak} TFLOP/s (--peak)") if args.peak else device_peak(device, dtype)
    pixel_dtype = pixel_transfer_dtype(device, dtype)
    config = PRESETS[args.preset]
    t0 = time.perf_counter()
    model = random_encoder(config, dtype, args.seed, device)
    _sync(device)
    build_s = time.perf_counter() - t0
    baseline = None if args.no_baseline or not EagerBaseline.supports(model) else EagerBaseline(model)
    rules = PreprocessConfig.default_for(config.family)
    quantized = None
    if args.fp8:
        from mmproc.models.quantize import KEEP, quantize_fp8

        quantized = copy.deepcopy(model)  # the same weights, quantized
        quantize_fp8(quantized, emulate=device.type != "cuda", keep=(*KEEP, *args.fp8_keep))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.machine()})"
    timing = "CUDA-event-timed" if device.type == "cuda" else "wall-clock-timed"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "missing"
    print(f"# {gpu} | torch {torch.__version__} | triton {triton_version} | {args.preset} {args.dtype} | pixels "
          f"{str(pixel_dtype).removeprefix('torch.')} | median of {args.reps} {timing} forwards after {args.warmup} | "
          f"{peak_note}")  # fmt: skip
    print(f"# model built (random weights on {device}) in {build_s:.2f} s")
    print(f"{'workload':>8} {'impl':>14} {'imgs':>4} {'patches':>6} {'ms':>8} {'img/s':>8} {'tok/s':>9} "
          f"{'TFLOP/s':>7} {'MFU':>6} {'ratio':>6} {'first_s':>7}")  # fmt: skip
    rows: list[dict] = []
    checks: list[dict] = []
    profiles: list[dict] = []
    phases = (
        2 + (baseline is not None) + (quantized is not None) + (args.variants is not None)
    )  # the bar moves after each timed phase
    progress = Progress(len(args.workloads) * phases, "encoder", unit="phase", enabled=False if args.quiet else None)
    with torch.inference_mode(), progress:
        for name in args.workloads:
            grids = workload_grids(name, args.seed, rules)
            batch = random_batch(
                grids, config.patch_size, config.merge_kernel_size, args.seed, pixel_dtype, device.type == "cuda"
            )
            flops = encoder_flops(config, grids)
            t = time_forward(model, batch, args.warmup, args.reps, device)
            ours = _row("mmproc", name, batch, flops, t, peak)
            progress.tick()
            check = {"workload": name, "syncs_per_forward": count_syncs(model, batch, device)}
            pipelined = _row("mmproc-b2b", name, batch, flops, time_back_to_back(model, batch, args.reps, device),
                             peak)  # fmt: skip
            # An upper bound on the CPU's cost: once CUDA's launch queue is full the host waits for the GPU.
            check["host_ms_to_issue_forward"] = round(pipelined["host_ms"], 2)
            progress.tick()
            group = [ours, pipelined]
            if baseline is not None:
                t = time_forward(baseline, batch, 1, args.reps, device)
                base = _row("eager-baseline", name, batch, flops, t, peak)
                ours["vs_baseline"] = base["ms"] / ours["ms"]
                check["rel_err_vs_baseline"] = _rel_err(model(batch), baseline(batch))
                group.append(base)
                progress.tick()
            if quantized is not None:
                t = time_forward(quantized, batch, args.warmup, args.reps, device)
                fp8 = _row("fp8", name, batch, flops, t, peak)
                check |= _fp8_check(quantized, model, batch, ours, fp8)
                check["fp8_syncs_per_forward"] = count_syncs(quantized, batch, device)  # 0: graph-capturable
                fp8["vs_default"] = check["fp8_speedup"]
                group.append(fp8)
                progress.tick()
            if args.variants is not None:
                group += _variant_rows(model, name, batch, grids, flops, ours, args, device, peak)
                progress.tick()
            for r in group:
                progress.print(_format_row(r))
            progress.print(_format_checks(check, model.tower.kernels(model.device, model.dtype).names))
            if args.profile:
                profiles.append(_profile(model, name, batch, device))
            rows += group
            checks.append(check)
            del batch
            if device.type == "cuda":
                torch.cuda.empty_cache()
    _summary(rows)
    save_plot(args.plot, lambda plt: plot_encoder(plt, rows, f"{args.preset} {args.dtype} on {gpu}"))
    latency = []
    if args.latency is not None and device.type == "cuda":
        from mmproc.bench.latency import latency_row, print_latency

        with torch.inference_mode():
            for name in args.latency or ["448x1", "1024x1", "256x4"]:
                grids = workload_grids(name, args.seed, rules)
                batch = random_batch(grids, config.patch_size, config.merge_kernel_size, args.seed, pixel_dtype, True)
                latency.append(latency_row(model, name, batch, args.latency_reps, device))
        print_latency(latency)
    attention = []
    if args.attention and device.type == "cuda":
        from mmproc.bench.attention_backends import attention_table  # its own module: one image's SDPA per backend

        attention = attention_table(config, dtype)
    if args.json is not None:
        record = {
            "bench": "encoder",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": git_commit() or "unknown",
            "dirty": git_dirty(),
            "command": [sys.executable, "-m", "mmproc.bench.forward", *(sys.argv[1:] if argv is None else argv)],
            "gpu": gpu,
            "device": str(device),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": triton_version,
            "python": platform.python_version(),
            "preset": args.preset,
            "dtype": args.dtype,
            "pixel_dtype": str(pixel_dtype).removeprefix("torch."),
            "peak_tflops": peak,
            "peak_note": peak_note,
            "model_build_s": build_s,
            "kernels": model.tower.kernels(model.device, model.dtype).names,
            "fp8_kernels": None if quantized is None else _fp8_kernel_names(quantized),
            "results": rows,
            "checks": checks,
            "attention": attention,
            "latency": latency,
            "profiles": profiles,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
