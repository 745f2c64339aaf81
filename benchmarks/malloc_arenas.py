"""`mmproc bench malloc_arenas`: the main process's RSS under reply-sized allocations, by glibc arena cap.

Each cap runs in a fresh process that applies it the way `mmproc serve` does (service/app/host_memory.py:
the arena cap, then the 1 GiB freed-memory reuse). `--threads` threads (a 16-core host's reply threads) then take
turns, at most `--holders` at a time, holding two blocks of 4-24 MB each (a reply's message chunks) and freeing
them. The live set never passes holders x 2 x 24 MB; what passes it is freed memory that an arena keeps for its
own threads. Reported per cap: peak and final RSS over the RSS at start, wall time and minor page faults (a reused page faults no more).

    mmproc bench malloc_arenas [--caps 0,8,4,2,1] [--threads 16] [--holders 4] [--rounds 30]
"""

from __future__ import annotations

import argparse
import random
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from mmproc.units import MiB
from service.app.host_memory import limit_malloc_arenas, reuse_freed_host_memory
from service.app.settings import CUDA_HOST_MALLOC_REUSE_MB

CHECKOUT = Path(__file__).resolve().parents[1]  # each cap runs as `python -m benchmarks.malloc_arenas` from here


def _status_mb(key: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) >> 10 for line in status if line.startswith(key))


def child(cap: int, threads: int, holders: int, rounds: int) -> str:
    """One cap, in this (fresh) process: a markdown table row."""
    limit_malloc_arenas(cap)
    reuse_freed_host_memory(CUDA_HOST_MALLOC_REUSE_MB * MiB)  # the serving default with a GPU
    turns = threading.Semaphore(holders)

    def replies(seed: int) -> None:
        draw = random.Random(seed)
        for _ in range(rounds):
            with turns:
                chunks = [bytearray(draw.randint(4, 24) * MiB) for _ in range(2)]  # zeroed: every page touched
                time.sleep(0.001)
                del chunks
            time.sleep(draw.random() * 0.005)

    idle, faults = _status_mb("VmRSS"), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    workers = [threading.Thread(target=replies, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - start
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    label = "glibc's default" if cap == 0 else str(cap)
    peak, final = _status_mb("VmHWM") - idle, _status_mb("VmRSS") - idle
    return f"| {label} | +{peak} | +{final} | {seconds:.2f} | {faults} |"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmproc bench malloc_arenas", description=__doc__.split("\n")[0])
    p.add_argument("--caps", default="0,8,4,2,1", help="arena caps to compare, comma-separated (0: glibc's default)")
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--holders", type=int, default=4, help="threads holding their blocks at once")
    p.add_argument("--rounds", type=int, default=30, help="replies per thread")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.child is not None:
        print(child(args.child, args.threads, args.holders, args.rounds))
        return 0
    print(f"{args.threads} threads, at most {args.holders} holding two 4-24 MB blocks, {args.rounds} replies each\n")
    print("| arena cap | peak RSS over start (MB) | at the end (MB) | seconds | minor faults |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for cap in args.caps.split(","):
        sizes = ["--threads", str(args.threads), "--holders", str(args.holders), "--rounds", str(args.rounds)]
        command = [sys.executable, "-m", "benchmarks.malloc_arenas", "--child", cap, *sizes]
        done = subprocess.run(command, cwd=CHECKOUT, capture_output=True, text=True, check=True)
        print(done.stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
