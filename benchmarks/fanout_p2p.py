"""`mmproc bench fanout --p2p`: the raw cost of CUDA IPC between GPUs (first open, open/close, read and write
through the mapping), each destination in a fresh process, against a plain torch peer copy."""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np
import torch

from benchmarks.fanout_record import _emit, _environment


def _median_ms(fn, reps: int) -> float:
    """Median wall ms of `fn()` (which synchronizes what it times)."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(dst.device)
    torch.cuda.synchronize(src.device)


def p2p_child(handle_hex: str, nbytes: int, uuid: str, reps: int) -> dict:
    """In a fresh process: open the buffer on OUR GPU `uuid`; first-open, open/close and copy costs."""
    from mmproc.transport.cuda_ipc import runtime as cuda_ipc

    index = cuda_ipc.device_index_by_uuid(uuid)
    assert index is not None, f"GPU {uuid} is not visible here"
    torch.cuda.set_device(index)
    handle = bytes.fromhex(handle_hex)
    t = time.perf_counter()
    ptr = cuda_ipc.open_handle(handle, index)  # the first open of this process: maps, enables peer access
    cold_ms = (time.perf_counter() - t) * 1e3
    cuda_ipc.close_handle(ptr, index)
    opens, closes = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        ptr = cuda_ipc.open_handle(handle, index)
        t1 = time.perf_counter()
        cuda_ipc.close_handle(ptr, index)
        opens.append((t1 - t0) * 1e3)
        closes.append((time.perf_counter() - t1) * 1e3)
    ptr = cuda_ipc.open_handle(handle, index)
    owner = object()
    mapped = cuda_ipc.wrap(ptr, nbytes, index, owner=owner)  # (nbytes,) uint8, the producer's memory
    local = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", index))
    read_ms = _median_ms(functools.partial(_copy, local, mapped), reps)
    write_ms = _median_ms(functools.partial(_copy, mapped, local), reps)
    del mapped, local
    torch.cuda.synchronize(index)
    cuda_ipc.close_handle(ptr, index)
    return {"uuid": uuid, "open_first_ms": cold_ms, "open_ms_p50": float(np.median(opens)),
            "close_ms_p50": float(np.median(closes)), "read_gb_per_s": nbytes / read_ms / 1e6,
            "write_gb_per_s": nbytes / write_ms / 1e6}  # fmt: skip


def p2p_main(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    if not torch.cuda.is_available():
        print("fanout --p2p: no CUDA GPU visible; skipped.", file=sys.stderr)
        return 0
    from mmproc.transport.cuda_ipc import runtime as cuda_ipc

    count, src = torch.cuda.device_count(), args.src
    if not (0 <= src < count and 1 <= args.mb <= 16384 and 1 <= args.reps <= 10_000):
        print(f"fanout --p2p: --src in 0..{count - 1}, --mb in 1..16384, --reps in 1..10000", file=sys.stderr)
        return 2
    nbytes = args.mb << 20
    ptr, handle = cuda_ipc.malloc_exportable(nbytes, src)
    rows = []
    try:
        cuda_ipc.wrap(ptr, nbytes, src, owner=rows).fill_(7)
        torch.cuda.synchronize(src)
        source = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src}")
        for dst in range(count):
            uuid = cuda_ipc.device_uuid(dst)
            child = [sys.executable, "-m", "benchmarks.fanout", "--p2p-child", handle.hex(), str(nbytes), uuid,
                     str(args.reps)]  # fmt: skip
            done = subprocess.run(child, capture_output=True, text=True, timeout=600)
            row: dict = {"src": src, "dst": dst, "same_gpu": dst == src,
                         "peer_access": dst == src or torch.cuda.can_device_access_peer(dst, src)}  # fmt: skip
            if done.returncode == 0:
                row |= json.loads(done.stdout.strip().splitlines()[-1])
            else:
                row["error"] = done.stderr.strip()[-500:]
            copy = functools.partial(_copy, torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}"), source)
            row["torch_copy_gb_per_s"] = nbytes / _median_ms(copy, args.reps) / 1e6
            rows.append(row)
    finally:
        torch.cuda.synchronize(src)
        cuda_ipc.free(ptr, src)
    lines = [f"# P2P from GPU {src}: {args.mb} MiB, median of {args.reps}", "",
             "| dst | first open (ms) | open (ms) | close (ms) | read via IPC (GB/s) | write via IPC (GB/s) | "
             "torch copy (GB/s) |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['dst']} | error: {r['error'][:80]} | | | | | |")
            continue
        lines.append(f"| {r['dst']}{' (same)' if r['same_gpu'] else ''} | {r['open_first_ms']:.2f} | "
                     f"{r['open_ms_p50']:.3f} | {r['close_ms_p50']:.3f} | {r['read_gb_per_s']:.1f} | "
                     f"{r['write_gb_per_s']:.1f} | {r['torch_copy_gb_per_s']:.1f} |")  # fmt: skip
    record = {"bench": "fanout.p2p", "environment": _environment(argv), "bytes": nbytes, "reps": args.reps,
              "rows": rows}  # fmt: skip
    _emit("\n".join(lines) + "\n", record, args)
    return 0 if all("error" not in r for r in rows) else 1
