"""`mmproc bench encoder` with a Qwen3-VL preset on the CPU: the family's own grids (patch 16, smart_resize),
no MoonViT baseline, and FLOPs counted for every merger (DeepStack levels included)."""

from __future__ import annotations

import json

from mmproc.bench import forward as bench
from mmproc.models import PRESETS
from mmproc.preprocess import PreprocessConfig


def test_qwen_workloads_use_the_qwen_rules() -> None:
    rules = PreprocessConfig.default_for("qwen3_vl")
    assert bench.workload_grids("448x2", 0, rules) == [(28, 28)] * 2
    assert bench.workload_grids("1024x1", 0, rules) == [(64, 64)]


def test_flops_count_every_merger() -> None:
    config = PRESETS["qwen3-vl-8b"]  # 27 x 1152, MLP 4304, three DeepStack levels of 4096
    seq, tokens, d, m, kk = 28 * 28, 14 * 14, 1152, 4304, 4
    blocks = 27 * (2 * seq * d * (4 * d + 2 * m) + 4 * seq * seq * d)
    mergers = 4 * 2 * tokens * (kk * d) * (kk * d + 4096)
    patch_embed = 2 * seq * (3 * 16 * 16) * d
    assert bench.encoder_flops(config, [(28, 28)])["total"] == blocks + mergers + patch_embed
    no_deepstack = bench.encoder_flops(PRESETS["qwen3.6-35b-a3b"], [(28, 28)])["total"]
    assert no_deepstack == blocks + 2 * tokens * (kk * d) * (kk * d + 2048) + patch_embed


def test_bench_runs_on_cpu_with_a_qwen_preset(tmp_path, capsys) -> None:
    out = tmp_path / "encoder.json"
    argv = ["--device", "cpu", "--preset", "tiny-qwen3-vl", "--workloads", "64x2", "mixed2", "--reps", "1"]
    assert bench.main([*argv, "--warmup", "0", "--peak", "1", "--json", str(out)]) == 0
    assert "FAILED" not in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert [r["impl"] for r in record["results"]][:2] == ["mmproc", "mmproc-b2b"]
    assert "eager-baseline" not in {r["impl"] for r in record["results"]}  # a MoonViT port: not for this tower
    first = record["results"][0]
    assert first["patches"] == 2 * 16 * 16 and first["mfu"] > 0  # 64 px -> smart_resize -> 256 px: 16 x 16 patches
