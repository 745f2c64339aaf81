"""The server's /metrics around each measured pass of `bench serve` (`--http-target`): CPU by role per image, the
encoder's own img/s, and where the images were decoded."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence

from mmproc.bench.server_metrics import CPU_ROLES, Samples, grew, grew_by, scrape

FORWARD = 'mmproc_stage_duration_seconds_{}{{stage="forward"}}'


@dataclasses.dataclass(frozen=True)
class Scrape:
    at: float  # perf_counter: one clock for every client process
    samples: Samples


def try_scrape(http_target: str) -> Scrape | None:
    """A scrape, or None (said once on stderr) when the server's /metrics cannot be read: the load still runs."""
    if not http_target:
        return None
    try:
        return Scrape(time.perf_counter(), scrape(http_target))
    except OSError as exc:
        print(f"mmproc bench serve: no server metrics from {http_target}: {exc}", file=sys.stderr)
        return None


def at_start(start: Callable[[], object] | None, http_target: str) -> Scrape | None:
    """Wait for the common start (other client processes), then read the server's metrics: the pass's `before`."""
    if start is not None:
        start()
    return try_scrape(http_target)


def window(before: Scrape, after: Scrape) -> dict:
    """The server's counters over one pass."""
    b, a = before.samples, after.samples
    return {
        "seconds": after.at - before.at,
        "cpu_s": grew_by(b, a, "mmproc_cpu_seconds_total", "role"),  # empty: a server without the family
        "images_encoded": grew(b, a, "mmproc_images_encoded_total"),
        "forward_s": grew(b, a, FORWARD.format("sum")),
        "forwards": grew(b, a, FORWARD.format("count")),
        "decoded": grew_by(b, a, "mmproc_decoded_images_total", "path"),
    }


def summarize_server(windows: Sequence[dict], images_done: int, e2e_images_per_s: float) -> dict:
    """A side's passes pooled: CPU per image delivered, cores by role, the encoder's img/s at these batches."""
    seconds = sum(w["seconds"] for w in windows)
    cpu: Counter[str] = Counter()
    decoded: Counter[str] = Counter()
    for w in windows:
        cpu.update(w["cpu_s"])
        decoded.update(w["decoded"])
    encoded, forward_s, forwards = (sum(w[k] for w in windows) for k in ("images_encoded", "forward_s", "forwards"))
    encoder = encoded / forward_s if forward_s > 0 else None
    total = sum(cpu.values())
    return {
        "windows": list(windows),
        "seconds": seconds,
        "cpu_s": dict(cpu),
        "cpu_ms_per_image": total / images_done * 1e3 if cpu and images_done else None,
        "cores": {role: s / seconds for role, s in cpu.items()} if seconds > 0 else {},
        "cores_total": total / seconds if cpu and seconds > 0 else None,
        "images_encoded": encoded,
        "forward_s": forward_s,
        "forwards": forwards,
        "mean_batch_images": encoded / forwards if forwards else None,
        "encoder_images_per_s": encoder,
        "e2e_vs_encoder": e2e_images_per_s / encoder if encoder else None,
        "decoded": dict(decoded),
        "decode_path": max(decoded, key=decoded.__getitem__) if sum(decoded.values()) > 0 else None,
    }


def side_names(runs: Sequence[dict], fallback: Sequence[str]) -> list[str]:
    """The sides named by where their server decoded the images ("gpu decode", "cpu decode") when that tells them
    apart, else `fallback`."""
    paths = [(r.get("server") or {}).get("decode_path") for r in runs]
    if None in paths or len(set(paths)) < len(paths):
        return list(fallback)
    return [f"{path} decode" for path in paths]


def _num(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _server(run: dict) -> dict:
    return run.get("server") or {}


def _cores(run: dict) -> str:
    cores = _server(run).get("cores") or {}
    return " / ".join(_num(cores.get(role)) for role in CPU_ROLES) if cores else "-"


def _decoded(run: dict) -> str:
    decoded = _server(run).get("decoded") or {}
    return " / ".join(str(round(decoded.get(p, 0))) for p in ("gpu", "fallback", "cpu")) if decoded else "-"


TABLE: tuple[tuple[str, Callable[[dict], str]], ...] = (
    ("server CPU per image (ms)", lambda r: _num(_server(r).get("cpu_ms_per_image"))),
    ("server cores: " + " / ".join(CPU_ROLES), _cores),
    ("encoder img/s at these batches", lambda r: _num(_server(r).get("encoder_images_per_s"), ".1f")),
    ("mean images per forward", lambda r: _num(_server(r).get("mean_batch_images"), ".1f")),
    ("decoded gpu / fallback / cpu", _decoded),
)


def table_rows(runs: Sequence[dict]) -> list[str]:
    """The server's rows of the markdown table (none when no side read the server's metrics)."""
    if not any(r.get("server") for r in runs):
        return []
    return [f"| {name} | " + " | ".join(cell(r) for r in runs) + " |" for name, cell in TABLE]


def lines(runs: Sequence[dict], device: str) -> list[str]:
    """One paragraph per side that read the server's metrics: e2e against the encoder, CPU per image and by role."""
    out = []
    for run in runs:
        s = _server(run)
        if not s:
            continue
        if s["forwards"]:
            share = _num(None if s["e2e_vs_encoder"] is None else 100 * s["e2e_vs_encoder"], ".0f")
            encoder = (
                f"{share}% of the encoder's img/s at these batches ({_num(s['encoder_images_per_s'], '.1f')} img/s: "
                f"{s['images_encoded']:.0f} images in {s['forwards']:.0f} forwards of "
                f"{_num(s['mean_batch_images'], '.1f')} on average, {s['forward_s']:.2f} s of forward stage)"
            )
        else:
            encoder = "no forward ran on the server (every image answered from its embedding cache?)"
        out += ["", f"**{run['label']}**: e2e {run['images_per_s']:.1f} img/s = {encoder}."]
        if s["cpu_s"]:
            by_role = ", ".join(f"{role} {s['cores'].get(role, 0.0):.2f}" for role in CPU_ROLES)
            out.append(
                f"Server CPU {_num(s['cpu_ms_per_image'])} ms per image, {s['cores_total']:.2f} cores over "
                f"{s['seconds']:.1f} s: {by_role}."
            )
        else:
            out.append("Server CPU: the server exports no mmproc_cpu_seconds_total (an older server, or not Linux).")
    if out and device.startswith("cuda"):
        out += ["", "On CUDA the forward stage is the runner's host time up to the forward's launch (nothing is read "
                "back), not the device's: `mmproc bench encoder` times the device."]  # fmt: skip
    return out
