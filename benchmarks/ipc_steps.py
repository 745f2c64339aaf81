"""Where the consumer's time goes between an IPC reply and embeddings ready: each step of the read path timed.

    python -m benchmarks.ipc_steps --target HOST:PORT --device cuda:0 [--requests 200] [--json PATH]

A diagnostic for the transport-overhead target (docs/benchmarks/transport.md): it drives the real `IpcClient`
pieces one by one (descriptors, handle cache, ready-word wait, views, copy, synchronize, ack + release) with a
host timer around each, and measures the same GPU work on the consumer's own memory (no IPC) as the yardstick.
Requests are the serve bench's seeded images (`mmproc.bench.images`).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import uuid

import torch

from mmproc.bench.images import ImageSpec, request_images
from mmproc.bench.provenance import git_commit
from mmproc.bench.report import Progress
from mmproc.client import EncoderClient
from mmproc.client.ipc import ack_all, clone_views, pool_views, request_leases, wait_all
from mmproc.v1 import encoder_pb2 as pb


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def _pct_us(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6


_PROBE_MEMORY = torch.empty(1 << 20, dtype=torch.uint8)


def cpu_probe() -> None:
    """A fixed piece of host work (Python + 4 torch views of CPU memory, no CUDA): timed right after a reply
    and again in a hot loop, it tells whether the consumer thread itself runs slowly after waiting."""
    total = 0
    for i in range(200):
        total += i
    for offset in (0, 4096, 8192, 12288):
        _PROBE_MEMORY.as_strided((16, 256), (256, 1), offset)


READY_STEPS = ("descriptors", "acquire", "wait_ready", "views", "copy", "synchronize")
HOT_REPEATS = 5  # the ready steps again on the same reply, back to back (before its ack): the path's hot cost
STEPS = ("reply", "probe", *READY_STEPS)


class Laps:
    """Wall and this thread's CPU seconds between consecutive `lap` calls, by step name."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._t, self._c = time.perf_counter(), time.thread_time()

    def lap(self, step: str) -> None:
        now, now_cpu = time.perf_counter(), time.thread_time()
        self.wall[step], self.cpu[step] = now - self._t, now_cpu - self._c
        self._t, self._c = now, now_cpu


def read_steps(client: EncoderClient, images: list[bytes], timeout: float) -> tuple[Laps, list[Laps]]:
    """One request through the steps of `IpcClient.read` + `encode_images`' copy, each timed (wall and thread CPU
    seconds: CPU well below wall means the thread waited, equal means its own work was slow); then the ready
    steps HOT_REPEATS more times on the same reply, as a thread that just ran them would (the hot cost)."""
    ipc = client._ipc
    assert ipc is not None
    device, stream = client.device, torch.cuda.current_stream(client.device)
    laps = Laps()
    reply = client._reader.request(images, uuid.uuid4().hex[:16], timeout)
    assert reply is not None and reply.transport == pb.TRANSPORT_IPC, "the server did not answer over IPC"
    laps.lap("reply")
    cpu_probe()
    laps.lap("probe")
    hot = []
    for timed in [laps] + [Laps() for _ in range(HOT_REPEATS)]:
        timed.lap("start")
        leases, lease_ids = request_leases(reply.embeddings)
        timed.lap("descriptors")
        pool = ipc._cache.acquire(ipc.identity, device)
        timed.lap("acquire")
        wait_all(pool, leases, stream, timeout)
        timed.lap("wait_ready")
        views = pool_views(pool, reply.embeddings)
        timed.lap("views")
        outs = clone_views(views)
        timed.lap("copy")
        stream.synchronize()
        timed.lap("synchronize")
        if timed is not laps:
            hot.append(timed)
    ack_all(pool, leases, stream)
    ipc._send(pb.LeaseRelease(lease_ids=lease_ids))
    ipc._cache.release(pool)
    del outs
    return laps, hot


def local_yardstick(
    device: torch.device, shapes: list[tuple[int, ...]], reps: int, idle_s: float = 0.0
) -> dict[str, float]:
    """The same copy + synchronize on this process's own memory, and a bare synchronize (median us). `idle_s`:
    sleep that long before each repetition, as the consumer sleeps in the gRPC call before a reply arrives (a
    thread waking from idle can run slower: CPU frequency, caches, a virtual CPU being rescheduled)."""
    stream = torch.cuda.current_stream(device)
    rows = [shape[0] for shape in shapes]
    sources = list(torch.randn(sum(rows), *shapes[0][1:], device=device).to(torch.bfloat16).split(rows))
    copy, sync, bare = [], [], []
    for _ in range(reps):
        stream.synchronize()
        if idle_s:
            time.sleep(idle_s)
        t = time.perf_counter()
        outs = clone_views(sources)
        t1 = time.perf_counter()
        stream.synchronize()
        t2 = time.perf_counter()
        stream.synchronize()
        t3 = time.perf_counter()
        copy.append(t1 - t)
        sync.append(t2 - t1)
        bare.append(t3 - t2)
        del outs
    return {"copy_us": _median_us(copy), "synchronize_us": _median_us(sync), "idle_synchronize_us": _median_us(bare)}


def keep_waiting_thread_busy(client: EncoderClient, *, spin: bool = False) -> None:
    """Make the client's unary EncodeImages wait by polling its future instead of sleeping in the call, yielding
    the CPU each turn (`--busy-wait`: sched_yield) or not at all (`--spin`: the thread never leaves the CPU; the
    GIL switch interval is cut to 20 us so the gRPC thread that completes the call still gets the GIL). Tells the
    IPC path's own cost apart from a thread's wake-up cost: a busy LLM worker's thread is hot when a reply lands."""
    ipc = client._ipc
    assert ipc is not None
    blocking = ipc._stub.EncodeImages
    if spin:
        sys.setswitchinterval(20e-6)

    def polling(request: pb.EncodeImagesRequest, timeout: float | None = None) -> pb.EncodeImagesResponse:
        future = blocking.future(request, timeout=timeout)
        while not future.done():
            if not spin:
                time.sleep(0)  # sched_yield: the gRPC thread that completes the call gets the GIL
        return future.result()

    ipc._stub = copy.copy(ipc._stub)  # only this client's stub
    ipc._stub.EncodeImages = polling


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--images-per-request", type=int, default=4)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--json", default=None)
    parser.add_argument("--busy-wait", action="store_true", help="poll for the reply instead of sleeping in the call")
    parser.add_argument("--spin", action="store_true", help="poll for the reply without ever yielding the CPU")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    torch.cuda.set_device(device)
    spec = ImageSpec(resolutions=((args.size, args.size),), fmt="jpeg")
    payloads = [list(request_images(0, i, args.images_per_request, spec)) for i in range(args.warmup + args.requests)]
    samples: dict[str, list[float]] = {step: [] for step in STEPS}
    cpu_samples: dict[str, list[float]] = {step: [] for step in STEPS}
    hot_samples: dict[str, list[float]] = {step: [] for step in READY_STEPS}
    hot_totals: list[float] = []
    with EncoderClient(args.target, device=device, transport="ipc", timeout=60) as client:
        if args.busy_wait or args.spin:
            keep_waiting_thread_busy(client, spin=args.spin)
        progress = Progress(len(payloads), "ipc steps", unit="req", enabled=False if args.quiet else None)
        for i, images in enumerate(payloads):
            progress.tick()  # before the timed steps: a redraw never falls inside one
            laps, hot = read_steps(client, images, 60)
            if i >= args.warmup:
                for step in STEPS:
                    samples[step].append(laps.wall[step])
                    cpu_samples[step].append(laps.cpu[step])
                for timed in hot:
                    for step in READY_STEPS:
                        hot_samples[step].append(timed.wall[step])
                    hot_totals.append(sum(timed.wall[step] for step in READY_STEPS))
        progress.close()
        hot_probe = []
        for _ in range(args.requests):
            t = time.perf_counter()
            cpu_probe()
            hot_probe.append(time.perf_counter() - t)
        reply_shapes = client.encode_images(payloads[0])
        shapes = [tuple(t.shape) for t in reply_shapes]
        yardstick = local_yardstick(device, shapes, args.requests)
        idle = statistics.median(samples["reply"])
        after_idle = local_yardstick(device, shapes, min(args.requests, 100), idle_s=idle)
        stats = client.ipc_stats
    after_reply = [sum(samples[s][i] for s in READY_STEPS) for i in range(args.requests)]
    zero_copy = [
        sum(samples[s][i] for s in READY_STEPS[: READY_STEPS.index("views") + 1]) for i in range(args.requests)
    ]
    result = {
        "bench": "ipc_steps",
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": torch.cuda.get_device_name(device),
        "requests": args.requests,
        "busy_wait": args.busy_wait,
        "spin": args.spin,
        "embedding_bytes": sum(2 * a * b for a, b in shapes),
        "steps_us": {
            s: {
                "p50": _median_us(v),
                "p90": _pct_us(v, 0.9),
                "cpu_p50": _median_us(cpu_samples[s]),
                **({"hot_p50": _median_us(hot_samples[s])} if s in hot_samples else {}),
            }
            for s, v in samples.items()
        },
        "probe_hot_us": _median_us(hot_probe),
        "reply_to_ready_us": {"p50": _median_us(after_reply), "p90": _pct_us(after_reply, 0.9)},
        "ready_steps_hot_us": {"p50": _median_us(hot_totals), "p90": _pct_us(hot_totals, 0.9)},
        "reply_to_views_us": {"p50": _median_us(zero_copy), "p90": _pct_us(zero_copy, 0.9)},
        "local_yardstick_us": yardstick,
        "local_yardstick_after_idle_us": after_idle,
        "ipc_stats": stats,
    }
    print(
        f"# IPC read path, {args.requests} requests x {args.images_per_request} images ({result['embedding_bytes']} B)"
    )
    print(f"| step | p50 us | p90 us | thread CPU p50 us | hot p50 us (same steps again x{HOT_REPEATS}) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for step, v in result["steps_us"].items():
        hot_p50 = f"{v['hot_p50']:.1f}" if "hot_p50" in v else ""
        print(f"| {step} | {v['p50']:.1f} | {v['p90']:.1f} | {v['cpu_p50']:.1f} | {hot_p50} |")
    r, h = result["reply_to_ready_us"], result["ready_steps_hot_us"]
    print(f"| reply -> ready (descriptors .. synchronize) | {r['p50']:.1f} | {r['p90']:.1f} | | {h['p50']:.1f} |")
    z = result["reply_to_views_us"]
    print(
        f"| reply -> zero-copy views usable on the stream (descriptors .. views) | {z['p50']:.1f} | {z['p90']:.1f} | | |"
    )
    print(f"the probe in a hot loop: {result['probe_hot_us']:.1f} us (after each reply: the probe row)")
    print(
        "local yardstick (same copies on own memory, us):", json.dumps({k: round(v, 1) for k, v in yardstick.items()})
    )
    print(
        f"local yardstick after {idle * 1e3:.0f} ms idle (us):",
        json.dumps({k: round(v, 1) for k, v in after_idle.items()}),
    )
    print("ipc stats:", stats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
