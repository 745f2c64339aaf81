"""Where the consumer's time goes between an IPC reply and embeddings ready: each step of the read path timed.

    python -m service.bench.ipc_steps --target HOST:PORT --device cuda:0 [--requests 200] [--json PATH]

A diagnostic for the transport-overhead target (docs/benchmarks/transport.md): it drives the real `IpcClient`
pieces one by one (descriptors, handle cache, ready-word wait, views, copy, synchronize, ack + release) with a
host timer around each, and measures the same GPU work on the consumer's own memory (no IPC) as the yardstick.
Requests are the serve bench's seeded images (`service.bench.images`).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import uuid

import torch

from mmproc.client import EncoderClient
from mmproc.client.shared import descriptor_from_pb
from mmproc.client.wire import PB_DTYPES
from mmproc.v1 import encoder_pb2 as pb
from service.bench.images import ImageSpec, request_images
from service.bench.provenance import git_commit

STEPS = ("reply", "descriptors", "acquire", "wait_ready", "views", "copy", "synchronize", "ack_release")


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def _pct_us(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6


def read_steps(client: EncoderClient, images: list[bytes], timeout: float) -> dict[str, float]:
    """One request, the read path of `IpcClient.read` + a copy, timed step by step (seconds)."""
    ipc = client._ipc
    assert ipc is not None
    device = client.device
    times = {}
    t = time.perf_counter()
    reply = client._ipc_request(images, uuid.uuid4().hex[:16], timeout)
    assert reply is not None and reply.transport == pb.TRANSPORT_IPC, "the server did not answer over IPC"
    t, times["reply"] = time.perf_counter(), time.perf_counter() - t
    descs = [descriptor_from_pb(emb.ipc) for emb in reply.embeddings]
    t, times["descriptors"] = time.perf_counter(), time.perf_counter() - t
    pool = ipc._cache.acquire(ipc.identity, device)
    t, times["acquire"] = time.perf_counter(), time.perf_counter() - t
    stream = torch.cuda.current_stream(device)
    pool.wait_ready(descs[0], stream, timeout)
    t, times["wait_ready"] = time.perf_counter(), time.perf_counter() - t
    views = [
        pool.view(d, getattr(torch, PB_DTYPES[emb.dtype]), tuple(emb.shape)) for d, emb in zip(descs, reply.embeddings)
    ]
    t, times["views"] = time.perf_counter(), time.perf_counter() - t
    outs = [v.clone() for v in views]
    t, times["copy"] = time.perf_counter(), time.perf_counter() - t
    stream.synchronize()
    t, times["synchronize"] = time.perf_counter(), time.perf_counter() - t
    pool.ack(descs[0], stream)
    ipc._send(pb.LeaseRelease(lease_ids=sorted({d.lease_id for d in descs})))
    ipc._cache.release(pool)
    times["ack_release"] = time.perf_counter() - t
    del outs
    return times


def local_yardstick(
    device: torch.device, shapes: list[tuple[int, ...]], reps: int, idle_s: float = 0.0
) -> dict[str, float]:
    """The same copy + synchronize on this process's own memory, and a bare synchronize (median us). `idle_s`:
    sleep that long before each repetition, as the consumer sleeps in the gRPC call before a reply arrives (a
    thread waking from idle can run slower: CPU frequency, caches, a virtual CPU being rescheduled)."""
    stream = torch.cuda.current_stream(device)
    sources = [torch.randn(shape, device=device).to(torch.bfloat16) for shape in shapes]
    copy, sync, bare = [], [], []
    for _ in range(reps):
        stream.synchronize()
        if idle_s:
            time.sleep(idle_s)
        t = time.perf_counter()
        outs = [s.clone() for s in sources]
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


def keep_waiting_thread_busy(client: EncoderClient) -> None:
    """Make the client's unary EncodeImages wait by polling its future (yielding the GIL each turn) instead of
    sleeping in the call: the consumer then behaves like a busy LLM worker, whose thread is hot when the reply
    lands. Tells the IPC path's own cost apart from a thread's wake-up cost (`--busy-wait`)."""
    ipc = client._ipc
    assert ipc is not None
    blocking = ipc._stub.EncodeImages

    def polling(request: pb.EncodeImagesRequest, timeout: float | None = None) -> pb.EncodeImagesResponse:
        future = blocking.future(request, timeout=timeout)
        while not future.done():
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
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    torch.cuda.set_device(device)
    spec = ImageSpec(resolutions=((args.size, args.size),), fmt="jpeg")
    payloads = [list(request_images(0, i, args.images_per_request, spec)) for i in range(args.warmup + args.requests)]
    samples: dict[str, list[float]] = {step: [] for step in STEPS}
    with EncoderClient(args.target, device=device, transport="ipc", timeout=60) as client:
        if args.busy_wait:
            keep_waiting_thread_busy(client)
        for i, images in enumerate(payloads):
            times = read_steps(client, images, 60)
            if i >= args.warmup:
                for step, seconds in times.items():
                    samples[step].append(seconds)
        reply_shapes = client.encode_images(payloads[0])
        shapes = [tuple(t.shape) for t in reply_shapes]
        yardstick = local_yardstick(device, shapes, args.requests)
        idle = statistics.median(samples["reply"])
        after_idle = local_yardstick(device, shapes, min(args.requests, 100), idle_s=idle)
        stats = client.ipc_stats
    after_reply = [sum(samples[s][i] for s in STEPS[1:7]) for i in range(args.requests)]
    result = {
        "bench": "ipc_steps",
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": torch.cuda.get_device_name(device),
        "requests": args.requests,
        "busy_wait": args.busy_wait,
        "embedding_bytes": sum(2 * a * b for a, b in shapes),
        "steps_us": {s: {"p50": _median_us(v), "p90": _pct_us(v, 0.9)} for s, v in samples.items()},
        "reply_to_ready_us": {"p50": _median_us(after_reply), "p90": _pct_us(after_reply, 0.9)},
        "local_yardstick_us": yardstick,
        "local_yardstick_after_idle_us": after_idle,
        "ipc_stats": stats,
    }
    print(
        f"# IPC read path, {args.requests} requests x {args.images_per_request} images ({result['embedding_bytes']} B)"
    )
    print("| step | p50 us | p90 us |\n| --- | ---: | ---: |")
    for step, v in result["steps_us"].items():
        print(f"| {step} | {v['p50']:.1f} | {v['p90']:.1f} |")
    r = result["reply_to_ready_us"]
    print(f"| reply -> ready (descriptors .. synchronize) | {r['p50']:.1f} | {r['p90']:.1f} |")
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
