"""`mmproc bench serve`: what one request measured (`Sample`), the statistics of a phase, and the report
(markdown table, A/B ratios, the environment block of the JSON record)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import platform
import sys
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import torch

from mmproc.bench import serve_server
from mmproc.bench.provenance import git_commit


@dataclasses.dataclass(frozen=True)
class Sample:
    """One request, perf_counter seconds: start, reply (last reply message; None without the stub hook), views
    (client handed over the embeddings), ready (embeddings usable), end (lease released). Failed: error set."""

    index: int
    images: int
    start: float
    end: float
    reply: float | None = None
    views: float | None = None
    ready: float | None = None
    scheduled: float | None = None
    out_bytes: int = 0
    error: str | None = None
    message: str = ""


def stats_ms(seconds: Sequence[float]) -> dict[str, float] | None:
    """count, mean, p50/p90/p99 (linear interpolation), min, max, in milliseconds; None when empty."""
    if not seconds:
        return None
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"count": len(ms), "mean": float(ms.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99),
            "min": float(ms.min()), "max": float(ms.max())}  # fmt: skip


def _spans(samples: Sequence[Sample], first: str, last: str) -> list[float]:
    """`last - first` seconds for every sample where both times are known."""
    return [b - a for s in samples if (a := getattr(s, first)) is not None and (b := getattr(s, last)) is not None]


STAGES = {"send_to_reply": ("start", "reply"), "reply_to_ready": ("reply", "ready"), "send_to_views": ("start", "views"),
          "views_to_ready": ("views", "ready"), "release": ("ready", "end"), "total": ("start", "end")}  # fmt: skip


def summarize(samples: Sequence[Sample], wall_s: float) -> dict:
    """Throughput, latency and stage statistics, errors by type, of one measured phase."""
    ok = [s for s in samples if s.error is None]
    examples: dict[str, str] = {}
    for s in samples:
        if s.error is not None:
            examples.setdefault(s.error, s.message)
    wall = max(wall_s, 1e-9)
    return {
        "completed": len(ok),
        "failed": len(samples) - len(ok),
        "wall_s": wall_s,
        "throughput_rps": len(ok) / wall,
        "images_per_s": sum(s.images for s in ok) / wall,
        "embedding_mb_per_s": sum(s.out_bytes for s in ok) / wall / 1e6,
        "latency_ms": stats_ms(_spans(ok, "start", "ready")),
        "latency_from_arrival_ms": stats_ms(_spans(ok, "scheduled", "ready")),
        "stages_ms": {name: stats_ms(_spans(ok, *span)) for name, span in STAGES.items()},
        "errors": dict(Counter(s.error for s in samples if s.error is not None)),
        "error_examples": examples,
    }


def sum_ipc(stats: Sequence[dict[str, int] | None]) -> dict[str, int] | None:
    present = [s for s in stats if s is not None]
    return None if not present else {key: sum(s.get(key, 0) for s in present) for key in present[0]}


def raw_rows(samples: Sequence[Sample], t0: float) -> list[dict]:
    def ms(s: Sample, first: str, last: str) -> float | None:
        spans = _spans([s], first, last)
        return spans[0] * 1e3 if spans else None

    return [
        {"index": s.index, "images": s.images, "start_ms": (s.start - t0) * 1e3, "error": s.error,
         "latency_ms": ms(s, "start", "ready"), **{f"{name}_ms": ms(s, *span) for name, span in STAGES.items()}}
        for s in sorted(samples, key=lambda s: s.start)
    ]  # fmt: skip


def environment(argv: Sequence[str] | None, device: str) -> dict:
    cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": ["mmproc", "bench", "serve", *(sys.argv[1:] if argv is None else argv)],
        "commit": git_commit(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(torch.device(device)) if cuda else None,
        "python": platform.python_version(),
        "host": platform.node(),
    }


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _stat(stats: dict | None, *fields: str) -> str:
    return " / ".join(_fmt(None if stats is None else stats[f]) for f in fields)


def _transport_cell(run: dict) -> str:
    client = run["client"]
    transport = client["transport"]
    if transport != "serialized" and run["ipc_stats"] is None:
        transport += " (IPC not active)"
    return f"{transport} / {'on' if client['handle_cache'] else 'off'}"


def _ipc_cell(run: dict) -> str:
    stats = run["ipc_stats"]
    return "-" if stats is None else " / ".join(str(stats.get(k, 0)) for k in ("opens", "closes", "fallbacks"))


TABLE: tuple[tuple[str, Callable[[dict], str]], ...] = (
    ("transport / handle cache", _transport_cell),
    ("completed / failed", lambda r: f"{r['completed']} / {r['failed']}"),
    ("throughput (req/s)", lambda r: _fmt(r["throughput_rps"])),
    ("images/s", lambda r: _fmt(r["images_per_s"])),
    ("embeddings (MB/s)", lambda r: _fmt(r["embedding_mb_per_s"])),
    ("latency mean (ms)", lambda r: _stat(r["latency_ms"], "mean")),
    ("latency p50 / p90 / p99 (ms)", lambda r: _stat(r["latency_ms"], "p50", "p90", "p99")),
    ("send→reply mean / p99 (ms)", lambda r: _stat(r["stages_ms"]["send_to_reply"], "mean", "p99")),
    ("reply→ready mean / p99 (ms)", lambda r: _stat(r["stages_ms"]["reply_to_ready"], "mean", "p99")),
    ("release mean / p99 (ms)", lambda r: _stat(r["stages_ms"]["release"], "mean", "p99")),
    ("from arrival p50 / p99 (ms)", lambda r: _stat(r["latency_from_arrival_ms"], "p50", "p99")),
    ("dropped / late / not sent", lambda r: f"{r['dropped']} / {r['late']} / {r['not_sent']}"),
    ("ipc opens / closes / fallbacks", _ipc_cell),
    ("errors", lambda r: ", ".join(f"{k}={v}" for k, v in r["errors"].items()) or "0"),
)


def _server_line(name: str, target: str, info: dict) -> str:
    return (
        f"- {name} `{target}`; server: {info.get('model_name', '?')} ({info.get('family', '?')}), "
        f"{info.get('device', '?')}, {info.get('dtype', '?')}; transports {info.get('transports', [])}; "
        f"IPC: {info.get('ipc_status', '?')}"
    )


def markdown(record: dict) -> str:
    """The human summary of one invocation."""
    env, info, work, runs = record["environment"], record["server_info"], record["workload"], record["runs"]
    baseline = record.get("baseline_target")
    lines = [
        f"# mmproc bench serve — {env['date']}",
        "",
        _server_line("target", record["target"], info),
        *([_server_line("baseline", baseline, record["baseline_server_info"])] if baseline else []),
        f"- client: torch {env['torch']}, GPU {env['gpu'] or '-'}, commit {(env['commit'] or '-')[:12]}",
        f"- workload: {work['requests']} requests x {work['images_per_request']} images "
        f"({work['format']}, {', '.join(work['resolutions'])}, mean {work['mean_image_kib']:.1f} KiB), "
        f"mode {work['mode']}, {work.get('clients', 1)} client process(es) x concurrency {work['concurrency']} "
        f"({work.get('client', 'sync')} client), "
        f"warmup {work['warmup']}, seed {work['seed']}, "
        f"rounds {work['rounds']}",
        "",
        "| metric | " + " | ".join(r["label"] for r in runs) + " |",
        "| --- | " + " | ".join("---:" for _ in runs) + " |",
    ]
    lines += [f"| {name} | " + " | ".join(cell(r) for r in runs) + " |" for name, cell in TABLE]
    lines += serve_server.table_rows(runs)
    lines += serve_server.lines(runs, str(info.get("device", "")))
    ab = record.get("compare")
    if ab:
        ratios = [("img/s", "images_per_s_ratio"), ("mean latency", "mean_latency_ratio"),
                  ("p50", "p50_latency_ratio"), ("p99", "p99_latency_ratio"),
                  ("server CPU per image", "server_cpu_per_image_ratio")]  # fmt: skip
        text = ", ".join(f"{name} x{_fmt(ab[key], '.3f')}" for name, key in ratios if ab.get(key) is not None)
        lines += ["", f"**{ab['a']} / {ab['b']}**: {text}"]
    return "\n".join(lines) + "\n"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def compare(runs: Sequence[dict]) -> dict:
    """First run over second (cache-on / cache-off, ipc / serialized, target / baseline server): the A/B ratios.
    Server CPU per image only when both sides read their server's metrics."""
    a, b = runs

    def latency(run: dict, key: str) -> float | None:
        return None if run["latency_ms"] is None else run["latency_ms"][key]

    def cpu(run: dict) -> float | None:
        return (run.get("server") or {}).get("cpu_ms_per_image")

    return {"a": a["label"], "b": b["label"], "throughput_ratio": _ratio(a["throughput_rps"], b["throughput_rps"]),
            "images_per_s_ratio": _ratio(a["images_per_s"], b["images_per_s"]),
            "mean_latency_ratio": _ratio(latency(a, "mean"), latency(b, "mean")),
            "p50_latency_ratio": _ratio(latency(a, "p50"), latency(b, "p50")),
            "p99_latency_ratio": _ratio(latency(a, "p99"), latency(b, "p99")),
            "server_cpu_per_image_ratio": _ratio(cpu(a), cpu(b))}  # fmt: skip
