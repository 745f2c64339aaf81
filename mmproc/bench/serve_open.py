"""`mmproc bench serve --mode open`: goodput under overload, against a running `mmproc serve` (gRPC + HTTP).

Three phases on one asyncio loop: capacity C (closed loop), open-loop load at `--rate` or `--overload` x C from
the Python client, a raw stub and HTTP, then recovery to 90% of C. Every image is unique, so no cache answers.
What it prints: docs/bench.md; figures: docs/benchmarks/overload.md.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mmproc.bench.images import ImageSpec, generate_requests
from mmproc.bench.loop_watch import worst
from mmproc.bench.serve_stats import environment, stats_ms
from mmproc.bench.server_metrics import CPU_ROLES, by_label, parse
from mmproc.priority import BATCH, INTERACTIVE, PRIORITY_HEADER

KINDS = ("client", "stub", "http")
WINDOW_S = 5.0
RECOVERED = 0.9  # of C, over a 1 s window
OVER_CODES = ("DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED")


@dataclasses.dataclass
class Outcome:
    kind: str
    start: float  # perf_counter seconds
    end: float
    code: str  # gRPC code name (HTTP statuses mapped to theirs)
    retry_after: bool = False  # a refusal that said when to come back (Retry-After / RetryInfo)
    deadline_s: float | None = None
    back_off_s: float = 0.0  # the Python client's refusal: the server's retry-after, which a closed loop honours
    batch: bool = False  # sent as batch work (x-mmproc-priority: batch)


def unique_jpeg(jpeg: bytes, index: int) -> bytes:
    """The same picture with a COM segment naming `index`: other bytes, same pixels (defeats content caches)."""
    text = f"mmproc-bench {index}".encode()
    return jpeg[:2] + b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text + jpeg[2:]


def _status_name(http_status: int) -> str:
    return {200: "OK", 400: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE",
            504: "DEADLINE_EXCEEDED", 500: "INTERNAL"}.get(http_status, f"HTTP_{http_status}")  # fmt: skip


class Load:
    """The three kinds of client of one run, on the running loop."""

    def __init__(self, args) -> None:
        import grpc

        from mmproc.client import AsyncEncoderClient
        from mmproc.v1 import encoder_pb2_grpc as pb_grpc

        self.args = args
        self.client = AsyncEncoderClient(args.target, transport="serialized", timeout=args.deadline_s)
        self.batch_client = AsyncEncoderClient(
            args.target, transport="serialized", timeout=args.deadline_s, priority=BATCH
        )
        self.channel = grpc.aio.insecure_channel(args.target, options=[("grpc.max_receive_message_length", 64 << 20)])
        self.stub = pb_grpc.EncoderStub(self.channel)
        self.http = self.http_address(args)

    @staticmethod
    def http_address(args) -> tuple[str, int]:
        host, _, port = args.http_target.removeprefix("http://").rpartition(":")
        return host, int(port)

    async def close(self) -> None:
        await self.client.close()
        await self.batch_client.close()
        await self.channel.close()

    async def one(self, kind: str, image: bytes, batch: bool = False) -> Outcome:
        start = time.perf_counter()
        deadline = self.args.deadline_s
        back_off = 0.0
        if kind == "client":
            code, back_off = await self._client(image, batch)
            hint = back_off > 0
        elif kind == "stub":
            code, hint = await self._stub(image, batch)
        else:
            code, hint = await self._http(image, batch)
            deadline = self.args.http_timeout_ms / 1000 if self.args.http_timeout_ms else None
        return Outcome(kind, start, time.perf_counter(), code, hint, deadline, back_off, batch)

    async def _client(self, image: bytes, batch: bool) -> tuple[str, float]:
        from mmproc.errors import MmprocError, ResourceExhaustedError

        client = self.batch_client if batch else self.client
        try:
            await client.encode_images([image], timeout=self.args.deadline_s)
            return "OK", 0.0
        except ResourceExhaustedError as err:
            return err.grpc_code, err.retry_after_s or 0.0
        except MmprocError as err:
            return err.grpc_code, 0.0

    async def _stub(self, image: bytes, batch: bool) -> tuple[str, bool]:
        import grpc
        from google.rpc import error_details_pb2, status_pb2

        from mmproc.v1 import encoder_pb2 as pb

        request = pb.EncodeImagesRequest(images=[image], transport=pb.TRANSPORT_SERIALIZED)
        try:
            await self.stub.EncodeImages(request, timeout=self.args.deadline_s, metadata=_priority(batch))
            return "OK", False
        except grpc.aio.AioRpcError as err:
            hint = False
            for key, value in err.trailing_metadata() or ():
                if key == "grpc-status-details-bin":
                    status = status_pb2.Status.FromString(value)
                    hint = any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details)
            return err.code().name, hint

    async def _http(self, image: bytes, batch: bool) -> tuple[str, bool]:
        body = json.dumps({"images": [base64.b64encode(image).decode()]}).encode()
        head = f"POST /v1/encode HTTP/1.1\r\nHost: {self.http[0]}\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(body)}\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in _priority(batch))
        if self.args.http_timeout_ms:
            head += f"x-mmproc-timeout-ms: {self.args.http_timeout_ms}\r\n"
        try:
            reader, writer = await asyncio.open_connection(*self.http)
            writer.write(head.encode() + b"\r\n" + body)
            response = await asyncio.wait_for(reader.read(), timeout=self.args.http_wait_s)
            writer.close()
        except (OSError, asyncio.TimeoutError) as exc:
            return type(exc).__name__, False
        status_line, _, rest = response.partition(b"\r\n")
        headers = rest.split(b"\r\n\r\n", 1)[0].lower()
        status = int(status_line.split()[1]) if len(status_line.split()) > 1 else 0
        return _status_name(status), b"\nretry-after:" in b"\n" + headers


def _priority(batch: bool) -> tuple[tuple[str, str], ...]:
    return ((PRIORITY_HEADER, BATCH),) if batch else ()


async def closed_loop(load: Load, base: list[bytes], first: int, seconds: float, workers: int) -> list[Outcome]:
    """`workers` Python clients back to back for `seconds` (a refused one after the server's retry-after); request k
    sends image `first + k` (unique)."""
    out: list[Outcome] = []
    stop = time.perf_counter() + seconds
    counter = iter(range(first, first + 10**9))

    async def worker() -> None:
        while time.perf_counter() < stop:
            k = next(counter)
            outcome = await load.one("client", unique_jpeg(base[k % len(base)], k))
            out.append(outcome)
            # A refused client comes back when the server said (at most 1 s), as a well-behaved one does; sent
            # again at once, refusals would measure how fast the server refuses, not its capacity.
            await asyncio.sleep(min(1.0, outcome.back_off_s))

    await asyncio.gather(*(worker() for _ in range(workers)))
    return out


async def open_loop(
    load: Load, images: list[bytes], rate: float, seconds: float, seed: int, batch_fraction: float = 0.0
) -> list[asyncio.Task]:
    """Poisson arrivals for `seconds`, each sent as batch work with probability `batch_fraction`; returns the tasks
    (still running when the arrivals stop)."""
    rng = np.random.default_rng([seed, 0x0FE])
    marks = np.random.default_rng([seed, 0xBA7])  # its own stream: the arrival times do not depend on the fraction
    tasks: list[asyncio.Task] = []
    start = time.perf_counter()
    at = 0.0
    while at < seconds:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        i = len(tasks)
        batch = bool(batch_fraction) and marks.random() < batch_fraction
        tasks.append(asyncio.create_task(load.one(KINDS[i % len(KINDS)], images[i % len(images)], batch)))
        at += rng.exponential(1.0 / rate)
    return tasks


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
    pattern = re.compile(r'mmproc_requests_total\{code="(\w+)",method="([^"]+)"\}')
    out: Counter = Counter()
    for key, value in after.items():
        m = pattern.fullmatch(key)
        if m and m.group(2) in ("EncodeImages", "EncodeImagesStream", "http:/v1/encode"):
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


def _error_lines(path: Path | None, offset: int) -> int | None:
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
        + (_ms(record["refusal_ms"], "p50", "p99", "max") if refused else "-")
        + f" ms; with Retry-After/RetryInfo: {record['refusals_with_retry_after']}"
        f"/{record['refusals_from_stub_and_http']} (stub+HTTP)",
    ]
    for k in KINDS:
        lines.append(
            f"  {k:6s} codes {dict(by_kind[k])}; OK latency p50/p99/max {_ms(success_ms[k], 'p50', 'p99', 'max')} ms;"
            f" refusal p50/p99 {_ms(record['refusal_ms_by_kind'][k], 'p50', 'p99')} ms"
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


def _ms(stats: dict | None, *keys: str) -> str:
    return "-" if stats is None else "/".join(f"{stats[k]:.0f}" for k in keys)


def base_images(args) -> list[bytes]:
    """The run's 32 source JPEGs (seeded); every request sends one of them made unique (`unique_jpeg`)."""
    spec = ImageSpec(args.resolutions, "cycle", "jpeg", args.quality)
    return [p[0] for p in generate_requests(args.seed, range(32), 1, spec, max_bytes=1 << 30)]


async def run(args, argv: Sequence[str] | None) -> int:
    from mmproc.bench.serve_open_phases import LocalPhases, ProcessPhases  # they build on this module

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
                          server_codes(before, after), _error_lines(args.server_log, log_offset), cache_growth,
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
            f"p50/p99/max {_ms(generator['lag_ms'], 'p50', 'p99', 'max')} ms, loop CPU "
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
