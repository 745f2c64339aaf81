"""`python -m benchmarks.fanout`: one encoder's output read by the N ranks of a tensor-parallel group, and
the handle-cache A/B at TP >= 2; `--p2p`: peer-to-peer bandwidth and IPC open/close cost across GPUs.

`--tp` spawned rank processes form a gloo group; rank 0 encodes with `readers=tp` and broadcasts the descriptor,
every rank reads and copies its views, then all meet at a barrier (the latency's end). `--compare handle-cache`
runs A B B A passes. What each figure counts: docs/bench.md. Exit status: 0 when every request succeeded on
every rank, 1 otherwise, 2 for bad flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import multiprocessing as mp
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from benchmarks.fanout_p2p import p2p_child, p2p_main
from benchmarks.fanout_record import _emit, _environment
from mmproc.bench.images import FORMATS, ImageSpec, generate_requests, parse_resolutions

TARGET_RATIO = 2.5
MAX_TP = 8  # = MAX_READERS of the lease table
COUNTERS = ("opens", "closes", "open_failures", "fallbacks", "errors")


@dataclasses.dataclass(frozen=True)
class FanoutConfig:
    target: str
    tp: int
    devices: tuple[str, ...]  # rank r's client device
    transport: str
    timeout: float
    requests: int
    warmup: int
    images_per_request: int
    resolutions: tuple[tuple[int, int], ...]
    fmt: str
    seed: int
    plan: tuple[tuple[str, bool], ...]  # (label, handle cache on) per measured phase, in run order


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fanout", description=__doc__.split("\n")[0])
    add = p.add_argument
    add("--target", default="127.0.0.1:50051")
    add("--tp", type=int, default=2, help="ranks (reader processes), rank 0 sends the requests")
    add("--devices", default=None, help="rank r's device: 'cpu' or CUDA indices '0,1,..' (default: r mod #GPUs)")
    add("--transport", choices=["auto", "ipc", "serialized"], default="ipc")
    add("--handle-cache", choices=["on", "off"], default="on")
    add("--compare", choices=["handle-cache"], default=None)
    add("--rounds", type=int, default=None, help="passes per side (default 2 with --compare: A B B A; else 1)")
    add("--requests", type=int, default=100)
    add("--warmup", type=int, default=10)
    add("--images-per-request", type=int, default=1)
    add("--resolutions", type=parse_resolutions, default=((448, 448),))
    add("--format", choices=FORMATS, default="jpeg")
    add("--seed", type=int, default=0)
    add("--timeout", type=float, default=60.0)
    add("--max-seconds", type=float, default=1800.0, help="kill the ranks after this long")
    add("--p2p", action="store_true", help="P2P bandwidth and IPC open/close cost across GPUs, then exit")
    add("--src", type=int, default=0, help="--p2p: the GPU that owns the buffer (the encoder's)")
    add("--mb", type=int, default=256, help="--p2p: buffer size, MiB")
    add("--reps", type=int, default=20, help="--p2p: repetitions (median reported)")
    add("--p2p-child", nargs=4, metavar=("HANDLE", "NBYTES", "UUID", "REPS"), help=argparse.SUPPRESS)
    add("--json", type=Path, default=None)
    add("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 2 if args.compare else 1
    return args


def _devices(spec: str | None, tp: int) -> tuple[str, ...]:
    if spec is None:
        count = torch.cuda.device_count()
        return tuple(f"cuda:{r % count}" if count else "cpu" for r in range(tp))
    items = [item.strip() for item in spec.split(",")]
    if items == ["cpu"]:
        return ("cpu",) * tp
    if len(items) != tp or not all(item.isdigit() for item in items):
        raise ValueError(f"--devices needs 'cpu' or {tp} CUDA indices, got {spec!r}")
    return tuple(f"cuda:{item}" for item in items)


def _config(args: argparse.Namespace) -> FanoutConfig:
    if not 1 <= args.tp <= MAX_TP:
        raise ValueError(f"--tp must be in 1..{MAX_TP}")
    if not (1 <= args.requests <= 100_000 and args.warmup >= 0 and 1 <= args.rounds <= 100 and args.timeout > 0):
        raise ValueError("--requests in 1..100000, --warmup >= 0, --rounds in 1..100 and --timeout > 0 are required")
    devices = _devices(args.devices, args.tp)
    if any(d != "cpu" for d in devices) and not torch.cuda.is_available():
        raise ValueError("CUDA devices were asked for but CUDA is not available")
    sides = [("cache-on", True), ("cache-off", False)] if args.compare else [("run", args.handle_cache == "on")]
    order = list(range(len(sides)))
    plan = [sides[i] for r in range(args.rounds) for i in (order if r % 2 == 0 else order[::-1])]
    return FanoutConfig(
        target=args.target,
        tp=args.tp,
        devices=devices,
        transport=args.transport,
        timeout=args.timeout,
        requests=args.requests,
        warmup=args.warmup,
        images_per_request=args.images_per_request,
        resolutions=args.resolutions,
        fmt=args.format,
        seed=args.seed,
        plan=tuple(plan),
    )


# -- the rank processes ---------------------------------------------------------------------------------------


def broadcast_bytes(blob: bytes | None, src: int = 0) -> bytes:
    """Rank `src`'s bytes on every rank of the default group (gloo: CPU tensors, no pickle)."""
    import torch.distributed as dist

    size = torch.tensor([len(blob) if blob is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src)
    n = int(size.item())
    if n == 0:
        return b""
    buffer = (
        torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob is not None else torch.empty(n, dtype=torch.uint8)
    )
    dist.broadcast(buffer, src)
    return buffer.numpy().tobytes()


def _read(client, shared, rank: int, device: torch.device) -> None:
    with client.read_shared(shared, rank) as views:
        copies = [view.clone() for view in views]  # an engine copies into its input embeddings here
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
    del copies


def _phase(cfg: FanoutConfig, rank: int, handle_cache: bool, payloads: list[tuple[bytes, ...]]) -> dict | None:
    """One pass with fresh clients on every rank; rank 0 returns the gathered numbers, the others None."""
    import torch.distributed as dist

    from mmproc.client import EncoderClient, SharedEmbeddings

    device = torch.device(cfg.devices[rank])
    n_measured = cfg.requests
    latency = torch.full((n_measured,), math.nan, dtype=torch.float64)
    encode = torch.full((n_measured,), math.nan, dtype=torch.float64)
    read = torch.full((n_measured,), math.nan, dtype=torch.float64)
    errors = 0
    client = EncoderClient(
        cfg.target, device=device, transport=cfg.transport, timeout=cfg.timeout, handle_cache=handle_cache
    )
    try:
        start = 0.0
        for i in range(cfg.warmup + n_measured):
            measured = i - cfg.warmup
            if measured == 0:
                dist.barrier()
                start = time.perf_counter()
            t0 = time.perf_counter()
            shared = blob = None
            if rank == 0:
                try:
                    shared = client.encode_images_shared(payloads[i], readers=cfg.tp)
                    blob = shared.to_bytes()
                except Exception:
                    errors += int(measured >= 0)
                    blob = b""
            t_encoded = time.perf_counter()
            blob = broadcast_bytes(blob if rank == 0 else None)
            t_bytes = time.perf_counter()
            ok = bool(blob)
            if ok:
                try:
                    _read(client, shared if rank == 0 else SharedEmbeddings.from_bytes(blob), rank, device)
                except Exception:
                    errors += int(measured >= 0)
                    ok = False
            t_ready = time.perf_counter()
            dist.barrier()
            if measured >= 0 and ok:
                latency[measured], encode[measured] = time.perf_counter() - t0, t_encoded - t0
                read[measured] = t_ready - t_bytes
        wall = time.perf_counter() - start
        stats = client.ipc_stats or {}
    finally:
        client.close()
    counters = torch.tensor([*(stats.get(k, 0) for k in COUNTERS[:4]), errors], dtype=torch.int64)
    gathered_read = [torch.empty_like(read) for _ in range(cfg.tp)]
    gathered_counters = [torch.empty_like(counters) for _ in range(cfg.tp)]
    dist.all_gather(gathered_read, read)
    dist.all_gather(gathered_counters, counters)
    if rank != 0:
        return None
    ok = [i for i in range(n_measured) if all(not math.isnan(r[i]) for r in gathered_read)]
    return {
        "handle_cache": handle_cache,
        "completed": len(ok),
        "failed": n_measured - len(ok),
        "wall_s": wall,
        "throughput_rps": len(ok) / max(wall, 1e-9),
        "latency_ms": stats_ms([latency[i].item() for i in ok]),
        "encode_ms": stats_ms([encode[i].item() for i in ok]),
        "read_ms_by_rank": [stats_ms([r[i].item() for i in ok]) for r in gathered_read],
        "counters_by_rank": [dict(zip(COUNTERS, c.tolist())) for c in gathered_counters],
    }


def _rank_main(rank: int, cfg: FanoutConfig, port: int, results: mp.Queue) -> None:
    import torch.distributed as dist

    device = torch.device(cfg.devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)  # never let a default touch another rank's (or the encoder's) GPU
    timeout = dt.timedelta(seconds=cfg.timeout * 2 + 60)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=cfg.tp, timeout=timeout
    )
    try:
        payloads: list[tuple[bytes, ...]] = []
        if rank == 0:
            spec = ImageSpec(cfg.resolutions, "cycle", cfg.fmt)
            n = cfg.warmup + cfg.requests
            generated = generate_requests(cfg.seed, range(n), cfg.images_per_request, spec, max_bytes=2 << 30)
            payloads = generated[cfg.requests :] + generated[: cfg.requests]  # warm-up first, then indices 0..N-1
        phases = [(label, _phase(cfg, rank, cache, payloads)) for label, cache in cfg.plan]
        if rank == 0:
            results.put(phases)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_fanout(cfg: FanoutConfig, max_seconds: float) -> list[tuple[str, dict]]:
    """Spawn the ranks, wait for them; rank 0's phases (label, numbers) in run order."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, cfg, port, results), name=f"rank-{r}") for r in range(cfg.tp)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + max_seconds
    phases = None
    while phases is None and time.monotonic() < deadline and procs[0].exitcode is None:
        try:
            phases = results.get(timeout=0.5)
        except Exception:  # queue.Empty
            continue
    for proc in procs:
        proc.join(max(1.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    if phases is None:
        raise RuntimeError(f"the ranks did not finish (exit codes {[p.exitcode for p in procs]})")
    return phases


def stats_ms(seconds: Sequence[float]) -> dict[str, float] | None:
    if not seconds:
        return None
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    p50, p99 = np.percentile(ms, [50, 99])
    return {"count": len(ms), "mean": float(ms.mean()), "p50": float(p50), "p99": float(p99), "max": float(ms.max())}


def pooled(phases: list[tuple[str, dict]]) -> list[dict]:
    """One row per side, its rounds pooled: throughput = completed / summed wall; latency stats of the means."""
    out = []
    for label in dict.fromkeys(label for label, _ in phases):
        runs = [p for name, p in phases if name == label]
        completed, wall = sum(r["completed"] for r in runs), sum(r["wall_s"] for r in runs)
        counters = [dict.fromkeys(COUNTERS, 0) for _ in runs[0]["counters_by_rank"]]
        for r in runs:
            for total, rank in zip(counters, r["counters_by_rank"]):
                for key in COUNTERS:
                    total[key] += rank[key]
        out.append({
            "label": label,
            "handle_cache": runs[0]["handle_cache"],
            "completed": completed,
            "failed": sum(r["failed"] for r in runs),
            "throughput_rps": completed / max(wall, 1e-9),
            "latency_mean_ms": _mean([r["latency_ms"] for r in runs]),
            "read_mean_ms_by_rank": [_mean([r["read_ms_by_rank"][k] for r in runs]) for k in range(len(counters))],
            "counters_by_rank": counters,
            "rounds": runs,
        })  # fmt: skip
    return out


def _mean(stats: list[dict | None]) -> float | None:
    present = [s for s in stats if s is not None]
    return sum(s["mean"] * s["count"] for s in present) / sum(s["count"] for s in present) if present else None


def markdown(cfg: FanoutConfig, sides: list[dict], compare: dict | None) -> str:
    lines = [
        f"# Fan-out: TP{cfg.tp}, ranks on {', '.join(cfg.devices)}, {cfg.images_per_request} x "
        f"{'/'.join(f'{w}x{h}' for w, h in cfg.resolutions)} {cfg.fmt} per request, {cfg.requests} requests",
        "",
        "| side | req/s | latency mean (ms) | read mean per rank (ms) | opens per rank | failed |",
        "| --- | ---: | ---: | --- | --- | ---: |",
    ]
    for s in sides:
        reads = " / ".join("-" if m is None else f"{m:.2f}" for m in s["read_mean_ms_by_rank"])
        opens = " / ".join(str(c["opens"]) for c in s["counters_by_rank"])
        latency = "-" if s["latency_mean_ms"] is None else f"{s['latency_mean_ms']:.2f}"
        lines.append(f"| {s['label']} | {s['throughput_rps']:.2f} | {latency} | {reads} | {opens} | {s['failed']} |")
    if compare is not None:
        ratio = compare["throughput_ratio"]
        lines += ["", f"cache on / off throughput: {'-' if ratio is None else f'{ratio:.2f}x'} "
                  f"(target >= {TARGET_RATIO}x: {'met' if compare['target_met'] else 'NOT met'})"]  # fmt: skip
    return "\n".join(lines) + "\n"


def fanout_main(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    try:
        cfg = _config(args)
    except ValueError as err:
        print(f"fanout: {err}", file=sys.stderr)
        return 2
    phases = run_fanout(cfg, args.max_seconds)
    sides = pooled(phases)
    compare = None
    if len(sides) == 2:
        on, off = sides
        ratio = on["throughput_rps"] / off["throughput_rps"] if off["throughput_rps"] else None
        compare = {"throughput_ratio": ratio, "target_ratio": TARGET_RATIO,
                   "target_met": ratio is not None and ratio >= TARGET_RATIO}  # fmt: skip
    record = {"bench": "fanout", "config": dataclasses.asdict(cfg), "environment": _environment(argv),
              "sides": sides, "compare": compare}  # fmt: skip
    _emit(markdown(cfg, sides, compare), record, args)
    return 0 if all(s["failed"] == 0 and s["completed"] > 0 for s in sides) else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.p2p_child:
        handle, nbytes, uuid, reps = args.p2p_child
        print(json.dumps(p2p_child(handle, int(nbytes), uuid, int(reps))), flush=True)
        return 0
    if args.p2p:
        return p2p_main(args, argv)
    return fanout_main(args, argv)


if __name__ == "__main__":
    sys.exit(main())
