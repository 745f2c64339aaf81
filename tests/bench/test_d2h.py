"""The serialized path's stage bench runs on the CPU, through the production code, and reports every stage."""

from __future__ import annotations

import json

from benchmarks import d2h


def test_stages_run_on_cpu_and_report_every_stage(tmp_path, capsys) -> None:
    out = tmp_path / "stages.json"
    argv = ["--device", "cpu", "--mb", "1", "--reps", "2", "--rounds", "2", "--chunk-mb", "1", "--json", str(out)]
    assert d2h.main(argv) == 0
    record = json.loads(out.read_text())
    assert [row["stage"] for row in record["rows"]] == list(d2h.STAGES)
    assert all(row["ms"] > 0 and row["gb_per_s"] > 0 for row in record["rows"])
    # each round's stages are read against the reference measured in that round; the spread comes with the median
    assert len(record["reference"]["per_round"]) == 2
    assert all(r["fraction_min"] <= r["fraction_of_reference"] <= r["fraction_max"] for r in record["rows"])
    assert record["messages"] == 4  # 4 images of 0.25 MB, one message each
    assert record["reference"]["name"] == "host memcpy" and record["environment"]["command"][2] == "benchmarks.d2h"
    assert "server staging (GPU -> wire-ready bytes)" in capsys.readouterr().out


def test_benchmark_records_name_the_commit_the_gpu_script_was_given(monkeypatch) -> None:
    from mmproc.bench.provenance import git_commit

    monkeypatch.setenv("MMPROC_COMMIT", "7f59e4a")  # the device's tree copy has a stale HEAD: the script's word wins
    assert git_commit() == "7f59e4a"
    monkeypatch.delenv("MMPROC_COMMIT")
    assert git_commit() is None or len(git_commit()) == 40
