"""Timing one forward: CUDA-event timed on a CUDA device, wall-clock on the CPU (shared by the encoder and
attention benches)."""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from mmproc.types import PackedBatch

Forward = Callable[[PackedBatch], Tensor]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_forward(
    fn: Forward, batch: PackedBatch, warmup: int, reps: int, device: torch.device | None = None
) -> dict[str, float]:
    """First-call seconds, then the median/min ms of `reps` forwards after `warmup` more: CUDA-event timed on a
    CUDA device (the default), wall-clock on the CPU."""
    device = device or torch.device("cuda")
    _sync(device)
    t0 = time.perf_counter()
    fn(batch)
    _sync(device)
    first_s = time.perf_counter() - t0
    for _ in range(warmup):
        fn(batch)
    times = []
    for _ in range(reps):
        if device.type != "cuda":
            t0 = time.perf_counter()
            fn(batch)
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(batch)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return {"first_s": first_s, "ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}


def time_back_to_back(
    fn: Forward, batch: PackedBatch, reps: int, device: torch.device | None = None
) -> dict[str, float]:
    """ms per forward over `reps` forwards issued back to back with no synchronization between them, as the
    runner issues batches under load: each forward's CPU work (index tensors, launches) overlaps the previous
    forward's GPU work, which a forward timed alone from an idle GPU exposes. Call after `time_forward` (warm)."""
    device = device or torch.device("cuda")
    _sync(device)
    t0 = time.perf_counter()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn(batch)
        end.record()
        host_ms = (time.perf_counter() - t0) * 1e3 / reps  # the CPU's time to issue one forward
        end.synchronize()
        ms = start.elapsed_time(end) / reps
    else:
        for _ in range(reps):
            fn(batch)
        ms = host_ms = (time.perf_counter() - t0) * 1e3 / reps
    return {"first_s": 0.0, "ms": ms, "min_ms": ms, "max_ms": ms, "host_ms": host_ms}


def count_syncs(fn: Forward, batch: PackedBatch, device: torch.device | None = None) -> int:
    """Synchronizing CUDA calls during one (already warm) forward, from torch's sync debug mode warnings
    (0 on the CPU, where there is nothing to synchronize with)."""
    if device is not None and device.type != "cuda":
        return 0
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    messages = [str(w.message).lower() for w in caught]
    return sum("synchroniz" in m and "prototype" not in m for m in messages)  # not the mode's own notice
