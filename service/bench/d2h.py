"""The serialized path's yardstick: pinned vs pageable device<->host copy bandwidth, timed with CUDA events."""

from __future__ import annotations

import numpy as np
import torch


def _copy_ms(src: torch.Tensor, dst: torch.Tensor, reps: int) -> float:
    """Median ms of `dst.copy_(src)` timed with CUDA events (3 untimed copies first)."""
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def transport_microbench(device: str, megabytes: int, reps: int) -> dict:
    """Pinned vs pageable device->host copy (and host->device) of one `megabytes` MB uint8 tensor."""
    nbytes = megabytes * 10**6
    dev = torch.device(device if torch.device(device).type == "cuda" else "cuda")
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(7)
    hosts = {
        "pinned": torch.empty(nbytes, dtype=torch.uint8, pin_memory=True),
        "pageable": torch.empty(nbytes, dtype=torch.uint8),
    }
    rows = []
    for direction in ("d2h", "h2d"):
        for kind, host in hosts.items():
            src, dst = (gpu, host) if direction == "d2h" else (host, gpu)
            with torch.cuda.device(dev):  # events and copy on that GPU's current stream
                ms = _copy_ms(src, dst, reps)
            rows.append({"direction": direction, "host_memory": kind, "ms": ms, "gb_per_s": nbytes / ms / 1e6})
    pinned = rows[0]["gb_per_s"]
    return {"bytes": nbytes, "reps": reps, "gpu": torch.cuda.get_device_name(dev), "rows": rows,
            "serialized_target_gb_per_s": 0.5 * pinned}  # fmt: skip
