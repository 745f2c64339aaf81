"""`mmproc bench serve --mode open`: goodput under overload, against a running `mmproc serve` (gRPC + HTTP).

What it prints: docs/bench.md; figures: docs/benchmarks/overload.md."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence

from mmproc.bench.loop_watch import worst
from mmproc.bench.open_load import Load
from mmproc.bench.open_report import (
    Scraper,
    error_lines,
    gc_pauses,
    loop_lag_ms,
    ms_of,
    report,
    server_codes,
    server_cores,
)
from mmproc.bench.serve_open_phases import LocalPhases, ProcessPhases
from mmproc.bench.serve_stats import environment


async def run(args, argv: Sequence[str] | None) -> int:
    phases = LocalPhases(args) if args.clients == 1 else ProcessPhases(args, args.clients)
    scraper = Scraper(Load.http_address(args))
    log_offset = args.server_log.stat().st_size if args.server_log and args.server_log.exists() else 0
    await phases.start()
    try:
        await phases.closed(0, 2.0)  # warm-up; each phase its own image indices (10**8 apart): no cache hits
        await asyncio.sleep(0.5)
        await scraper.scrape()
        first = scraper.split[-1]
        capacity_samples = await phases.closed(10**8, args.capacity_seconds)
        ok = [s for s in capacity_samples if s.code == "OK"]
        capacity = len(ok) / args.capacity_seconds
        if capacity <= 0:
            print("mmproc bench serve --mode open: no request succeeded in the capacity phase", file=sys.stderr)
            return 1
        args.rate = args.rate or args.overload * capacity
        await asyncio.sleep(1.0)
        before = await scraper.scrape()
        rss_idle, idle, cache_idle, pinned_idle, pending_idle = (
            scraper.rss[-1][1], scraper.split[-1], scraper.cached[-1], scraper.pinned[-1], scraper.pending[-1]
        )  # fmt: skip
        scraper.start()
        t0 = time.perf_counter()  # the processes start START_MARGIN_S later: t0 is set from their first arrival
        phase = await phases.open_then_recover(2 * 10**8, args.rate, args.duration, 3 * 10**8)
        outcomes, recovery, t_stop = phase.load, phase.recovery, phase.t_stop
        t0 = min((o.start for o in outcomes), default=t0)
        await asyncio.sleep(0.5)
        await scraper.stop()
        after = await scraper.scrape()
    finally:
        await phases.close()
    loaded_at = [i for i, (t, _) in enumerate(scraper.rss) if t >= t0]
    peak_at = max(loaded_at, key=lambda i: scraper.rss[i][1])
    rss_peak = scraper.rss[peak_at][1]
    cache_growth = scraper.cached[peak_at] - cache_idle
    pinned_growth = scraper.pinned[peak_at] - pinned_idle
    pending_growth = scraper.pending[peak_at] - pending_idle
    loaded = scraper.split[len(scraper.split) - sum(1 for t, _ in scraper.rss if t >= t0) :]
    mb = [round(v / 2**20) for v in (*first, *idle, max(m for m, _ in loaded), max(w for _, w in loaded))]
    detail = f"server/workers MB: before capacity {mb[0]}/{mb[1]}, idle {mb[2]}/{mb[3]}, peak {mb[4]}/{mb[5]}"
    text, record = report(args, capacity, outcomes, recovery, t0, t_stop, rss_idle, rss_peak, detail,
                          server_codes(before, after), error_lines(args.server_log, log_offset), cache_growth,
                          pinned_growth, pending_growth)  # fmt: skip
    record = {"bench": "serve.open", "environment": environment(argv, "cpu"), "target": args.target,
              "http_target": args.http_target, **record}  # fmt: skip
    lag = record["loop_lag_ms"] = loop_lag_ms(before, after)
    if lag["p99"] is not None:
        text += (
            f"server event-loop lag under load: p50 <= {lag['p50']:g} ms, p99 <= {lag['p99']:g} ms (bucket bounds)\n"
        )
    pauses = record["gc_pauses"] = gc_pauses(before, after)
    if pauses:
        text += (
            "server GC pauses under load: "
            + "; ".join(
                f"generation {g}: {p['count']:.0f}, {p['total_ms']:.0f} ms in all, longest <= {p['longest_ms_at_most']:g} ms"
                for g, p in pauses.items()
            )
            + "\n"
        )
    cores = record["server_cores"] = server_cores(scraper.cpu, t0, t_stop)
    if cores:
        text += "server cores under load by role: " + ", ".join(f"{r} {c:.2f}" for r, c in cores.items()) + "\n"
    generator = record["generator"] = worst(phase.generator)
    if generator["lag_ms"] is not None:
        text += (
            f"load generator ({generator['processes']} process(es)) while offering the load: event-loop lag "
            f"p50/p99/max {ms_of(generator['lag_ms'], 'p50', 'p99', 'max')} ms, loop CPU "
            f"{generator['loop_cpu_share']:.0%} of a core (the worst process; its lag is in the latencies it saw)\n"
        )
    overrun = sorted(v for v in (scraper.overrun[i] for i in loaded_at) if v is not None)
    if overrun:
        record["estimate_overrun_ms"] = {"p50": 1e3 * overrun[len(overrun) // 2], "max": 1e3 * overrun[-1]}
        text += (
            f"admission's measured overrun under load (mmproc_estimate_overrun_seconds): p50 "
            f"{record['estimate_overrun_ms']['p50']:.0f} ms, max {record['estimate_overrun_ms']['max']:.0f} ms\n"
        )
    print(text, end="")
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return 0


def main(args, argv: Sequence[str] | None = None) -> int:
    if not args.http_target:
        print("mmproc bench serve --mode open: --http-target HOST:PORT is required", file=sys.stderr)
        return 2
    if not (args.rate or args.overload) or args.duration <= 0:
        print("mmproc bench serve --mode open: needs --rate R or --overload X, and --duration > 0", file=sys.stderr)
        return 2
    return asyncio.run(run(args, argv))
