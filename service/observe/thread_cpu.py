"""`mmproc_cpu_seconds_total{role}`: the server's CPU time by role, read from /proc at scrape time (roles:
docs/deploy.md). Linux only."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily

from mmproc import thread_roles

THREAD_ROLES = ("event_loop", "grpc_loop", "runner", "gpu_decode")
ROLES = (*THREAD_ROLES, "decode_workers", "other")
MAX_CHILD_DEPTH = 3  # a decode worker's own children (and theirs): more would be a bug, not a workload

Key = tuple[int, int]  # (tid or pid, start time): a reused id is a different task


class CpuByRole:
    """A custom collector; an exited task's last reading is folded into its role, so counters stay monotonic."""

    def __init__(self, worker_pids: Callable[[], list[int]] = list) -> None:
        self.worker_pids = worker_pids
        self._lock = threading.Lock()  # scrapes may come from more than one thread
        self._last: dict[Key, tuple[str, int]] = {}  # live task -> (role, ticks at the last reading)
        self._gone: Counter[str] = Counter()  # ticks of tasks that exited, by role
        self._other = 0
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def describe(self) -> list:
        return []  # read lazily, at scrape time

    def collect(self) -> Iterator[CounterMetricFamily]:
        ticks = self.ticks()
        if ticks is None:
            return
        family = CounterMetricFamily(
            "mmproc_cpu_seconds", "Server CPU time (user + system) by role: event_loop, grpc_loop (the gRPC front "
            "end's own loop, when it has one), runner, gpu_decode "
            "(incl. nvImageCodec's threads), decode_workers (processes), other (the rest of the server process).",
            labels=["role"],
        )  # fmt: skip
        for role in ROLES:
            family.add_metric([role], ticks[role] / self._tick)
        yield family

    def ticks(self) -> dict[str, int] | None:
        """Clock ticks by role since the process started; None without /proc."""
        process = thread_roles.task_stat("/proc/self/stat")
        if process is None:
            return None
        with self._lock:
            seen: dict[Key, tuple[str, int]] = {}
            for tid, (role, start) in thread_roles.registered().items():
                stat = thread_roles.task_stat(f"{thread_roles.TASKS}/{tid}/stat")
                if stat is not None and stat[1] == start:
                    seen[(tid, start)] = (role, stat[0])
            for pid in self.worker_pids():
                tree = _tree_ticks(pid)
                if tree is not None:
                    seen[(pid, tree[1])] = ("decode_workers", tree[0])
            for key in self._last.keys() - seen.keys():  # exited: its last reading stays in its role
                role, last = self._last.pop(key)
                self._gone[role] += last
            self._last = {key: (role, max(t, self._last.get(key, (role, 0))[1])) for key, (role, t) in seen.items()}
            out = Counter(self._gone)
            for role, t in self._last.values():
                out[role] += t
            # The process total includes exited threads; what no role claims is `other` (never counted down).
            self._other = max(self._other, process[0] - sum(out[r] for r in THREAD_ROLES))
            out["other"] = self._other
            return {role: out[role] for role in ROLES}


def _tree_ticks(pid: int, depth: int = 0) -> tuple[int, int] | None:
    """(ticks, start time) of a process with its children's: those it waited for (cutime + cstime) and the live
    ones; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        ticks, start = sum(int(f) for f in fields[11:15]), int(fields[19])  # utime, stime, cutime, cstime; start
    except (OSError, IndexError, ValueError):
        return None
    live: list[int] = []
    if depth < MAX_CHILD_DEPTH:
        try:  # a kernel without CONFIG_PROC_CHILDREN has no such file: waited-for children only
            with open(f"/proc/{pid}/task/{pid}/children") as children:
                live = [int(c) for c in children.read().split()]
        except (OSError, ValueError):
            pass
    return ticks + sum(child[0] for c in live if (child := _tree_ticks(c, depth + 1)) is not None), start
