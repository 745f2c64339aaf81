"""`mmproc bench decode`: what decode isolation costs, thread pool vs process pool (service/decode_pool.py).

For each image size it reports, per isolation mode:
  latency   one request of one image at a time (median of --repeat), i.e. the per-image overhead
  throughput  --concurrency requests of one image in flight, images per second over --repeat rounds
plus the pool's start-up time (forkserver + workers), the time to replace a crashed pool, and the RSS of
one process worker. Images are noise JPEGs/PNGs made in memory (deterministic).

    python -m service.bench.decode [--sizes 64 448 1024 2048 4096] [--workers 2] [--repeat 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import time
from collections.abc import Sequence

import numpy as np
from PIL import Image

from mmproc.media import MediaLimits
from mmproc.preprocess import PreprocessConfig
from service.decode_pool import DecodePool, DecodePoolConfig


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


def run(sizes: Sequence[int], workers: int, repeat: int, concurrency: int) -> dict:
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
    started = time.perf_counter()
    process._replace(process._executor)  # what a crash costs, minus the crash itself
    process.start()
    results["process_replace_s"] = time.perf_counter() - started
    for side in sizes:
        for fmt in ("JPEG", "PNG"):
            data = _image(side, fmt)
            row = {"size": f"{side}x{side * 3 // 4}", "format": fmt, "bytes": len(data)}
            for isolation, pool in pools.items():
                row[isolation] = asyncio.run(_measure(pool, data, repeat, concurrency))
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
    for pool in pools.values():
        pool.close()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mmproc bench decode", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 448, 1024, 2048, 4096])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args(argv)
    results = run(args.sizes, args.workers, args.repeat, args.concurrency)
    summary = {k: v for k, v in results.items() if k != "rows"}
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
