"""CPU seconds (user + system) of a process and all its descendants, from /proc: `python3 scripts/tree_cpu_seconds.py PID`.

The GPU scripts read it before and after a bench run to give the server's CPU per image (decode workers included)."""

import os
import sys


def tree_cpu_seconds(root: int) -> float:
    stats = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(pid)] = (int(fields[1]), int(fields[11]) + int(fields[12]))  # ppid, utime + stime
    tree, grew = {root}, True
    while grew:
        new = {p for p, (ppid, _) in stats.items() if ppid in tree} - tree
        tree |= new
        grew = bool(new)
    return sum(stats[p][1] for p in tree if p in stats) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    print(tree_cpu_seconds(int(sys.argv[1])))
