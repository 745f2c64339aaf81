"""`mmproc bench encoder --latency`: one small batch at a time on an idle GPU, eager and as a CUDA graph, against
the GPU's busy time (latency / busy near 1: the GPU sets the pace; far above: the launches do)."""

from __future__ import annotations

import statistics
import time

import torch

from mmproc.models import VisionEncoder
from mmproc.types import PackedBatch


def wall_latencies(fn, batch: PackedBatch, reps: int, device: torch.device) -> list[float]:
    """ms from calling `fn(batch)` until its work is done, `reps` times (warm)."""
    out = []
    for _ in range(reps):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn(batch)
        torch.cuda.synchronize(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _quantiles(ms: list[float]) -> dict[str, float]:
    ranked = sorted(ms)
    return {"p50_ms": statistics.median(ranked), "p99_ms": ranked[min(len(ranked) - 1, round(0.99 * len(ranked)))]}


def latency_row(model: VisionEncoder, name: str, batch: PackedBatch, reps: int, device: torch.device) -> dict:
    """Eager and graph-replayed latency of one workload, and the GPU busy time of one eager forward."""
    from mmproc.bench.profile import profile_forward

    saved = model.graphs
    model.graphs = None
    for _ in range(3):
        model(batch)
    eager = _quantiles(wall_latencies(model, batch, reps, device))
    busy_ms = profile_forward(model, batch, device)["busy_ms"]
    model.use_cuda_graphs(capacity=1, max_patches=batch.num_patches, min_hits=1)
    try:
        got = model(batch)  # captured and replayed
        graph, rel_err = {}, float("nan")
        if len(model.graphs.graphs) == 1:
            graph = _quantiles(wall_latencies(model, batch, reps, device))
            model.graphs.disabled = True  # the same inputs eagerly, for parity
            want = model(batch)
            rel_err = float((got.float() - want.float()).norm() / want.float().norm())
    finally:
        model.graphs = saved
    row = {"workload": name, "patches": batch.num_patches, "gpu_busy_ms": busy_ms, "reps": reps}
    row |= {f"eager_{k}": v for k, v in eager.items()}
    row |= {f"graph_{k}": v for k, v in graph.items()} | {"graph_rel_err_vs_eager": rel_err}
    return row


def print_latency(rows: list[dict]) -> None:
    print(f"{'workload':>8} {'patches':>7} {'gpu_ms':>7} {'eager p50':>9} {'p99':>7} {'graph p50':>9} {'p99':>7} "
          f"{'eager/gpu':>9} {'graph/gpu':>9} {'rel_err':>8}")  # fmt: skip
    for r in rows:
        g50, g99 = r.get("graph_p50_ms", float("nan")), r.get("graph_p99_ms", float("nan"))
        print(f"{r['workload']:>8} {r['patches']:>7} {r['gpu_busy_ms']:>7.2f} {r['eager_p50_ms']:>9.2f} "
              f"{r['eager_p99_ms']:>7.2f} {g50:>9.2f} {g99:>7.2f} {r['eager_p50_ms'] / r['gpu_busy_ms']:>9.2f} "
              f"{g50 / r['gpu_busy_ms']:>9.2f} {r['graph_rel_err_vs_eager']:>8.1e}")  # fmt: skip
