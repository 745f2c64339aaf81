"""`mmproc bench client`: what one Python consumer process spends per request, against a running `mmproc serve`.

How it measures: docs/bench.md; records: docs/benchmarks/client.md."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import platform
import pstats
import time
from collections.abc import Callable, Sequence

import torch

from mmproc.bench.images import ImageSpec, request_images
from mmproc.bench.provenance import git_commit, git_dirty
from mmproc.bench.report import Progress
from mmproc.client import AsyncEncoderClient, EncoderClient

MODES = ("sync", "async")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mmproc bench client", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--device", default="cpu", help="the consumer's device (cuda:N to include the H2D or IPC)")
    parser.add_argument("--transport", default="serialized", choices=("auto", "ipc", "serialized"))
    parser.add_argument("--modes", default="sync,async", help=f"comma-separated of {', '.join(MODES)}")
    parser.add_argument("--images", default="1,4", help="images per request, comma-separated")
    parser.add_argument("--size", type=int, default=512, help="square JPEGs of this many pixels a side")
    parser.add_argument("--requests", type=int, default=200, help="measured requests per case")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="then profile each case (cProfile, calling thread)")
    parser.add_argument("--top", type=int, default=12, help="profile entries printed per case")
    parser.add_argument("--json", default=None, help="write the figures (and profiles) here")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    args.images = [int(n) for n in args.images.split(",") if n]
    if not set(args.modes) <= set(MODES) or not args.images or min(args.images) < 1 or args.requests < 1:
        parser.error("--modes must name sync/async, --images positive counts, --requests >= 1")
    return args


def _payloads(count: int, size: int, n: int) -> list[tuple[bytes, ...]]:
    """`n` requests cycling over 8 distinct ones (the server's cache is bypassed: each is encoded afresh)."""
    spec = ImageSpec(resolutions=((size, size),))
    distinct = [request_images(7, i, count, spec) for i in range(8)]
    return [distinct[i % len(distinct)] for i in range(n)]


def _timed(run: Callable[[list[tuple[bytes, ...]]], None], payloads: list[tuple[bytes, ...]]) -> dict[str, float]:
    cpu, thread, wall = time.process_time(), time.thread_time(), time.perf_counter()
    run(payloads)
    n = len(payloads)
    return {
        "process_cpu_ms": (time.process_time() - cpu) * 1e3 / n,
        "thread_cpu_ms": (time.thread_time() - thread) * 1e3 / n,
        "wall_ms": (time.perf_counter() - wall) * 1e3 / n,
    }


def _profiled(run: Callable[[list[tuple[bytes, ...]]], None], payloads: list[tuple[bytes, ...]], top: int) -> str:
    profile = cProfile.Profile(time.thread_time)  # CPU time: waiting for the reply costs nothing
    profile.enable()
    run(payloads)
    profile.disable()
    return _top(profile, top)


def _top(profile: cProfile.Profile, top: int) -> str:
    """The `top` entries by own time, without pstats' preamble."""
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    return "\n".join(line for line in lines[start:] if line.strip())


def _case_sync(args: argparse.Namespace, payloads: list[tuple[bytes, ...]]) -> dict:
    client = EncoderClient(args.target, device=args.device, transport=args.transport, cache=False)
    try:

        def run(batch: list[tuple[bytes, ...]]) -> None:
            for images in batch:
                client.encode_images(images)
            if client.device.type == "cuda":
                torch.cuda.synchronize(client.device)

        run(payloads[: args.warmup])
        figures = _timed(run, payloads[args.warmup :])
        if args.profile:
            figures["profile"] = _profiled(run, payloads[args.warmup :], args.top)
        return figures
    finally:
        client.close()


def _case_async(args: argparse.Namespace, payloads: list[tuple[bytes, ...]]) -> dict:
    async def main() -> dict:
        async with AsyncEncoderClient(args.target, device=args.device, transport=args.transport, cache=False) as client:

            async def requests(batch: list[tuple[bytes, ...]]) -> None:
                for images in batch:
                    await client.encode_images(images)
                if client.device.type == "cuda":
                    torch.cuda.synchronize(client.device)

            # the loop's own thread does the client's work: time it from inside the loop
            await requests(payloads[: args.warmup])
            cpu, thread, wall = time.process_time(), time.thread_time(), time.perf_counter()
            await requests(payloads[args.warmup :])
            n = len(payloads) - args.warmup
            figures: dict = {
                "process_cpu_ms": (time.process_time() - cpu) * 1e3 / n,
                "thread_cpu_ms": (time.thread_time() - thread) * 1e3 / n,
                "wall_ms": (time.perf_counter() - wall) * 1e3 / n,
            }
            if args.profile:
                profile = cProfile.Profile(time.thread_time)  # CPU time: waiting for the reply costs nothing
                profile.enable()
                await requests(payloads[args.warmup :])
                profile.disable()
                figures["profile"] = _top(profile, args.top)
            return figures

    return asyncio.run(main())


CASES = {"sync": _case_sync, "async": _case_async}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    record: dict = {
        "bench": "client",
        "target": args.target,
        "device": args.device,
        "transport": args.transport,
        "size": args.size,
        "requests": args.requests,
        "commit": git_commit(),
        "dirty": git_dirty(),
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cases": [],
    }
    print(f"mmproc bench client: {args.target}, {args.transport}, {args.size}x{args.size} JPEGs, "
          f"{args.requests} sequential requests per case (commit {record['commit'] or '?'})")  # fmt: skip
    print(f"{'mode':6} {'images':>6} {'process CPU ms/req':>19} {'thread CPU ms/req':>18} {'wall ms/req':>12}")
    per_case = args.warmup + args.requests * (2 if args.profile else 1)  # ticked per case: none inside a timing
    progress = Progress(per_case * len(args.images) * len(args.modes), "client", unit="req",
                        enabled=False if args.quiet else None)  # fmt: skip
    with progress:
        for count in args.images:
            payloads = _payloads(count, args.size, args.warmup + args.requests)
            for mode in args.modes:
                figures = CASES[mode](args, payloads)
                record["cases"].append({"mode": mode, "images": count, **figures})
                progress.print(f"{mode:6} {count:6d} {figures['process_cpu_ms']:19.3f} "
                               f"{figures['thread_cpu_ms']:18.3f} {figures['wall_ms']:12.3f}")  # fmt: skip
                progress.tick(per_case)
    if args.profile:
        for case in record["cases"]:
            print(f"\n--- profile: {case['mode']}, {case['images']} image(s)/request, {args.requests} requests ---")
            print(case["profile"])
    if args.json:
        with open(args.json, "w") as out:
            json.dump(record, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
