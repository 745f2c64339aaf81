"""`mmproc bench accuracy` and `bench encoder --fp8` on the CPU: tiny presets, the fp8 math emulated."""

from __future__ import annotations

import json

import numpy as np

from mmproc.bench import accuracy, forward
from mmproc.bench.accuracy_images import KINDS, accuracy_images


def test_generated_images_are_seeded_and_of_every_kind() -> None:
    first, again = accuracy_images(3, 1, max_side=224), accuracy_images(3, 1, max_side=224)
    assert [k for k, _ in first] == list(KINDS)
    for (_, a), (_, b) in zip(first, again, strict=True):
        assert max(a.size) <= 224 and np.array_equal(np.asarray(a), np.asarray(b))
    flat = np.asarray(first[1][1]).reshape(-1, 3)  # a document: mostly paper, some ink
    assert (flat.min(1) > 200).mean() > 0.8 and (flat.max(1) < 100).any()


def test_accuracy_reports_each_family_against_float32(tmp_path, capsys) -> None:
    out = tmp_path / "acc.json"
    argv = ["--presets", "tiny-k2.5", "tiny-k3", "--device", "cpu", "--per-kind", "1", "--max-side", "224"]
    assert accuracy.main([*argv, "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    rows = {(r["preset"], r["model"], r["reference"], r.get("kind")): r for r in record["results"]}
    for preset in ("tiny-k2.5", "tiny-k3"):
        bf16, fp8 = rows[(preset, "bfloat16", "float32", None)], rows[(preset, "fp8", "float32", None)]
        assert fp8["fp8_mode"] == "emulated" and fp8["meets_floor"] is True
        assert 0.999 < fp8["token_cos_mean"] < bf16["token_cos_mean"] <= 1.0  # fp8 costs more than bf16, a little
        assert fp8["token_cos_worst"] <= fp8["token_cos_mean"] and fp8["image_rel_err_worst"] < 0.06
        assert 0.8 < fp8["top1_unchanged"] <= 1.0
        assert all((preset, "fp8", "float32", kind) in rows for kind in KINDS)
    assert "floor: MET" in capsys.readouterr().out


def test_compare_of_identical_embeddings_is_exact() -> None:
    import torch

    emb = [torch.randn(5, 16), torch.randn(3, 16)]
    got = accuracy.compare(emb, [e.clone() for e in emb], torch.randn(64, 16, dtype=torch.float64))
    assert got["token_cos_worst"] > 1 - 1e-12 and got["image_rel_err_worst"] == 0 and got["top1_unchanged"] == 1


def test_encoder_bench_times_fp8_next_to_the_default(tmp_path) -> None:
    out = tmp_path / "enc.json"
    argv = ["--device", "cpu", "--preset", "tiny-k3", "--workloads", "56x2", "--reps", "1", "--warmup", "0"]
    assert forward.main([*argv, "--fp8", "--no-baseline", "--quiet", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [r["impl"] for r in record["results"]] == ["mmproc", "mmproc-b2b", "fp8"]
    check = record["checks"][0]
    assert check["fp8_speedup"] > 0 and check["fp8_token_cos_mean"] > 0.999 and check["fp8_syncs_per_forward"] == 0
    assert record["fp8_kernels"] == ["eager", "emulated"]
