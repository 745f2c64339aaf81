"""How many CPUs this process may really use: its affinity mask, capped by a cgroup CPU quota (a container's
`resources.limits.cpu`), which `os.cpu_count()` ignores (it reports the host's cores)."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cpus(cgroup_root: Path = CGROUP_ROOT) -> int:
    """min(affinity, ceil(cgroup quota)), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root)
    return max(1, min(cpus, math.ceil(quota)) if quota is not None else cpus)


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs the cgroup allows (quota / period), or None without a limit: cgroup v2 `cpu.max` ("max 100000" or
    "200000 100000"), else v1 `cpu/cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: none)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
