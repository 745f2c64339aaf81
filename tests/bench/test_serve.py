"""`mmproc bench serve` and its seeded images: reproducible workloads, a bounded run, a readable record.

Runs against the in-process tiny server (CPU, serialized transport) with tiny images, so it stays fast."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmproc.bench import serve, serve_load, serve_stats
from mmproc.bench.images import ImageSpec, parse_resolutions, request_images

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--resolutions", "48x40,40x48", "--format", "png", "--warmup", "1", "--quiet"]

_HASH_SCRIPT = """
import hashlib
from mmproc.bench.images import ImageSpec, request_images
for fmt in ("png", "jpeg", "webp"):
    spec = ImageSpec(resolutions=((64, 48), (40, 56)), order="random", fmt=fmt)
    for i in range(3):
        print(fmt, i, hashlib.sha256(b"".join(request_images(11, i, 2, spec))).hexdigest())
"""


def _hashes() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _HASH_SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.split("\n")


def test_images_are_the_same_bytes_in_every_process() -> None:
    first, second = _hashes(), _hashes()
    assert first == second
    digests = [line.split()[-1] for line in first if line]
    assert len(digests) == 9 and len(set(digests)) == 9  # every request index (and format) differs


def test_images_depend_on_seed_and_index_only() -> None:
    spec = ImageSpec(resolutions=parse_resolutions("32x24,24x32"), fmt="jpeg")
    assert request_images(3, 5, 2, spec) == request_images(3, 5, 2, spec)
    assert request_images(3, 5, 2, spec) != request_images(4, 5, 2, spec)
    assert request_images(3, 5, 2, spec) != request_images(3, 6, 2, spec)
    images = request_images(3, 0, 2, spec)
    assert images[0][:2] == b"\xff\xd8" and images[0] != images[1]


def test_burst_against_the_tiny_server_writes_a_full_record(tiny_server, tmp_path: Path) -> None:
    out, md = tmp_path / "serve.json", tmp_path / "serve.md"
    argv = ["--target", tiny_server.grpc_target, "--mode", "burst", "--transport", "serialized", "--requests", "8",
            "--images-per-request", "2", "--concurrency", "2", "--json", str(out), "--json-raw",
            "--markdown", str(md), *SMALL]  # fmt: skip
    assert serve.main(argv) == 0
    record = json.loads(out.read_text())
    assert {"bench", "target", "environment", "server_info", "workload", "runs", "compare"} <= record.keys()
    assert {"date", "command", "commit", "torch", "gpu"} <= record["environment"].keys()
    assert record["server_info"]["model_name"]
    (run,) = record["runs"]
    assert run["completed"] == 8 and run["failed"] == 0 and run["errors"] == {} and run["not_sent"] == 0
    assert run["throughput_rps"] > 0 and run["images_per_s"] == pytest.approx(2 * run["throughput_rps"])
    lat = run["latency_ms"]
    assert lat["count"] == 8 and 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert run["stages_ms"]["total"]["count"] == 8 and run["ipc_stats"] is None  # serialized: no IPC session
    assert len(run["requests"]) == 8 and {r["index"] for r in run["requests"]} == set(range(8))
    assert "throughput (req/s)" in md.read_text()


def test_client_processes_share_the_requests_on_one_time_axis(tiny_server, tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    argv = ["--target", tiny_server.grpc_target, "--transport", "serialized", "--requests", "7", "--clients", "2",
            "--concurrency", "1", "--rounds", "2", "--warmup", "1", "--json", str(out), "--json-raw",
            *SMALL]  # fmt: skip
    assert serve.main(argv) == 0
    record = json.loads(out.read_text())
    (run,) = record["runs"]
    assert record["workload"]["clients"] == 2
    assert run["completed"] == 14 and run["failed"] == 0 and len(run["rounds"]) == 2  # the same processes, twice
    for r, pooled in enumerate(run["rounds"]):
        mine = [q for q in run["requests"] if q["round"] == r]
        assert sorted(q["index"] for q in mine) == list(range(7))  # every request once, from either process
        wall_ms = 7 / pooled["throughput_rps"] * 1000
        assert min(q["start_ms"] for q in mine) >= 0 and max(q["start_ms"] for q in mine) < wall_ms  # one clock


def test_rate_mode_stops_by_its_deadline(tiny_server, tmp_path: Path) -> None:
    out = tmp_path / "rate.json"
    argv = ["--target", tiny_server.grpc_target, "--mode", "rate", "--rate", "4", "--arrivals", "uniform",
            "--requests", "40", "--max-seconds", "1.5", "--concurrency", "2", "--transport", "serialized",
            "--json", str(out), *SMALL]  # fmt: skip
    start = time.perf_counter()
    assert serve.main(argv) == 0
    assert time.perf_counter() - start < 10
    (run,) = json.loads(out.read_text())["runs"]
    assert run["completed"] + run["failed"] + run["dropped"] + run["not_sent"] == 40
    assert run["not_sent"] >= 30  # 4/s for 1.5 s: about 6 arrivals, the rest never sent
    assert run["latency_from_arrival_ms"]["p50"] >= run["latency_ms"]["p50"]


def test_compare_runs_both_sides_and_reports_ratios(tiny_server, tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    argv = ["--target", tiny_server.grpc_target, "--compare", "transport", "--requests", "3", "--concurrency", "1",
            "--json", str(out), *SMALL]  # fmt: skip
    assert serve.main(argv) == 0
    record = json.loads(out.read_text())
    assert [r["label"] for r in record["runs"]] == ["ipc", "serialized"]
    assert record["workload"]["rounds"] == 2 and all(len(r["rounds"]) == 2 for r in record["runs"])  # A B B A
    assert all(r["completed"] == 6 for r in record["runs"])
    assert record["compare"]["throughput_ratio"] > 0 and record["compare"]["mean_latency_ratio"] > 0


@pytest.mark.parametrize("target", ["10.1.2.3:50051", "dns:///192.0.2.7:443", "[2001:db8::1]:50051"])
def test_non_loopback_target_is_refused(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert serve.main(["--target", target, "--requests", "1"]) == 2
    assert "--allow-remote" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["127.0.0.1:1", "localhost:50051", "[::1]:50051", "unix:/tmp/mmproc.sock"])
def test_loopback_targets_are_accepted(target: str) -> None:
    assert serve.remote_host(target) is None


def test_percentiles_and_arrivals() -> None:
    stats = serve_stats.stats_ms([0.001 * i for i in range(1, 101)])
    assert stats is not None and stats["p50"] == pytest.approx(50.5) and stats["p99"] <= stats["max"] == 100
    assert serve_stats.stats_ms([]) is None
    uniform = serve_load.arrival_offsets(5, 10.0, "uniform", 0)
    assert list(uniform) == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    poisson = serve_load.arrival_offsets(1000, 100.0, "poisson", 0)
    assert poisson[0] == 0 and (poisson[1:] >= poisson[:-1]).all() and 8 < poisson[-1] < 12
    assert (poisson == serve_load.arrival_offsets(1000, 100.0, "poisson", 0)).all()


def test_transport_microbench_skips_cleanly_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("has CUDA: the microbench really runs")
    assert serve.main(["--transport-microbench"]) == 0
    assert "skipped" in capsys.readouterr().err


def test_open_loop_report_reads_the_servers_loop_lag_between_two_scrapes() -> None:
    from mmproc.bench.open_report import loop_lag_ms

    def scrape(cumulative: dict[str, float]) -> dict[str, float]:
        return {f'mmproc_event_loop_lag_seconds_bucket{{le="{le}"}}': n for le, n in cumulative.items()}

    before = scrape({"0.001": 10, "0.01": 10, "0.5": 10, "+Inf": 10})
    after = scrape({"0.001": 100, "0.01": 108, "0.5": 110, "+Inf": 110})  # 100 new samples: 90 <= 1 ms, 2 slow
    assert loop_lag_ms(before, after) == {"p50": 1.0, "p99": 500.0}
    assert loop_lag_ms({}, {"process_resident_memory_bytes": 1.0}) == {"p50": None, "p99": None}


def test_open_loop_report_reads_the_servers_gc_pauses_between_two_scrapes() -> None:
    import gc

    from mmproc.bench.open_report import gc_pauses, parse
    from service.observe.metrics import Metrics

    metrics = Metrics()
    before = parse(metrics.render()[0].decode())
    with metrics.gc_pause:
        gc.collect()
        gc.collect()
    full = gc_pauses(before, parse(metrics.render()[0].decode()))["2"]
    assert full["count"] == 2 and 0 < full["total_ms"] <= 2 * full["longest_ms_at_most"], full
    assert gc_pauses({}, {"process_resident_memory_bytes": 1.0}) == {}


def test_open_loop_report_reads_the_servers_cores_by_role_inside_the_load() -> None:
    from mmproc.bench.open_report import server_cores

    cpu = [(0.5, {"runner": 1.0}), (1.0, {"runner": 2.0, "grpc_loop": 0.5}), (3.0, {"runner": 5.0, "grpc_loop": 1.5}),
           (9.0, {"runner": 90.0, "grpc_loop": 9.0})]  # fmt: skip
    assert server_cores(cpu, t0=1.0, t_stop=5.0) == {"grpc_loop": 0.5, "runner": 1.5}  # the scrapes at 1 s and 3 s
    assert server_cores(cpu, t0=2.0, t_stop=5.0) == {}  # one scrape inside
    assert server_cores([(1.0, {}), (2.0, {})], t0=0.0, t_stop=5.0) == {}  # an older server


def test_open_mode_phases_run_in_client_processes_on_one_clock(tiny_server) -> None:
    import argparse
    import asyncio

    from mmproc.bench.serve_open_phases import ProcessPhases

    args = argparse.Namespace(target=tiny_server.grpc_target, http_target=tiny_server.http_url, deadline_s=10.0,
                              http_timeout_ms=0, http_wait_s=30.0, concurrency=1, recovery_seconds=0.5, seed=3,
                              resolutions=((64, 48),), quality=90, batch_fraction=0.5)  # fmt: skip

    async def drive() -> tuple[float, list, list, list, float]:
        phases = ProcessPhases(args, 2)
        await phases.start()
        try:
            asked = time.perf_counter()
            closed = await phases.closed(0, 1.0)
            phase = await phases.open_then_recover(10**8, 6.0, 1.0, 2 * 10**8)
        finally:
            await phases.close()
        return asked, closed, phase

    asked, closed, phase = asyncio.run(drive())
    load, recovery, t_stop = phase.load, phase.recovery, phase.t_stop
    assert closed and all(o.code == "OK" and o.kind == "client" for o in closed)
    assert min(o.start for o in closed) >= asked  # this process's clock: every start after the command was sent
    assert {o.kind for o in load} <= {"client", "stub", "http"} and all(o.code == "OK" for o in load + recovery)
    assert 0 < sum(o.batch for o in load) < len(load)  # half sent as batch work, taken by an idle server
    # One clock across the processes (started together within START_MARGIN_S): arrivals stop at t_stop, then the
    # recovery probe begins, in every process.
    assert load and max(o.start for o in load) < t_stop + 0.25 and min(o.start for o in recovery) > t_stop - 0.25
    # Each process watched its own loop over its 1 s of arrivals (a wake-up every 5 ms).
    assert len(phase.generator) == 2
    assert all(w["lag_ms"]["count"] >= 50 and 0 < w["loop_cpu_share"] <= 1.05 for w in phase.generator)


def test_loop_watch_sees_a_loop_kept_busy() -> None:
    import asyncio

    from mmproc.bench.loop_watch import LoopWatch, worst

    async def busy_for(seconds: float) -> dict:
        watch = LoopWatch(0.005)
        watch.start()
        await asyncio.sleep(0.05)
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:  # the loop's thread computes: nothing else on it runs
            pass
        await asyncio.sleep(0.05)
        return watch.stop()

    calm, busy = asyncio.run(busy_for(0.0)), asyncio.run(busy_for(0.15))
    assert busy["lag_ms"]["max"] >= 140 and busy["loop_cpu_share"] >= 0.4
    assert calm["lag_ms"]["max"] < busy["lag_ms"]["max"]
    both = worst([calm, busy])
    assert both["processes"] == 2 and both["lag_ms"]["max"] == busy["lag_ms"]["max"]
    assert both["loop_cpu_share"] == max(calm["loop_cpu_share"], busy["loop_cpu_share"])
