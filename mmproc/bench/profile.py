"""`mmproc bench encoder --profile`: where one warm forward spends its time, by kernel category (CUDA kernels, or
aten ops on the CPU), plus the idle time; imported only with `--profile`."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import torch

from mmproc.types import PackedBatch

CATEGORIES = ("gemm", "attention", "layernorm/add-norm", "rope", "elementwise/gelu", "copies/H2D", "other")
TOP_KERNELS = 15
# First match wins, in this order; names are lower-cased. The order matters: cuDNN/flash attention kernels also
# contain "sm90"/"cutlass", copy kernels run inside "elementwise_kernel" templates, and our Triton kernels are
# named `_rope_kernel` / `_add_layer_norm_kernel`.
_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("rope", ("_rope_kernel", "rotary")),  # not bare "rope": "property" contains it
    ("layernorm/add-norm", ("layer_norm", "layernorm", "rowwisemoments")),
    ("attention", ("attention", "sdpa", "flash", "fmha", "varlen", "cudnn")),  # cuDNN runs only SDPA here
    (
        "copies/H2D",
        ("memcpy", "memset", "copy", "catarray", "aten::cat", "index_select", "indexselect", "gather", "_to_copy"),
    ),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "addmm", "aten::mm", "aten::bmm", "matmul", "splitk", "gemv")),
    (
        "elementwise/gelu",
        ("elementwise", "gelu", "vectorized", "unrolled", "aten::add", "aten::mul", "aten::sub", "aten::div"),
    ),
)


def categorize(name: str) -> str:
    """The category of a GPU kernel or aten op name (one of CATEGORIES)."""
    lowered = name.lower()
    for category, needles in _RULES:
        if any(needle in lowered for needle in needles):
            return category
    return "other"


def _device_rows(events: list) -> list[tuple[str, float, float]]:
    """(name, start_us, duration_us) of every kernel / memcpy / memset on the GPU timeline."""
    from torch.autograd import DeviceType

    rows = []
    for e in events:
        if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
            continue
        rows.append((e.name, e.time_range.start, e.time_range.elapsed_us()))
    return rows


def _cpu_rows(events: list) -> list[tuple[str, float, float]]:
    """(name, start_us, self_us) of every synchronous CPU op (self time: children not counted twice)."""
    from torch.autograd import DeviceType

    rows = []
    for e in events:
        if e.device_type != DeviceType.CPU or e.is_async or getattr(e, "is_user_annotation", False):
            continue
        rows.append((e.name, e.time_range.start, e.self_cpu_time_total))
    return rows


def summarize(rows: list[tuple[str, float, float]], forward_ms: float, top: int = TOP_KERNELS) -> dict:
    """Group (name, start_us, duration_us) rows into categories and top kernels; % are of `forward_ms`."""
    by_category = dict.fromkeys(CATEGORIES, 0.0)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, _, dur_us in rows:
        by_category[categorize(name)] += dur_us / 1e3
        entry = by_name[name]
        entry[0] += dur_us / 1e3
        entry[1] += 1
    busy_ms = sum(by_category.values())
    pct = (lambda ms: 100.0 * ms / forward_ms) if forward_ms > 0 else (lambda ms: 0.0)
    categories = [{"category": c, "ms": ms, "pct": pct(ms)} for c, ms in by_category.items()]
    ranked = sorted(by_name.items(), key=lambda item: item[1][0], reverse=True)[:top]
    kernels = [
        {"name": name, "ms": ms, "calls": int(calls), "pct": pct(ms), "category": categorize(name)}
        for name, (ms, calls) in ranked
    ]
    return {
        "forward_ms": forward_ms,
        "busy_ms": busy_ms,
        "idle_ms": forward_ms - busy_ms,
        "launches": len(rows),
        "categories": categories,
        "top_kernels": kernels,
        "gaps": gaps(rows),
    }


def gaps(rows: list[tuple[str, float, float]], top: int = 8, width: int = 60) -> dict:
    """Where the timeline is empty between one row's end and the next row's start: the total, and the largest
    gaps with the rows around them (what the GPU waited for). Overlapping rows (CPU ops nest) leave no gap."""
    ordered = sorted(rows, key=lambda row: row[1])
    found, end, before = [], None, None
    for name, start_us, dur_us in ordered:
        if end is not None and start_us > end:
            found.append(((start_us - end) / 1e3, before[:width], name[:width]))
        if end is None or start_us + dur_us >= end:
            end, before = start_us + dur_us, name
    largest = sorted(found, reverse=True)[:top]
    return {
        "between_ms": sum(ms for ms, _, _ in found),
        "count": len(found),
        "largest": [{"ms": ms, "after": after, "before": next_} for ms, after, next_ in largest],
    }


def profile_forward(fn: Callable[[PackedBatch], object], batch: PackedBatch, device: torch.device) -> dict:
    """Profile ONE forward `fn(batch)` (call it warm). CUDA: kernel times on the GPU timeline and the forward's
    CUDA-event time; CPU: aten self times and wall time. Returns `summarize`'s dict plus "activity"."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(batch)
            end.record()
            end.synchronize()
            forward_ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn(batch)
            forward_ms = (time.perf_counter() - t0) * 1e3
    events = list(prof.events())
    rows = _device_rows(events) if cuda else _cpu_rows(events)
    report = summarize(rows, forward_ms)
    report["activity"] = "cuda" if cuda else "cpu"
    return report


def format_report(workload: str, report: dict, width: int = 100) -> str:
    """The printed table: categories (ms, % of the forward), idle, then the top kernels with call counts."""
    unit = "GPU kernel" if report["activity"] == "cuda" else "CPU op (self)"
    lines = [
        f"profile {workload}: one warm forward {report['forward_ms']:.2f} ms, {unit} time "
        f"{report['busy_ms']:.2f} ms in {report['launches']} events"
    ]
    for row in report["categories"]:
        lines.append(f"  {row['category']:<20} {row['ms']:>10.2f} ms {row['pct']:>6.1f}%")
    idle = report["idle_ms"]
    lines.append(f"  {'idle (not covered)':<20} {idle:>10.2f} ms {100 * idle / max(report['forward_ms'], 1e-9):>6.1f}%")
    gap = report["gaps"]
    lines.append(f"  of which between rows {gap['between_ms']:.2f} ms in {gap['count']} gaps; the largest:")
    for g in gap["largest"]:
        lines.append(f"  {g['ms']:>10.3f} ms after {g['after']} -> before {g['before']}")
    lines.append(f"  top {len(report['top_kernels'])} by total time:")
    for k in report["top_kernels"]:
        name = k["name"] if len(k["name"]) <= width else k["name"][: width - 3] + "..."
        lines.append(f"  {k['ms']:>10.2f} ms {k['pct']:>6.1f}% {k['calls']:>6}x {k['category']:<18} {name}")
    return "\n".join(lines)
