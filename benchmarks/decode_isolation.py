"""`mmproc bench decode`: what decode isolation costs, thread pool vs process pool (service/pipeline/decode/pool.py).

For each image size it reports, per isolation mode:
  latency   one request of one image at a time (median of --repeat), i.e. the per-image overhead
  throughput  --concurrency requests of one image in flight, images per second over --repeat rounds
plus the pool's start-up time (forkserver + workers), the time to replace a crashed pool, and the RSS of
one process worker. Images are noise JPEGs/PNGs made in memory (deterministic). The replacement is measured by
replacing the workers on purpose, as a crash would (no worker is harmed, and no crash is logged).

    python -m benchmarks.decode_isolation [--sizes 64 448 1024 2048 4096] [--workers 2] [--repeat 20] [--json PATH]
                                   [--plot PATH.png] [--quiet]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from mmproc.bench.report import Progress, bars, save_plot, table
from mmproc.media import MediaLimits
from mmproc.preprocess import PreprocessConfig
from service.pipeline.decode.pool import DecodePool, DecodePoolConfig


def _image(side: int, fmt: str) -> bytes:
    rng = np.random.default_rng(side)
    # Smooth noise (upsampled) so that JPEG sizes look like photos, not worst-case noise.
    small = rng.integers(0, 256, (max(side // 8, 1), max(side // 8, 1), 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((side, side * 3 // 4), Image.Resampling.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))


async def _measure(pool: DecodePool, data: bytes, repeat: int, concurrency: int) -> dict[str, float]:
    await pool.prepare_all([data])  # warm
    latencies = []
    for _ in range(repeat):
        started = time.perf_counter()
        await pool.prepare_all([data])
        latencies.append(time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(repeat):
        await asyncio.gather(*(pool.prepare_all([data]) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {"latency_ms": statistics.median(latencies) * 1000, "images_per_s": repeat * concurrency / elapsed}


def run(sizes: Sequence[int], workers: int, repeat: int, concurrency: int, quiet: bool = True) -> dict:
    limits, preprocess = MediaLimits(), PreprocessConfig.kimi_vl()
    results: dict = {"cpus": os.cpu_count(), "workers": workers, "rows": []}
    pools = {}
    for isolation in ("thread", "process"):
        started = time.perf_counter()
        pool = DecodePool(limits, preprocess, DecodePoolConfig(isolation=isolation, workers=workers))
        pool.start()
        results[f"{isolation}_start_s"] = time.perf_counter() - started
        pools[isolation] = pool
    process = pools["process"]
    results["worker_rss_mb"] = [_rss_kb(pid) / 1024 for pid in process.worker_pids()]
    pool_log = logging.getLogger("service.pipeline.decode.pool")
    level, started = pool_log.level, time.perf_counter()
    pool_log.setLevel(logging.ERROR)  # its "a worker died" warning: this replacement is deliberate
    try:
        process._replace(process._executor)  # what a crash costs, minus the crash itself
        process.start()
    finally:
        pool_log.setLevel(level)
    results["process_replace_s"] = time.perf_counter() - started
    with Progress(len(sizes) * 2, "decode", unit="image kind", enabled=False if quiet else None) as progress:
        for side in sizes:
            for fmt in ("JPEG", "PNG"):
                data = _image(side, fmt)
                row = {"size": f"{side}x{side * 3 // 4}", "format": fmt, "bytes": len(data)}
                for isolation, pool in pools.items():
                    row[isolation] = asyncio.run(_measure(pool, data, repeat, concurrency))
                results["rows"].append(row)
                progress.tick()
    for pool in pools.values():
        pool.close()
    return results


def report(results: dict) -> str:
    """The rows as a table, the pool's start-up and replacement costs under it."""
    rows = [
        (r["size"], r["format"], r["bytes"] // 1024, r["thread"]["latency_ms"], r["process"]["latency_ms"],
         r["thread"]["images_per_s"], r["process"]["images_per_s"],
         r["process"]["images_per_s"] / r["thread"]["images_per_s"])
        for r in results["rows"]
    ]  # fmt: skip
    headers = ("size", "format", "KiB", "thread ms", "process ms", "thread img/s", "process img/s", "process/thread")
    rss = ", ".join(f"{mb:.0f}" for mb in results["worker_rss_mb"])
    return "\n".join([
        f"# decode: {results['workers']} workers on {results['cpus']} CPUs; latency = one image alone (median), "
        "img/s at the given concurrency",
        table(headers, rows),
        f"start-up: thread pool {results['thread_start_s']:.2f} s, process pool {results['process_start_s']:.2f} s; "
        f"replacing the process workers (as after a crash) {results['process_replace_s']:.2f} s; "
        f"worker RSS {rss} MB",
    ])  # fmt: skip


def plot_decode(plt: object, results: dict) -> None:
    labels = [f"{r['size']} {r['format']}" for r in results["rows"]]
    fig, (lat, rate) = plt.subplots(1, 2, figsize=(12, 4))  # type: ignore[attr-defined]
    for ax, key, unit in ((lat, "latency_ms", "ms per image"), (rate, "images_per_s", "images / s")):
        bars(ax, labels, {iso: [r[iso][key] for r in results["rows"]] for iso in ("thread", "process")}, unit)
        ax.tick_params(axis="x", labelrotation=45)
    lat.set_title("latency, one image alone")
    rate.set_title("throughput")
    fig.suptitle(f"decode isolation: {results['workers']} workers")


def _side(value: str) -> int:
    if not value.isdigit() or not 8 <= int(value) <= 16384:
        raise argparse.ArgumentTypeError(f"{value!r}: an image width in 8..16384")
    return int(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mmproc bench decode", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=_side, nargs="+", default=[64, 448, 1024, 2048, 4096], help="image widths")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", type=str, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of latency and img/s per image kind")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    results = run(args.sizes, args.workers, args.repeat, args.concurrency, args.quiet)
    print(report(results))
    save_plot(args.plot, lambda plt: plot_decode(plt, results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
