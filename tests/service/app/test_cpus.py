"""service/app/cpus.py: the decode-worker default follows the CPUs a container may use, not the host's."""

from __future__ import annotations

import os

import pytest

from service.app.cpus import cgroup_cpu_quota, usable_cpus
from service.app.settings import ServerSettings

AFFINITY = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),
        ({}, None),
        ({"cpu.max": "garbage"}, None),
    ],
)
def test_cgroup_quota_v1_and_v2(tmp_path, files, quota) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == quota
    want = AFFINITY if quota is None else max(1, min(AFFINITY, -(-quota // 1)))
    assert usable_cpus(tmp_path) == want


def test_a_fractional_quota_still_gets_one_worker(tmp_path) -> None:
    (tmp_path / "cpu.max").write_text("20000 100000\n")  # 0.2 CPU
    assert usable_cpus(tmp_path) == 1


def test_decode_workers_default_and_override(monkeypatch) -> None:
    monkeypatch.setattr("service.app.cpus.usable_cpus", lambda: 3)
    assert ServerSettings().decode_workers == 3
    assert ServerSettings(preprocess_workers=5).decode_workers == 5
