"""Which OS threads of this process do what, for CPU seconds by role. Process-wide on purpose: thread ids belong
to the process. Linux /proc only; elsewhere nothing is recorded."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

TASKS = "/proc/self/task"
_lock = threading.Lock()
_tids: dict[int, tuple[str, int]] = {}  # tid -> (role, start time in clock ticks): a reused id is another thread


def task_ids() -> frozenset[int]:
    """The ids of this process's live threads (empty without /proc)."""
    try:
        return frozenset(int(name) for name in os.listdir(TASKS))
    except OSError:
        return frozenset()


def task_stat(path: str) -> tuple[int, int] | None:
    """(utime + stime, start time) in clock ticks from a stat file; None when gone. Fields per proc(5)."""
    try:
        with open(path, "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12]), int(fields[19])


def register(role: str) -> None:
    register_tids(role, [threading.get_native_id()])


def register_tids(role: str, tids: Iterable[int]) -> None:
    """Threads `tids` of this process do `role`'s work; ids of threads already gone are skipped."""
    found = {tid: (role, stat[1]) for tid in tids if (stat := task_stat(f"{TASKS}/{tid}/stat")) is not None}
    with _lock:
        live = task_ids()
        for tid in [t for t in _tids if t not in live]:  # bounded: exited threads leave the table here
            del _tids[tid]
        _tids.update(found)


def registered() -> dict[int, tuple[str, int]]:
    with _lock:
        return dict(_tids)
