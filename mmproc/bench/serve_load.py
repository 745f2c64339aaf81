"""`mmproc bench serve`'s load: worker threads that each own one client, the burst and rate loops, one measured pass
(`Phase`) here or in --clients processes, and the pooled result of a side's passes."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from mmproc.bench.client_processes import ClientProcesses, deal
from mmproc.bench.serve_async import measure_async
from mmproc.bench.serve_pass import ClientConfig, Payload, Phase, Progress
from mmproc.bench.serve_server import at_start, summarize_server, try_scrape, window
from mmproc.bench.serve_stats import (
    Sample,
    raw_rows,
    sum_ipc,
    summarize,
)


class _ReplyClock:
    """Notes when a reply's last message arrived, by wrapping the two encode calls of a client's gRPC stubs.

    EncoderClient has no timing hook, so this reaches for its stubs (`_targets.stubs`, or `_stub`): when neither
    exists the send->reply / reply->ready split is simply not reported. The stubs are the client's own (one
    client per worker thread), so one clock per client is unambiguous."""

    def __init__(self) -> None:
        self.at: float | None = None

    @classmethod
    def install(cls, client: object) -> _ReplyClock | None:
        stubs = getattr(getattr(client, "_targets", None), "stubs", None) or [getattr(client, "_stub", None)]
        stubs = [s for s in stubs if s is not None and hasattr(s, "EncodeImages") and hasattr(s, "EncodeImagesStream")]
        if not stubs:
            return None
        clock = cls()
        for stub in stubs:
            stub.EncodeImages = clock._unary(stub.EncodeImages)  # IPC path: one reply message
            stub.EncodeImagesStream = clock._stream(stub.EncodeImagesStream)  # serialized: a stream of chunks
        return clock

    def _unary(self, call: Callable[..., object]) -> Callable[..., object]:
        def timed(*args: object, **kwargs: object) -> object:
            reply = call(*args, **kwargs)
            self.at = time.perf_counter()
            return reply

        return timed

    def _stream(self, call: Callable[..., Iterator[object]]) -> Callable[..., Iterator[object]]:
        def timed(*args: object, **kwargs: object) -> Iterator[object]:
            yield from call(*args, **kwargs)
            self.at = time.perf_counter()

        return timed


@dataclasses.dataclass
class _Worker:
    """One worker thread's client (never shared between threads)."""

    cfg: ClientConfig
    client: object
    clock: _ReplyClock | None

    @classmethod
    def open(cls, cfg: ClientConfig) -> _Worker:
        from mmproc.client import EncoderClient

        client = EncoderClient(
            cfg.target, device=cfg.device, transport=cfg.transport, timeout=cfg.timeout, handle_cache=cfg.handle_cache,
            cache=cfg.cache,
        )  # fmt: skip
        return cls(cfg, client, _ReplyClock.install(client))

    def request(self, payload: Payload, scheduled: float | None = None) -> Sample:
        """One timed request. `views`: the client handed over the embeddings (host side); `ready`: they are
        usable (copied when --consume copy; consumer stream synchronized on CUDA)."""
        index, images = payload
        if self.clock is not None:
            self.clock.at = None
        device = torch.device(self.cfg.device)
        start = time.perf_counter()
        try:
            with self.client.encode_images_view(images, timeout=self.cfg.timeout) as views:
                got = time.perf_counter()
                outs = [v.clone() for v in views] if self.cfg.consume == "copy" else views
                if device.type == "cuda":
                    torch.cuda.current_stream(device).synchronize()
                ready = time.perf_counter()
                out_bytes = sum(t.numel() * t.element_size() for t in outs)
        except Exception as exc:  # counted by type; one failed request never stops the run
            return Sample(index, len(images), start, time.perf_counter(), scheduled=scheduled,
                          error=type(exc).__name__, message=str(exc)[:300])  # fmt: skip
        reply = self.clock.at if self.clock is not None else None
        return Sample(index, len(images), start, time.perf_counter(), reply, got, ready, scheduled, out_bytes)


def _join_all(threads: Sequence[threading.Thread], by: float) -> None:
    """Start and join threads, waiting until perf_counter time `by` at the latest (they are daemons)."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, by - time.perf_counter()))


def run_burst(workers: Sequence[_Worker], payloads: Sequence[Payload], deadline: float, progress: Progress) -> dict:
    """Every payload, as fast as the workers go, until done or `deadline` (perf_counter)."""
    todo: queue.SimpleQueue[Payload] = queue.SimpleQueue()
    for payload in payloads:
        todo.put(payload)
    samples: list[Sample] = []

    def loop(worker: _Worker) -> None:
        while time.perf_counter() < deadline:
            try:
                payload = todo.get_nowait()
            except queue.Empty:
                return
            samples.append(worker.request(payload))
            progress.tick()

    threads = [threading.Thread(target=loop, args=(w,), daemon=True, name=f"bench-{i}") for i, w in enumerate(workers)]
    _join_all(threads, deadline + workers[0].cfg.timeout + 5)
    done = list(samples)
    return {"samples": done, "dropped": 0, "late": 0, "not_sent": len(payloads) - len(done)}


def arrival_offsets(count: int, rate: float, kind: str, seed: int) -> np.ndarray:
    """(count,) seconds from the start: uniform k/rate, or Poisson (exponential gaps, seeded), first at 0."""
    if kind == "uniform":
        return np.arange(count, dtype=np.float64) / rate
    gaps = np.random.default_rng([seed, 0xA22]).exponential(1.0 / rate, size=count)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def run_rate(
    workers: Sequence[_Worker],
    payloads: Sequence[Payload],
    args: argparse.Namespace,
    deadline: float,
    progress: Progress,
) -> dict:
    """Open-loop arrivals; the workers are the in-flight cap (an arrival with none idle is dropped)."""
    idle: queue.SimpleQueue[int] = queue.SimpleQueue()
    inboxes: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in workers]
    samples: list[Sample] = []

    def loop(i: int) -> None:
        while (job := inboxes[i].get()) is not None:
            samples.append(workers[i].request(*job))
            progress.tick()
            idle.put(i)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True, name=f"bench-{i}") for i in range(len(workers))]
    for i, t in enumerate(threads):
        idle.put(i)
        t.start()
    start = time.perf_counter()
    dropped = late = sent = 0
    for payload, offset in zip(payloads, arrival_offsets(len(payloads), args.rate, args.arrivals, args.seed)):
        scheduled = start + float(offset)
        if scheduled >= deadline:
            break
        time.sleep(max(0.0, scheduled - time.perf_counter()))
        try:
            i = idle.get_nowait()
        except queue.Empty:
            dropped += 1
            progress.tick()
            continue
        late += time.perf_counter() - scheduled > args.late_ms / 1e3
        inboxes[i].put((payload, scheduled))
        sent += 1
    for box in inboxes:
        box.put(None)
    for t in threads:
        t.join(max(0.0, max(deadline, time.perf_counter()) + args.timeout + 5 - time.perf_counter()))
    return {"samples": list(samples), "dropped": dropped, "late": late, "not_sent": len(payloads) - sent - dropped}


def measure(
    label: str,
    cfg: ClientConfig,
    args: argparse.Namespace,
    measured: list[Payload],
    warmup: list[Payload],
    start: Callable[[], object] | None = None,
    metrics: str = "",
) -> Phase:
    """Open the clients, warm up, run the measured phase, close the clients. `start` returns when the phase may
    begin; `metrics`: the server's HTTP address, scraped then."""
    if args.client == "async":
        return measure_async(label, cfg, args, measured, warmup, start, metrics)
    workers = [_Worker.open(cfg) for _ in range(args.concurrency)]
    try:
        if warmup:
            run_burst(workers, warmup, time.perf_counter() + args.max_seconds, Progress(0, "", False))
        before = at_start(start, metrics)
        progress = Progress(len(measured), label, sys.stderr.isatty() and not args.quiet)
        t0 = time.perf_counter()
        deadline = t0 + args.max_seconds
        if args.mode == "burst":
            counts = run_burst(workers, measured, deadline, progress)
        else:
            counts = run_rate(workers, measured, args, deadline, progress)
        wall = time.perf_counter() - t0
        progress.close()
        ipc = sum_ipc([getattr(w.client, "ipc_stats", None) for w in workers])
    finally:
        for w in workers:
            w.client.close()
    samples = counts.pop("samples")
    return Phase(samples, wall, t0, counts, ipc, any(w.clock is not None for w in workers), [before] if before else [])


Measure = Callable[..., Phase]  # (label, cfg, measured, warmups[, metrics]) -> Phase


def _read_after(phase: Phase, metrics: str) -> Phase:
    """The server's metrics once every process is done: the pass's second scrape (when the first was read)."""
    after = try_scrape(metrics) if phase.scrapes else None
    if after is not None:
        phase.scrapes.append(after)
    return phase


@contextlib.contextmanager
def measurer(args: argparse.Namespace) -> Iterator[Measure]:
    """`measure` for every pass of a run, here or in --clients processes spawned once (request k to process
    k mod N), pooled into one Phase."""
    if args.clients == 1:
        yield lambda label, cfg, measured, warmups, metrics="": _read_after(
            measure(label, cfg, args, measured, warmups[0], None, metrics), metrics
        )
        return
    n = args.clients
    quiet = argparse.Namespace(**{**vars(args), "quiet": True, "clients": 1})
    timeout_s = 2 * args.max_seconds + args.timeout + 120  # warm-up and measured phase, each bounded by max_seconds
    with ClientProcesses(n, functools.partial(_PassRunner, quiet)) as processes:

        def in_processes(label: str, cfg: ClientConfig, measured: list[Payload], warmups: Sequence[list[Payload]],
                         metrics: str = "") -> Phase:  # fmt: skip
            commands = [
                (label, cfg, mine, warmups[i], "" if i else metrics) for i, mine in enumerate(deal(measured, n))
            ]
            return _read_after(pooled(processes.run(commands, timeout_s)), metrics)

        yield in_processes


class _PassRunner:
    """A client process's side of `measurer`: one measured pass per command, with fresh clients."""

    def __init__(self, args: argparse.Namespace, index: int) -> None:
        self._args = args

    def __call__(self, label: str, cfg: ClientConfig, measured: list[Payload], warmup: list[Payload], metrics: str,
                 *, start: Callable[[], None]) -> Phase:  # fmt: skip
        return measure(label, cfg, self._args, measured, warmup, start, metrics)

    def close(self) -> None:
        pass


def pooled(phases: Sequence[Phase]) -> Phase:
    """The passes of processes that started at one instant, as one: the wall runs from the common start to the end
    of the last, so img/s is every process's images over that one window; samples and counters are summed."""
    t0 = min(p.t0 for p in phases)
    end = max(p.t0 + p.wall_s for p in phases)
    counts = sum((Counter(p.counts) for p in phases), Counter())
    samples = [sample for p in phases for sample in p.samples]
    return Phase(samples, end - t0, t0, dict(counts), sum_ipc([p.ipc_stats for p in phases]),
                 all(p.stage_split for p in phases), [s for p in phases for s in p.scrapes])  # fmt: skip


def result(label: str, cfg: ClientConfig, phases: Sequence[Phase], json_raw: bool) -> dict:
    """One side's numbers, pooled over its rounds (samples concatenated, walls and counters summed)."""
    samples = [s for p in phases for s in p.samples]
    counts = sum((Counter(p.counts) for p in phases), Counter())
    out = {"label": label, "client": dataclasses.asdict(cfg), **summarize(samples, sum(p.wall_s for p in phases))}
    out |= {key: counts[key] for key in ("dropped", "late", "not_sent")}
    out |= {"ipc_stats": sum_ipc([p.ipc_stats for p in phases]), "stage_split": all(p.stage_split for p in phases)}
    out["rounds"] = [{"throughput_rps": r["throughput_rps"], "latency_mean_ms": (r["latency_ms"] or {}).get("mean")}
                     for r in (summarize(p.samples, p.wall_s) for p in phases)]  # fmt: skip
    if json_raw:
        out["requests"] = [{"round": i, **row} for i, p in enumerate(phases) for row in raw_rows(p.samples, p.t0)]
    if phases and all(len(p.scrapes) == 2 for p in phases):  # the server's metrics around every pass
        done = sum(s.images for s in samples if s.error is None)
        out["server"] = summarize_server([window(*p.scrapes) for p in phases], done, out["images_per_s"])
    return out


def run_plan(
    plan: Sequence[tuple[str, ClientConfig]],
    args: argparse.Namespace,
    measured: list[Payload],
    warmup: list[Payload],
    metrics: Sequence[str] = (),
) -> list[dict]:
    """Every side `--rounds` times; with two sides the order is A B, B A, A B, ... so drift cancels (ABBA).
    `metrics[i]`: side i's server HTTP address, whose metrics are read around each of its passes ("": none)."""
    phases: list[list[Phase]] = [[] for _ in plan]
    with measurer(args) as run:
        for r in range(args.rounds):
            for i in range(len(plan)) if r % 2 == 0 else reversed(range(len(plan))):
                label, cfg = plan[i]
                http = metrics[i] if i < len(metrics) else ""
                phases[i].append(run(label, cfg, measured, [warmup] * args.clients, http))  # the same warm-up in each
    return [result(label, cfg, side, args.json_raw) for (label, cfg), side in zip(plan, phases)]
