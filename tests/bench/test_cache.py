"""`mmproc bench serve --repeat-ratio` and `mmproc bench cache`: seeded workloads, one bounded run each."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx
import pytest

from benchmarks import cache as cache_bench
from mmproc.bench import serve
from mmproc.bench.serve_repeat import parse_ratios, pass_payloads, repeat_workload

SMALL = ["--resolutions", "48x40,40x48", "--format", "png", "--warmup", "1", "--quiet"]


def test_the_repeat_workload_is_seeded_and_repeats_about_r() -> None:
    plan = repeat_workload(seed=3, requests=2000, per_request=1, ratio=0.9)
    assert plan == repeat_workload(seed=3, requests=2000, per_request=1, ratio=0.9)
    assert plan != repeat_workload(seed=4, requests=2000, per_request=1, ratio=0.9)
    ids = [i for ids in plan for i in ids]
    fresh = len(set(ids))
    assert ids[0] == 0 and 0.85 < 1 - fresh / len(ids) < 0.95
    assert all(i <= max(ids[:n], default=-1) + 1 for n, i in enumerate(ids))  # a repeat is of an image already sent
    assert len({i for ids in repeat_workload(1, 50, 2, 0.0) for i in ids}) == 100  # R = 0: all fresh
    with pytest.raises(ValueError):
        parse_ratios("0,1.0")


def test_repeat_ratio_runs_cache_on_and_off_against_the_tiny_server(tiny_server, tmp_path: Path) -> None:
    out = tmp_path / "repeat.json"
    argv = ["--target", tiny_server.grpc_target, "--repeat-ratio", "0,0.9", "--requests", "6", "--concurrency", "1",
            "--rounds", "1", "--transport", "serialized", "--json", str(out), *SMALL]  # fmt: skip
    assert serve.main(argv) == 0
    record = json.loads(out.read_text())
    rows = [(r["repeat_ratio"], r["cache"], r["completed"], r["failed"]) for r in record["rows"]]
    assert rows == [(0.0, "on", 6, 0), (0.0, "off", 6, 0), (0.9, "on", 6, 0), (0.9, "off", 6, 0)]
    assert record["hit_only"]["completed"] == 6 and record["environment"]["commit"] is not None


def _cache_counters(server) -> dict[str, float]:
    text = httpx.get(f"{server.http_url}/metrics", timeout=10).text
    names = {f'mmproc_cache_{c}_total{{tier="host"}}': c for c in ("hits", "misses", "coalesced")}
    names["mmproc_cache_bypassed_total"] = "bypassed"
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {short: float(values.get(name, 0)) for name, short in names.items()}


def test_repeat_ratio_in_two_client_processes_repeats_across_them(tiny_server, tmp_path: Path) -> None:
    out, n = tmp_path / "repeat.json", 40
    argv = ["--target", tiny_server.grpc_target, "--repeat-ratio", "0.9", "--requests", str(n), "--clients", "2",
            "--concurrency", "2", "--rounds", "1", "--transport", "serialized", "--seed", "7", "--json", str(out),
            *SMALL]  # fmt: skip
    before = _cache_counters(tiny_server)
    assert serve.main(argv) == 0
    after = _cache_counters(tiny_server)
    on, off = json.loads(out.read_text())["rows"]
    assert (on["cache"], on["completed"], off["completed"], on["images_planned"]) == ("on", n, n, n)
    distinct, warmups = on["images_distinct"], 2  # --warmup 1 in each process, an image of its own
    assert 0.8 <= 1 - distinct / n <= 0.97
    delta = {k: after[k] - before[k] for k in after}
    # The server saw the pass's one plan, not one per process: each distinct image encoded once, every repeat
    # answered from the cache (or by joining the encode of its first send still in flight in the other process).
    # The hit-only pass adds n misses (its warm-up) and n hits.
    assert delta["misses"] == distinct + warmups + n
    assert delta["hits"] + delta["coalesced"] == (n - distinct) + n
    assert delta["bypassed"] == n + warmups  # the cache-off pass


def test_repeats_are_dealt_across_client_processes() -> None:
    args = argparse.Namespace(seed=7, requests=40, images_per_request=1, warmup=2, clients=2, resolutions=((16, 16),),
                              resolution_order="cycle", format="png", quality=90, max_payload_mb=64)  # fmt: skip
    payloads = pass_payloads(args, 0.9, salt=1)
    first: dict[bytes, int] = {}  # image -> the process that sends it first (request k goes to process k mod 2)
    for k, (_, images) in enumerate(payloads.measured):
        first.setdefault(images[0], k % 2)
    across = sum(first[images[0]] != k % 2 for k, (_, images) in enumerate(payloads.measured))
    assert len(first) == payloads.distinct and across > 5  # repeats of the other process's images
    warm = [{images[0] for _, images in w} for w in payloads.warmups]
    assert [len(w) for w in warm] == [2, 2] and not warm[0] & warm[1] and not (warm[0] | warm[1]) & first.keys()


def test_cache_bench_prints_hashes_and_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cache.json"
    argv = ["--requests", "3000", "--popular", "300", "--reps", "2", "--hash-sizes-kib", "16", "--json", str(out)]
    assert cache_bench.main(argv) == 0
    record = json.loads(out.read_text())
    assert {r["algorithm"] for r in record["hash"]} >= {"xxh3-128", "sha256"}
    assert [row["capacity_share"] for row in record["policy"]] == list(cache_bench.CAPACITY_SHARES)
    assert all(0 <= row[p]["hit_ratio"] <= 1 for row in record["policy"] for p in ("lru", "s3fifo"))
    assert "S3-FIFO / LRU" in capsys.readouterr().out
