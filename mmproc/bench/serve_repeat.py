"""`mmproc bench serve --repeat-ratio R[,R...]`: the embedding cache's A/B (docs/cache.md; method: docs/bench.md)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from mmproc.bench.client_processes import deal
from mmproc.bench.images import ImageSpec, generate_requests
from mmproc.bench.serve_load import Measure, result
from mmproc.bench.serve_pass import ClientConfig
from mmproc.bench.serve_stats import _fmt, _stat, environment

MAX_RATIOS = 8


def parse_ratios(text: str) -> tuple[float, ...]:
    ratios = tuple(float(item) for item in text.split(","))
    if not ratios or len(ratios) > MAX_RATIOS or any(not 0.0 <= r < 1.0 for r in ratios):
        raise ValueError(f"--repeat-ratio takes 1..{MAX_RATIOS} ratios in [0, 1), e.g. 0,0.5,0.9")
    return ratios


def repeat_workload(seed: int, requests: int, per_request: int, ratio: float) -> list[list[int]]:
    """Each request's image ids: a new id (the next fresh image) or, with probability `ratio`, one sent before."""
    rng = np.random.default_rng([seed, 0xCAC4E])
    out, fresh = [], 0
    for _ in range(requests):
        ids = []
        for _ in range(per_request):
            if fresh and rng.random() < ratio:
                ids.append(int(rng.integers(fresh)))
            else:
                ids.append(fresh)
                fresh += 1
        out.append(ids)
    return out


class PassPayloads(NamedTuple):
    measured: list  # [(request index, images)]
    warmups: list[list]  # one list per client process, images of its own
    distinct: int  # images of `measured` sent for the first time


def pass_payloads(args: argparse.Namespace, ratio: float, salt: int) -> PassPayloads:
    """One pass's payloads: its fresh images come from a seed of its own."""
    spec = ImageSpec(args.resolutions, args.resolution_order, args.format, args.quality)
    seed = args.seed * 100_003 + salt + 1
    # With --clients N the one plan of the pass is dealt, request k to process k mod N (serve_load.measurer), rather
    # than each process seeding its own: a repeat may then be of an image another process sent (the server's cache
    # is shared, as it is between the workers of an engine), and the share of repeats is the plan's R for any N.
    plan = repeat_workload(seed, args.requests, args.images_per_request, ratio)
    fresh = 1 + max(i for ids in plan for i in ids)
    extra = args.warmup * args.clients  # warm-up images, none shared: process i gets i, i + N, ...
    images = [p[0] for p in generate_requests(seed, range(fresh + extra), 1, spec,
                                              max_bytes=args.max_payload_mb * 2**20)]  # fmt: skip
    measured = [(n, tuple(images[i] for i in ids)) for n, ids in enumerate(plan)]
    warmup = [(args.requests + k, (images[fresh + k],) * args.images_per_request) for k in range(extra)]
    return PassPayloads(measured, deal(warmup, args.clients), fresh)


def run_repeat(args: argparse.Namespace, argv: Sequence[str] | None, info: dict, measure: Measure, base: ClientConfig
               ) -> tuple[str, dict]:  # fmt: skip
    """Every ratio with the cache on and off (ABBA over `--rounds`), then the hit-only pass. `measure` runs one pass
    (serve_load.measurer: in this process or in the --clients processes); `base` is the client config."""
    on, off = dataclasses.replace(base, cache=True), dataclasses.replace(base, cache=False)
    rows, salt = [], 0
    for ratio in args.repeat_ratio:
        phases: dict[str, list] = {"on": [], "off": []}
        sent = {"on": [0, 0], "off": [0, 0]}  # images of the measured passes: [sent, distinct]
        for r in range(args.rounds):
            for label, cfg in (("on", on), ("off", off)) if r % 2 == 0 else (("off", off), ("on", on)):
                salt += 1
                payloads = pass_payloads(args, ratio, salt)
                phases[label].append(measure(f"R={ratio} cache {label}", cfg, payloads.measured, payloads.warmups))
                sent[label][0] += args.requests * args.images_per_request
                sent[label][1] += payloads.distinct
        for label, cfg in (("on", on), ("off", off)):
            planned = {"images_planned": sent[label][0], "images_distinct": sent[label][1]}
            rows.append({"repeat_ratio": ratio, "cache": label, **planned,
                         **result(label, cfg, phases[label], args.json_raw)})  # fmt: skip
    salt += 1
    measured = pass_payloads(args, 0.0, salt).measured
    # the warm-up sends the measured requests themselves: every image is cached
    phase = measure("hit-only", on, measured, deal(measured, args.clients))
    hits = result("hits", on, [phase], args.json_raw)
    record = {"bench": "serve.repeat", "target": args.target, "environment": environment(argv, args.device),
              "server_info": info, "rows": rows, "hit_only": hits}  # fmt: skip
    return repeat_markdown(record, args), record


def repeat_markdown(record: dict, args: argparse.Namespace) -> str:
    env, info = record["environment"], record["server_info"]
    cache = info.get("cache", {})
    lines = [
        f"# mmproc bench serve --repeat-ratio — {env['date']}",
        "",
        f"- target `{record['target']}`; server: {info.get('model_name', '?')}, {info.get('device', '?')}, "
        f"{info.get('dtype', '?')}; cache {cache.get('policy', 'off')} host {int(cache.get('host_max_bytes', 0)) >> 20}"
        f" MiB / pool {int(cache.get('pool_max_bytes', 0)) >> 20} MiB; commit {(env['commit'] or '-')[:12]}",
        f"- workload: {args.requests} requests x {args.images_per_request} images ({args.format}, "
        f"{', '.join(f'{w}x{h}' for w, h in args.resolutions)}), transport {args.transport}, "
        f"{args.clients} client process(es) x concurrency {args.concurrency}, rounds {args.rounds} (ABBA), "
        f"seed {args.seed}",
        "",
        "| R | cache | completed / failed | img/s | p50 ms | p99 ms | send→reply p50 ms |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for row in record["rows"]:
        lines.append(
            f"| {row['repeat_ratio']:g} | {row['cache']} | {row['completed']} / {row['failed']} | "
            f"{_fmt(row['images_per_s'])} | {_stat(row['latency_ms'], 'p50')} | {_stat(row['latency_ms'], 'p99')} | "
            f"{_stat(row['stages_ms']['send_to_reply'], 'p50')} |"
        )
    lines += ["", "| R | throughput on / off | p50 off / on |", "| ---: | ---: | ---: |"]
    by = {(row["repeat_ratio"], row["cache"]): row for row in record["rows"]}
    for ratio in dict.fromkeys(row["repeat_ratio"] for row in record["rows"]):
        a, b = by[(ratio, "on")], by[(ratio, "off")]
        speed = a["images_per_s"] / b["images_per_s"] if b["images_per_s"] else None
        p50 = (b["latency_ms"] or {}).get("p50"), (a["latency_ms"] or {}).get("p50")
        lines.append(f"| {ratio:g} | x{_fmt(speed)} | x{_fmt(p50[0] / p50[1] if all(p50) else None)} |")
    repeated = [f"R={row['repeat_ratio']:g}: {1 - row['images_distinct'] / row['images_planned']:.3f}"
                for row in record["rows"] if row["cache"] == "on"]  # fmt: skip
    lines += ["", f"repeats planned (share of the images of the measured passes): {', '.join(repeated)}"]
    hits = record["hit_only"]
    lines += ["", f"hit-only pass (every image encoded just before): {_fmt(hits['images_per_s'])} img/s, "
              f"latency p50 {_stat(hits['latency_ms'], 'p50')} ms, send→reply p50 "
              f"{_stat(hits['stages_ms']['send_to_reply'], 'p50')} ms (client-side: an upper bound on the server's)"]  # fmt: skip
    return "\n".join(lines) + "\n"
