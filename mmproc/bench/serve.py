"""`mmproc bench serve`: a load generator, in its own process, against a running `mmproc serve`.

Modes, stages, options and exit status: docs/bench.md."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from mmproc.bench.catalog import checkout_module
from mmproc.bench.images import FORMATS, ORDERS, ImageSpec, generate_requests, parse_resolutions
from mmproc.bench.report import save_plot
from mmproc.bench.serve_load import measurer, run_plan
from mmproc.bench.serve_pass import ClientConfig, Payload
from mmproc.bench.serve_plot import plot_serve
from mmproc.bench.serve_repeat import parse_ratios, run_repeat
from mmproc.bench.serve_server import side_names
from mmproc.bench.serve_stats import (
    compare,
    environment,
    markdown,
)
from mmproc.wire.transports import Table

COMPARES: dict[str, tuple[tuple[str, dict[str, object]], ...]] = {
    "handle-cache": (("cache-on", {"handle_cache": True}), ("cache-off", {"handle_cache": False})),
    "transport": (("ipc", {"transport": "ipc"}), ("serialized", {"transport": "serialized"})),
}
MAX_CONCURRENCY = 256
MAX_CLIENT_PROCESSES = 64
MAX_REQUESTS = 100_000


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmproc bench serve", description=__doc__.split("\n")[0])
    add = p.add_argument
    add("--target", default="127.0.0.1:50051", help="HOST:PORT or unix:PATH of the server")
    add("--allow-remote", action="store_true", help="allow a non-loopback target")
    add("--mode", choices=["burst", "rate", "open"], default="burst")
    add("--requests", type=int, default=64, help="measured requests (all generated up front)")
    add("--concurrency", type=int, default=4, help="worker threads, one client each (the in-flight cap)")
    add("--clients", type=int, default=1,
        help="client processes, each with --concurrency threads and its share of the requests (burst, "
             "--repeat-ratio) or of the offered rate (open), started at one instant, pooled (one Python process has "
             "one GIL: what one engine worker process can drive, vs several)")  # fmt: skip
    add("--rate", type=float, default=None, help="rate mode: arrivals per second")
    add("--arrivals", choices=["poisson", "uniform"], default="poisson")
    add("--overload", type=float, default=None, help="open mode: offered load as a multiple of the measured C")
    add("--http-target", default="",
        help="HOST:PORT of the server's HTTP address: open mode needs it; burst and rate read the server's /metrics "
             "before and after each pass (CPU by role, the encoder's img/s)")  # fmt: skip
    add("--baseline-target", default="",
        help="burst: run the same load against this second server (HOST:PORT or unix:PATH) right after --target, "
             "and report both sides and their ratios")  # fmt: skip
    add("--baseline-http-target", default="", help="the baseline server's HTTP address, for its /metrics")
    add("--client", choices=["sync", "async"], default="sync",
        help="sync: --concurrency threads, one EncoderClient each; async: one event loop per client process, "
             "--concurrency tasks sharing one AsyncEncoderClient")  # fmt: skip
    add("--duration", type=float, default=30.0, help="open mode: seconds of open-loop load")
    add("--deadline-s", type=float, default=2.0, help="open mode: gRPC deadline of every request")
    add("--http-timeout-ms", type=int, default=0, help="open mode: HTTP x-mmproc-timeout-ms (0: no header)")
    add("--http-wait-s", type=float, default=65.0, help="open mode: how long an HTTP client waits at most")
    add("--batch-fraction", type=float, default=0.0,
        help="open mode: this share of the load's requests goes as batch work (x-mmproc-priority: batch)")  # fmt: skip
    add("--capacity-seconds", type=float, default=10.0, help="open mode: closed-loop capacity phase")
    add("--recovery-seconds", type=float, default=8.0, help="open mode: closed-loop probe after the load")
    add("--server-log", type=Path, default=None, help="open mode: the server's log, for its ERROR lines")
    add("--late-ms", type=float, default=5.0, help="rate mode: dispatch later than this counts as late")
    add("--images-per-request", type=int, default=1)
    add("--resolutions", type=parse_resolutions, default=((448, 448),), help="WxH[,WxH...]")
    add("--resolution-order", choices=ORDERS, default="cycle", help="cycle through, or draw with the seed")
    add("--format", choices=FORMATS, default="jpeg")
    add("--quality", type=int, default=90, help="JPEG/WebP quality")
    add("--seed", type=int, default=0)
    add("--max-payload-mb", type=int, default=2048, help="bound on the pre-generated request bytes")
    add("--transport", choices=["auto", *Table().by_name], default="auto",
        help="--compare transport: this one (ipc for auto) against serialized")  # fmt: skip
    add("--handle-cache", choices=["on", "off"], default="on")
    add("--server-cache", choices=["on", "off"], default="on",
        help="off: every request bypasses the server's embedding cache (a repeated pass is encoded again)")  # fmt: skip
    add("--device", default="cpu", help="consumer device: cpu | cuda:N")
    add("--consume", choices=["copy", "view"], default="copy")
    add("--timeout", type=float, default=60.0, help="per-request deadline, seconds")
    add("--warmup", type=int, default=4, help="requests sent first and left out of the stats")
    add("--max-seconds", type=float, default=600.0, help="stop the measured phase after this long")
    add("--compare", choices=sorted(COMPARES), default=None, help="run both sides (A, B) and report A/B ratios")
    add("--repeat-ratio", type=parse_ratios, default=None,
        help="R[,R...]: share of images that repeat an earlier one (seeded); runs each with the server's embedding "
        "cache on and off (bypass) and a hit-only pass (mmproc/bench/serve_repeat.py)")  # fmt: skip
    add("--rounds", type=int, default=None, help="passes per side, pooled (default 2 with --compare: A B B A; else 1)")
    add("--transport-microbench", action="store_true", help="CUDA only: D2H copy bandwidth, then exit")
    add("--microbench-mb", type=int, default=20)
    add("--reps", type=int, default=50, help="microbench repetitions (median reported)")
    add("--json", type=Path, default=None, help="write all numbers here")
    add("--json-raw", action="store_true", help="include per-request timings in --json")
    add("--markdown", type=Path, default=None, help="also write the summary here")
    add("--plot", type=Path, default=None, help="write a PNG here: latency CDF, throughput and latency per side")
    add("--quiet", action="store_true", help="no progress bar or notes on stderr")
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 2 if args.compare or args.repeat_ratio else 1
    return args


def _check_args(args: argparse.Namespace) -> str | None:
    """Why these flags cannot run (None when they can)."""
    if not 1 <= args.requests <= MAX_REQUESTS:
        return f"--requests must be in 1..{MAX_REQUESTS}"
    if not 1 <= args.rounds <= 100:
        return "--rounds must be in 1..100"
    if not 1 <= args.concurrency <= MAX_CONCURRENCY:
        return f"--concurrency must be in 1..{MAX_CONCURRENCY}"
    if not 1 <= args.clients <= MAX_CLIENT_PROCESSES:
        return f"--clients must be in 1..{MAX_CLIENT_PROCESSES}"
    if args.clients > 1 and args.mode == "rate":
        return "--clients > 1 needs --mode burst or open"
    if args.clients > args.requests and args.mode != "open":
        return "--clients must not exceed --requests (each process takes every N-th request)"
    if args.images_per_request < 1 or args.warmup < 0 or args.max_seconds <= 0 or args.timeout <= 0:
        return "--images-per-request >= 1, --warmup >= 0, --max-seconds > 0 and --timeout > 0 are required"
    if args.mode == "rate" and not (args.rate and args.rate > 0):
        return "--mode rate needs --rate > 0"
    if args.client == "async" and (args.mode != "burst" or args.consume != "copy"):
        return "--client async needs --mode burst and --consume copy (the async client returns copies)"
    if args.baseline_target and (args.mode != "burst" or args.compare or args.repeat_ratio is not None):
        return "--baseline-target needs --mode burst, without --compare or --repeat-ratio"
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        return f"--device {args.device}: CUDA is not available in this process"
    for target in (args.target, args.baseline_target) if args.baseline_target else (args.target,):
        remote = remote_host(target)
        if remote is not None and not args.allow_remote:
            return f"target host {remote!r} is not loopback; pass --allow-remote to benchmark a remote server"
    return None


def remote_host(target: str) -> str | None:
    """The host of a gRPC target when it is not loopback; None for unix sockets and loopback addresses."""
    if target.startswith(("unix:", "unix-abstract:")):
        return None
    rest = target.removeprefix("dns:///").removeprefix("ipv4:").removeprefix("ipv6:")
    bracketed = rest[1 : rest.find("]")] if rest.startswith("[") else None  # [::1]:50051
    host = bracketed or (rest if rest.count(":") != 1 else rest.rsplit(":", 1)[0])
    try:
        return None if ipaddress.ip_address(host).is_loopback else host
    except ValueError:
        pass
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return host
    loopback = addresses and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)
    return None if loopback else host


def _server_info(target: str, timeout: float) -> dict:
    from google.protobuf.json_format import MessageToDict

    from mmproc.client import EncoderClient

    with EncoderClient(target, transport="serialized", timeout=timeout) as client:
        info = client.server_info()
    return MessageToDict(info, preserving_proto_field_name=True)


def _microbench_main(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    if not torch.cuda.is_available():
        print("mmproc bench serve --transport-microbench: no CUDA GPU visible; skipped.", file=sys.stderr)
        return 0
    if not (1 <= args.microbench_mb <= 4096 and 1 <= args.reps <= 10_000):
        print("mmproc bench serve: --microbench-mb must be in 1..4096 and --reps in 1..10000", file=sys.stderr)
        return 2
    d2h = checkout_module("d2h")  # it times the server's own serialized path: benchmarks/d2h.py
    if d2h is None:
        print(
            "mmproc bench serve --transport-microbench: run `python3 -m benchmarks.d2h` from a checkout",
            file=sys.stderr,
        )
        return 2
    result = d2h.transport_microbench(args.device, args.microbench_mb, args.reps)
    lines = [f"# D2H/H2D copy of {result['bytes'] / 1e6:.0f} MB on {result['gpu']} (median of {args.reps}, "
             "CUDA events)", "", "| direction | host memory | ms | GB/s |", "| --- | --- | ---: | ---: |"]  # fmt: skip
    lines += [
        f"| {r['direction']} | {r['host_memory']} | {r['ms']:.3f} | {r['gb_per_s']:.1f} |" for r in result["rows"]
    ]
    lines += ["", f"serialized-path target (50% of pinned D2H): {result['serialized_target_gb_per_s']:.1f} GB/s"]
    _emit("\n".join(lines) + "\n", {"bench": "serve.transport_microbench",
                                    "environment": environment(argv, args.device), **result}, args)  # fmt: skip
    return 0


def _emit(text: str, record: dict, args: argparse.Namespace) -> None:
    print(text, end="")
    if args.markdown is not None:
        args.markdown.write_text(text)
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _note(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"mmproc bench serve: {message}", file=sys.stderr)


def _plan(args: argparse.Namespace) -> list[tuple[str, ClientConfig]]:
    base = ClientConfig(args.target, args.transport, args.handle_cache == "on", args.device, args.timeout, args.consume,
                        args.server_cache == "on")  # fmt: skip
    if args.baseline_target:
        return [("target", base), ("baseline", dataclasses.replace(base, target=args.baseline_target))]
    if args.compare is None:
        return [(f"{base.transport}", base)]
    if args.compare == "handle-cache" and (base.transport == "serialized" or torch.device(base.device).type != "cuda"):
        _note(args, "the handle cache only matters with --transport ipc|auto and a CUDA --device")
    sides = COMPARES[args.compare]
    if args.compare == "transport" and base.transport not in ("auto", "ipc", "serialized"):
        sides = ((base.transport, {"transport": base.transport}), sides[1])  # a transport of the table vs bytes
    return [(label, dataclasses.replace(base, **change)) for label, change in sides]  # type: ignore[arg-type]


def _workload(args: argparse.Namespace, mean_kib: float) -> dict:
    keys = ("mode", "requests", "images_per_request", "clients", "concurrency", "client", "rate", "arrivals",
            "format", "quality", "seed", "rounds")  # fmt: skip
    return {key: getattr(args, key) for key in (*keys, "warmup", "max_seconds", "resolution_order")} | {
        "resolutions": [f"{w}x{h}" for w, h in args.resolutions],
        "mean_image_kib": mean_kib,
    }


def _payloads(args: argparse.Namespace) -> tuple[list[Payload], list[Payload], float]:
    """(measured, warmup, mean KiB per image): measured requests are indices 0..N-1, warm-up ones follow."""
    spec = ImageSpec(args.resolutions, args.resolution_order, args.format, args.quality)
    n, k, per = args.requests, args.warmup, args.images_per_request
    t = time.perf_counter()
    payloads = generate_requests(args.seed, range(n + k), per, spec, max_bytes=args.max_payload_mb * 2**20)
    mean_kib = sum(len(b) for p in payloads[:n] for b in p) / (n * per) / 1024
    _note(args, f"generated {n + k} requests ({mean_kib:.1f} KiB/image) in {time.perf_counter() - t:.1f} s")
    return list(enumerate(payloads[:n])), [(n + i, p) for i, p in enumerate(payloads[n:])], mean_kib


def main(argv: Sequence[str] | None = None) -> int:
    from mmproc.bench import serve_video  # `--workload video`: its own flags (mmproc/bench/serve_video.py)

    if serve_video.wants_video(sys.argv[1:] if argv is None else list(argv)):
        return serve_video.main(sys.argv[1:] if argv is None else list(argv))
    args = _parse(argv)
    if args.transport_microbench:
        return _microbench_main(args, argv)
    problem = _check_args(args)
    if problem is not None:
        print(f"mmproc bench serve: {problem}", file=sys.stderr)
        return 2
    if args.mode == "open":
        from mmproc.bench import serve_open

        return serve_open.main(args, argv)
    infos = {}
    for target in filter(None, (args.target, args.baseline_target)):
        try:
            infos[target] = _server_info(target, min(args.timeout, 30.0))
        except Exception as exc:  # any failure here means there is nothing to benchmark
            print(f"mmproc bench serve: cannot reach {target}: {exc}", file=sys.stderr)
            return 1
    info = infos[args.target]
    if args.repeat_ratio is not None:
        base = ClientConfig(args.target, args.transport, args.handle_cache == "on", args.device, args.timeout,
                            args.consume)  # fmt: skip
        try:
            with measurer(args) as measure:
                text, record = run_repeat(args, argv, info, measure, base)
        except ValueError as err:  # payloads over --max-payload-mb
            print(f"mmproc bench serve: {err}", file=sys.stderr)
            return 2
        _emit(text, record, args)
        rows = [*record["rows"], record["hit_only"]]
        return 0 if all(r["failed"] == 0 and r["completed"] > 0 for r in rows) else 1
    try:
        measured, warmup, mean_kib = _payloads(args)
    except ValueError as err:
        print(f"mmproc bench serve: {err}", file=sys.stderr)
        return 2
    keep_raw, args.json_raw = args.json_raw, args.json_raw or args.plot is not None  # the CDF needs each request
    plan = _plan(args)
    metrics = (args.http_target, args.baseline_http_target) if args.baseline_target else (args.http_target,) * len(plan)
    runs = run_plan(plan, args, measured, warmup, metrics)
    if args.baseline_target:  # named by what the servers did (gpu / cpu decode) when that tells them apart
        for run, name in zip(runs, side_names(runs, ("target", "baseline"))):
            run["label"] = name
    record = {
        "bench": "serve",
        "target": args.target,
        "baseline_target": args.baseline_target or None,
        "environment": environment(argv, args.device),
        "server_info": info,
        "baseline_server_info": infos.get(args.baseline_target),
        "workload": _workload(args, mean_kib),
        "runs": runs,
        "compare": compare(runs) if len(runs) == 2 else None,
    }
    save_plot(args.plot, lambda plt: plot_serve(plt, record), note=lambda line: _note(args, line))
    for run in runs if not keep_raw else ():
        run.pop("requests", None)
    _emit(markdown(record), record, args)
    return 0 if all(r["failed"] == 0 and r["completed"] > 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
