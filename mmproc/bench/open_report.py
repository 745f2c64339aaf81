"""What `bench serve --mode open` reports: the server's metrics scraped during the run, goodput against capacity,
refusals, recovery, RSS, and the text and JSON record."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import Counter
from pathlib import Path

from mmproc.bench.open_load import KINDS, OVER_CODES, Outcome
from mmproc.bench.serve_stats import stats_ms
from mmproc.bench.server_metrics import CPU_ROLES, by_label, parse
from mmproc.priority import BATCH, INTERACTIVE

WINDOW_S = 5.0


RECOVERED = 0.9  # of C, over a 1 s window


class Scraper:
    """/metrics every `period` s: RSS (server + decode workers) and the request counters."""

    def __init__(self, http: tuple[str, int], period: float = 0.5) -> None:
        self.http, self.period = http, period
        self.rss: list[tuple[float, float]] = []  # (perf_counter, bytes)
        self.split: list[tuple[float, float]] = []  # (server's own, decode workers) bytes
        self.cached: list[float] = []  # the embedding cache's host tier, bytes: memory it is configured to hold
        self.pinned: list[float] = []  # torch's pinned host blocks (staging buffers, in use and cached), bytes
        self.pending: list[float] = []  # decoded pixels of admitted requests waiting for the encoder, bytes
        self.overrun: list[float | None] = []  # what the admission adds to its model, s (None: an older server)
        self.cpu: list[tuple[float, dict[str, float]]] = []  # (perf_counter, the server's CPU seconds by role)
        self._task: asyncio.Task | None = None

    async def scrape(self) -> dict[str, float]:
        reader, writer = await asyncio.open_connection(*self.http)
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: {self.http[0]}\r\nConnection: close\r\n\r\n".encode())
        text = (await reader.read()).decode(errors="replace").split("\r\n\r\n", 1)[-1]
        writer.close()
        values = parse(text)
        main = values.get("process_resident_memory_bytes", 0)
        workers = values.get("mmproc_decode_workers_resident_bytes", 0)
        at = time.perf_counter()
        self.rss.append((at, main + workers))
        self.split.append((main, workers))
        self.cached.append(values.get('mmproc_cache_bytes{tier="host"}', 0))
        self.pinned.append(values.get("mmproc_pinned_host_bytes", 0))
        self.pending.append(values.get("mmproc_pending_bytes", 0))
        self.overrun.append(values.get("mmproc_estimate_overrun_seconds"))
        self.cpu.append((at, by_label(values, "mmproc_cpu_seconds_total", "role")))
        return values

    def start(self) -> None:
        async def loop() -> None:
            while True:
                with contextlib.suppress(OSError):
                    await self.scrape()
                await asyncio.sleep(self.period)

        self._task = asyncio.create_task(loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def server_codes(before: dict[str, float], after: dict[str, float]) -> Counter:
    """Finished encode requests by code, both front ends, between two scrapes."""
    pattern = re.compile(r'mmproc_requests_total\{code="(\w+)",front_end="\w+",method="([^"]+)"\}')
    out: Counter = Counter()
    for key, value in after.items():
        m = pattern.fullmatch(key)
        if m and m.group(2) in ("EncodeImages", "EncodeImagesStream", "/v1/encode"):
            out[m.group(1)] += int(value - before.get(key, 0))
    return out


def bucket_deltas(before: dict[str, float], after: dict[str, float], name: str) -> dict[str, list[tuple[float, float]]]:
    """The histogram `name`'s cumulative bucket counts gained between two scrapes, by its other labels ("" when it
    has none, else e.g. 'generation="2"'): sorted (upper bound, count) pairs; {} where the server lacks it."""
    pattern = re.compile(rf'{name}_bucket\{{(?:(.*),)?le="([^"]+)"\}}')
    out: dict[str, list[tuple[float, float]]] = {}
    for key, value in after.items():
        if m := pattern.fullmatch(key):
            out.setdefault(m.group(1) or "", []).append((float(m.group(2)), value - before.get(key, 0.0)))
    return {labels: sorted(counts) for labels, counts in out.items()}


def loop_lag_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """The server's event-loop lag between two scrapes, p50 and p99 as the upper bounds of their histogram buckets
    (mmproc_event_loop_lag_seconds); None where the server does not export it."""
    buckets = bucket_deltas(before, after, "mmproc_event_loop_lag_seconds").get("", [])
    total = buckets[-1][1] if buckets else 0.0
    quantiles: dict[str, float | None] = {}
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        bound = next((le for le, count in buckets if total and count >= q * total), None)
        quantiles[name] = None if bound is None else bound * 1000
    return quantiles


def gc_pauses(before: dict[str, float], after: dict[str, float]) -> dict[str, dict[str, float]]:
    """The server's garbage-collector pauses between two scrapes (mmproc_gc_pause_seconds), by generation: how
    many, their total ms, and the longest as the upper bound of its histogram bucket; {} for an older server."""
    out = {}
    for labels, counts in sorted(bucket_deltas(before, after, "mmproc_gc_pause_seconds").items()):
        total = counts[-1][1]
        if total:
            total_key = f"mmproc_gc_pause_seconds_sum{{{labels}}}"
            out[labels.split('"')[1]] = {  # 'generation="2"' -> "2"
                "count": total,
                "total_ms": 1e3 * (after.get(total_key, 0.0) - before.get(total_key, 0.0)),
                "longest_ms_at_most": 1e3 * next(le for le, count in counts if count >= total),
            }
    return out


def server_cores(cpu: list[tuple[float, dict[str, float]]], t0: float, t_stop: float) -> dict[str, float]:
    """The server's cores by role (mmproc_cpu_seconds_total) between the first and the last scrape inside [t0,
    t_stop]; {} for a server without the family, or fewer than two scrapes inside."""
    inside = [(t, roles) for t, roles in cpu if t0 <= t <= t_stop and roles]
    if len(inside) < 2:
        return {}
    (start, first), (end, last) = inside[0], inside[-1]
    return {role: (last[role] - first.get(role, 0.0)) / (end - start) for role in CPU_ROLES if role in last}


def _recovery_s(samples: list[Outcome], t_stop: float, capacity: float) -> float | None:
    """Seconds from `t_stop` to the end of the first 1 s window of >= RECOVERED x capacity OK completions."""
    ends = sorted(s.end - t_stop for s in samples if s.code == "OK")
    for k in range(len(ends)):
        window_end = ends[k]
        done = sum(1 for e in ends if window_end - 1.0 < e <= window_end)
        if window_end >= 1.0 and done >= RECOVERED * capacity:
            return window_end
    return None


def error_lines(path: Path | None, offset: int) -> int | None:
    if path is None or not path.exists():
        return None
    with path.open("rb") as log:
        log.seek(offset)
        return sum(1 for line in log if b" ERROR " in line or b'"level": "ERROR"' in line)


def report(args, capacity: float, load: list[Outcome], recovery: list[Outcome], t0: float, t_stop: float,
           rss_idle: float, rss_peak: float, rss_detail: str, codes: Counter, errors: int | None,
           cache_growth: float = 0.0, pinned_growth: float = 0.0,
           pending_growth: float = 0.0) -> tuple[str, dict]:  # fmt: skip
    ok = [o for o in load if o.code == "OK" and (o.deadline_s is None or o.end - o.start <= o.deadline_s)]
    duration = t_stop - t0
    goodput = len(ok) / duration
    windows = []
    for w in range(max(1, round(duration / WINDOW_S))):  # the last arrival falls a little before the end
        lo, hi = t0 + w * WINDOW_S, t0 + (w + 1) * WINDOW_S
        windows.append(sum(1 for o in ok if lo <= o.end < hi) / WINDOW_S)
    refused = [o for o in load if o.code == "RESOURCE_EXHAUSTED"]
    client = Counter(o.code for o in load + recovery)
    by_kind = {k: Counter(o.code for o in load if o.kind == k) for k in KINDS}
    success_ms = {k: stats_ms([o.end - o.start for o in ok if o.kind == k]) for k in KINDS}
    rec = _recovery_s(recovery, t_stop, capacity)
    record = {
        "capacity_images_per_s": capacity,
        "offered_rate": args.rate,
        "duration_s": duration,
        "goodput_images_per_s": goodput,
        "goodput_vs_capacity": goodput / capacity,
        "window_goodput_vs_capacity": [w / capacity for w in windows],
        "refusal_ms": stats_ms([o.end - o.start for o in refused]),
        "refusal_ms_by_kind": {k: stats_ms([o.end - o.start for o in refused if o.kind == k]) for k in KINDS},
        "refusals_with_retry_after": sum(o.retry_after for o in refused if o.kind != "client"),
        "refusals_from_stub_and_http": sum(1 for o in refused if o.kind != "client"),
        "success_ms": success_ms,
        "deadline_s": args.deadline_s,
        "rss_idle_mb": rss_idle / 2**20,
        "rss_peak_mb": rss_peak / 2**20,
        "rss_detail": rss_detail,
        "cache_growth_mb": cache_growth / 2**20,
        "pinned_growth_mb": pinned_growth / 2**20,
        "pending_growth_mb": pending_growth / 2**20,
        "recovery_s": rec,
        "client_codes": dict(client),
        "server_codes": dict(codes),
        "codes_by_kind": {k: dict(v) for k, v in by_kind.items()},
        "error_lines": errors,
    }
    lines = [
        f"capacity C (closed loop, {args.clients} process(es) x {args.concurrency} clients): {capacity:.1f} images/s",
        f"offered: {args.rate:.1f} req/s ({args.rate / capacity:.2f} x C) for {duration:.1f} s, "
        f"{len(load)} requests ({', '.join(KINDS)} in turn); gRPC deadline {args.deadline_s} s, HTTP "
        + (f"x-mmproc-timeout-ms {args.http_timeout_ms}" if args.http_timeout_ms else "no deadline header"),
        f"goodput: {goodput:.1f} images/s = {goodput / capacity:.0%} of C; per {WINDOW_S:.0f} s window: "
        + " ".join(f"{w / capacity:.0%}" for w in windows),
        f"refusals: {len(refused)}, latency p50/p99/max "
        + (ms_of(record["refusal_ms"], "p50", "p99", "max") if refused else "-")
        + f" ms; with Retry-After/RetryInfo: {record['refusals_with_retry_after']}"
        f"/{record['refusals_from_stub_and_http']} (stub+HTTP)",
    ]
    for k in KINDS:
        lines.append(
            f"  {k:6s} codes {dict(by_kind[k])}; OK latency p50/p99/max {ms_of(success_ms[k], 'p50', 'p99', 'max')} ms;"
            f" refusal p50/p99 {ms_of(record['refusal_ms_by_kind'][k], 'p50', 'p99')} ms"
        )
    if any(o.batch for o in load):  # --batch-fraction: what each priority got
        record["by_priority"] = {}
        for name, batch in ((INTERACTIVE, False), (BATCH, True)):
            sent = [o for o in load if o.batch == batch]
            answered = sum(1 for o in ok if o.batch == batch) / duration
            sent_codes = dict(Counter(o.code for o in sent))
            record["by_priority"][name] = {"requests": len(sent), "goodput_images_per_s": answered, "codes": sent_codes}
            lines.append(
                f"  {name:11s} {len(sent)} requests: goodput {answered:.1f} images/s = {answered / capacity:.0%} of "
                f"C, codes {sent_codes}"
            )
    lines += [
        f"server RSS (main + decode workers): idle {rss_idle / 2**20:.0f} MB, peak {rss_peak / 2**20:.0f} MB "
        f"(+{(rss_peak - rss_idle) / 2**20:.0f} MB); {rss_detail}",
        f"  of which the embedding cache's host tier (bounded by --cache-mb): +{cache_growth / 2**20:.0f} MB at the "
        f"peak, pinned staging buffers +{pinned_growth / 2**20:.0f} MB, decoded pixels waiting for the encoder "
        f"+{pending_growth / 2**20:.0f} MB; the rest "
        f"+{(rss_peak - rss_idle - cache_growth - pinned_growth - pending_growth) / 2**20:.0f} MB",
        f"recovery to {RECOVERED:.0%} of C: " + ("not within the probe" if rec is None else f"{rec:.2f} s"),
        "server vs client: " + ", ".join(f"{c} {codes.get(c, 0)}/{client.get(c, 0)}" for c in OVER_CODES),
        f"ERROR lines in the server log: {'-' if errors is None else errors}",
    ]
    return "\n".join(lines) + "\n", record


def ms_of(stats: dict | None, *keys: str) -> str:
    return "-" if stats is None else "/".join(f"{stats[k]:.0f}" for k in keys)
