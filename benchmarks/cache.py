"""`mmproc bench cache`: the two choices behind the embedding cache (docs/cache.md), measured in one run.

1. Content hash: MB/s of xxh3-128, blake3 and sha256 (the yardstick) over image-sized byte strings, median of
   `--reps` passes each; the ratio to sha256 is printed.
2. Eviction policy: hit ratio (and byte hit ratio) of S3-FIFO and LRU replaying the same seeded trace through the
   cache's own store (service/pipeline/cache/store.py), at several capacities. The trace mixes a Zipf(`--zipf`)
   popular set (chat turns re-sending images, agents re-sending screenshots) with a share of images seen once
   (batch jobs, `--one-hit-share`), with embedding sizes drawn from a few image sizes.

    mmproc bench cache [--requests 200000] [--popular 5000] [--zipf 0.9] [--one-hit-share 0.4] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from mmproc.bench.report import Progress
from mmproc.bench.serve_stats import environment
from service.pipeline.cache.keys import content_hash
from service.pipeline.cache.policy import POLICIES
from service.pipeline.cache.store import CacheStore, Entry

# Embedding bytes of typical images (tokens x 2048 x bf16): thumbnail, 448^2, 1024x768, a 4K screenshot.
SIZES_KIB = (256, 1024, 3072, 16384)
SIZE_WEIGHTS = (0.3, 0.4, 0.2, 0.1)
CAPACITY_SHARES = (0.01, 0.05, 0.1, 0.25)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmproc bench cache", description=__doc__.split("\n")[0])
    p.add_argument("--hash-sizes-kib", type=int, nargs="+", default=[64, 512, 4096])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--requests", type=int, default=200_000, help="trace length (image lookups)")
    p.add_argument("--popular", type=int, default=5000, help="distinct images in the popular set")
    p.add_argument("--zipf", type=float, default=0.9, help="skew of the popular set (weight of rank k: 1/k^zipf)")
    p.add_argument("--one-hit-share", type=float, default=0.4, help="share of lookups for images seen once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if not (1 <= args.reps <= 1000 and 1 <= args.requests <= 10_000_000 and 1 <= args.popular <= 1_000_000):
        p.error("--reps 1..1000, --requests 1..10^7, --popular 1..10^6")
    if not (0.0 <= args.one_hit_share < 1.0 and args.zipf > 0):
        p.error("--one-hit-share in [0, 1), --zipf > 0")
    return args


def hash_rates(sizes_kib: Sequence[int], reps: int) -> list[dict]:
    rng = np.random.default_rng(1)
    algorithms: dict[str, Callable[[bytes], object]] = {
        "xxh3-128": lambda data: content_hash(data, "xxh3"),
        "sha256": lambda data: hashlib.sha256(data).hexdigest(),
    }
    try:
        content_hash(b"", "blake3")
        algorithms["blake3"] = lambda data: content_hash(data, "blake3")
    except ImportError:
        pass
    rows = []
    for kib in sizes_kib:
        data = rng.bytes(kib * 1024)
        for name, fn in algorithms.items():
            fn(data)
            times = []
            for _ in range(reps):
                start = time.perf_counter()
                fn(data)
                times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            rows.append({"algorithm": name, "kib": kib, "us": seconds * 1e6, "mb_per_s": len(data) / seconds / 1e6})
    return rows


def trace(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """(ids, sizes in bytes) of every lookup: popular ids 0..P-1 by Zipf rank, one-hit ids from P up."""
    rng = np.random.default_rng([args.seed, 0x5F1F0])
    weights = 1.0 / np.arange(1, args.popular + 1) ** args.zipf
    popular = rng.choice(args.popular, size=args.requests, p=weights / weights.sum())
    once = rng.random(args.requests) < args.one_hit_share
    ids = np.where(once, args.popular + np.cumsum(once), popular)
    size_of = rng.choice(np.asarray(SIZES_KIB) * 1024, size=args.popular + args.requests + 1, p=SIZE_WEIGHTS)
    return ids, size_of[ids]


def replay(policy: str, ids: np.ndarray, sizes: np.ndarray, capacity: int) -> dict:
    store = CacheStore("host", capacity, policy, on_evict=lambda entry: None)
    hits = hit_bytes = 0
    for image, nbytes in zip(ids.tolist(), sizes.tolist()):
        key = str(image)
        if store.get(key) is not None:
            hits += 1
            hit_bytes += nbytes
        else:
            store.put(key, Entry(None, key, nbytes))  # type: ignore[arg-type]
    return {"hit_ratio": hits / len(ids), "byte_hit_ratio": hit_bytes / int(sizes.sum())}


def policy_rows(args: argparse.Namespace) -> list[dict]:
    bar = Progress(len(CAPACITY_SHARES) * len(POLICIES), "cache", unit="replay", enabled=False if args.quiet else None)
    with bar:
        return _policy_rows(args, bar)


def _policy_rows(args: argparse.Namespace, bar: Progress) -> list[dict]:
    ids, sizes = trace(args)
    unique, first = np.unique(ids, return_index=True)
    popular_bytes = int(sizes[first[unique < args.popular]].sum())  # what caching every popular image would take
    rows = []
    for share in CAPACITY_SHARES:
        capacity = max(1, int(popular_bytes * share))
        row = {"capacity_share": share, "capacity_mib": capacity / 2**20}
        for policy in POLICIES:
            started = time.perf_counter()
            row[policy] = replay(policy, ids, sizes, capacity)
            row[policy]["us_per_lookup"] = (time.perf_counter() - started) / len(ids) * 1e6
            bar.tick()
        rows.append(row)
    return rows


def markdown(record: dict) -> str:
    env, args = record["environment"], record["args"]
    lines = [f"# mmproc bench cache — {env['date']}", "", f"commit {(env['commit'] or '-')[:12]}, python "
             f"{env['python']}, host {env['host']}", "", "## Content hash (median of "
             f"{args['reps']})", "", "| KiB | algorithm | µs | MB/s | x sha256 |", "| ---: | --- | ---: | ---: | ---: |"]  # fmt: skip
    sha = {r["kib"]: r["mb_per_s"] for r in record["hash"] if r["algorithm"] == "sha256"}
    for r in record["hash"]:
        lines.append(f"| {r['kib']} | {r['algorithm']} | {r['us']:.1f} | {r['mb_per_s']:.0f} | "
                     f"{r['mb_per_s'] / sha[r['kib']]:.1f} |")  # fmt: skip
    lines += ["", f"## Eviction policy: {args['requests']} lookups, {args['popular']} popular images (Zipf "
              f"{args['zipf']}), {args['one_hit_share']:.0%} seen once, seed {args['seed']}", "",
              "| capacity (share of popular bytes) | MiB | LRU hit / byte hit | S3-FIFO hit / byte hit | S3-FIFO / LRU hits "
              "| µs per lookup LRU / S3-FIFO |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for row in record["policy"]:
        lru, s3 = row["lru"], row["s3fifo"]
        ratio = s3["hit_ratio"] / lru["hit_ratio"] if lru["hit_ratio"] else float("nan")
        lines.append(f"| {row['capacity_share']:.0%} | {row['capacity_mib']:.0f} | {lru['hit_ratio']:.3f} / "
                     f"{lru['byte_hit_ratio']:.3f} | {s3['hit_ratio']:.3f} / {s3['byte_hit_ratio']:.3f} | x{ratio:.3f} | "
                     f"{lru['us_per_lookup']:.2f} / {s3['us_per_lookup']:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    record = {
        "bench": "cache",
        "environment": environment(argv, "cpu") | {"command": ["mmproc", "bench", "cache", *(argv or sys.argv[1:])]},
        "args": vars(args) | {"json": str(args.json) if args.json else None},
        "hash": hash_rates(args.hash_sizes_kib, args.reps),
        "policy": policy_rows(args),
    }
    text = markdown(record)
    print(text, end="")
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
