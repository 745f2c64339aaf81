"""`mmproc bench serve --repeat-ratio` and `mmproc bench cache`: seeded workloads, one bounded run each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import cache as cache_bench
from mmproc.bench import serve
from mmproc.bench.serve_repeat import parse_ratios, repeat_workload

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


def test_cache_bench_prints_hashes_and_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cache.json"
    argv = ["--requests", "3000", "--popular", "300", "--reps", "2", "--hash-sizes-kib", "16", "--json", str(out)]
    assert cache_bench.main(argv) == 0
    record = json.loads(out.read_text())
    assert {r["algorithm"] for r in record["hash"]} >= {"xxh3-128", "sha256"}
    assert [row["capacity_share"] for row in record["policy"]] == list(cache_bench.CAPACITY_SHARES)
    assert all(0 <= row[p]["hit_ratio"] <= 1 for row in record["policy"] for p in ("lru", "s3fifo"))
    assert "S3-FIFO / LRU" in capsys.readouterr().out
