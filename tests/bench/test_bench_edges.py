"""Bench defaults a user meets first: CPU-sized workloads on the CPU, a bar that moves within a workload, squares."""

from __future__ import annotations

import argparse

import pytest

from mmproc.bench import cpu_preprocess, forward
from mmproc.bench.report import Progress


def test_the_cpu_gets_cpu_sized_defaults_and_the_gpu_keeps_its_own() -> None:
    cpu = forward._cpu_sized(forward._parse(["--device", "cpu"]))
    assert cpu.preset == "tiny" and cpu.workloads == list(forward.CPU_WORKLOADS) and (cpu.reps, cpu.warmup) == (3, 1)
    gpu = forward._cpu_sized(forward._parse(["--device", "cuda"]))
    assert gpu.preset == "kimi-k2.5" and gpu.workloads == list(forward.GPU_WORKLOADS) and gpu.reps == 10
    given = forward._cpu_sized(forward._parse(["--device", "cpu", "--workloads", "56x1", "--reps", "1"]))
    assert given.workloads == ["56x1"] and given.reps == 1


def test_the_encoder_bar_moves_within_a_workload(monkeypatch, capsys) -> None:
    ticks: list[int] = []
    real_tick = Progress.tick

    def tick(self: Progress, n: int = 1) -> None:
        ticks.append(self.total)
        real_tick(self, n)

    monkeypatch.setattr(Progress, "tick", tick)
    argv = ["--device", "cpu", "--workloads", "56x1", "--reps", "1", "--warmup", "0", "--no-baseline", "--quiet"]
    assert forward.main(argv) == 0
    assert len(ticks) == 2 == ticks[0]  # the mmproc and back-to-back timings of the one workload
    assert "56x1" in capsys.readouterr().out


def test_cpu_preprocess_takes_a_bare_side_as_a_square() -> None:
    assert cpu_preprocess._size("512") == (512, 512) and cpu_preprocess._size("1920x1080") == (1920, 1080)
    with pytest.raises(argparse.ArgumentTypeError, match="WIDTHxHEIGHT"):
        cpu_preprocess._size("big")


def test_the_client_bench_shows_progress_per_case(tiny_server, monkeypatch, capsys) -> None:
    from mmproc.bench import client

    ticks: list[tuple[int, int]] = []
    real_tick = Progress.tick
    monkeypatch.setattr(Progress, "tick", lambda self, n=1: (ticks.append((n, self.total)), real_tick(self, n)))
    argv = ["--target", tiny_server.grpc_target, "--images", "1", "--size", "64", "--requests", "2", "--warmup", "1"]
    assert client.main([*argv, "--quiet"]) == 0
    assert ticks == [(3, 6), (3, 6)]  # sync, then async: 1 warm-up + 2 measured requests each
    assert "sync" in capsys.readouterr().out


def test_cpu_preprocess_ticks_per_size(monkeypatch, capsys) -> None:
    ticks: list[int] = []
    real_tick = Progress.tick
    monkeypatch.setattr(Progress, "tick", lambda self, n=1: (ticks.append(self.total), real_tick(self, n)))
    assert cpu_preprocess.main(["--sizes", "64", "48x32", "--repeat", "1", "--quiet"]) == 0
    assert ticks == [2, 2] and "64x64" in capsys.readouterr().out
