"""`mmproc bench serve --workload video`: video requests against a running `mmproc serve` (a K2.5 model).

Also the CPU cost of decoding per sampled frame against FFmpeg's own decode floor; what each figure counts:
docs/bench.md."""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mmproc.bench.report import Progress
from mmproc.bench.serve_stats import environment
from mmproc.bench.videos import VideoSpec, make_video
from mmproc.errors import ResourceExhaustedError


def wants_video(argv: Sequence[str]) -> bool:
    """Whether `mmproc bench serve` was asked for this workload (checked before its own flags are parsed)."""
    return "--workload=video" in argv or any(a == "--workload" and b == "video" for a, b in zip(argv, argv[1:]))


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmproc bench serve --workload video", description=__doc__.split("\n")[0])
    add = p.add_argument
    add("--workload", choices=["video"], required=True)
    add("--target", default="127.0.0.1:50051")
    add("--requests", type=int, default=16)
    add("--concurrency", type=int, default=2)
    add("--warmup", type=int, default=2)
    add("--timeout", type=float, default=300.0)
    add("--seed", type=int, default=0)
    add("--distinct", type=int, default=4, help="different video files, cycled over the requests")
    add("--video-seconds", type=float, default=10.0)
    add("--video-resolution", default="1280x720", help="WxH")
    add("--video-fps", type=int, default=30, help="the files' frame rate")
    add("--gop", type=int, default=60, help="keyframe interval of the files, in frames")
    add("--codec", default="libx264", help="PyAV encoder of the files")
    add("--sample-fps", type=float, default=None, help="sampling override (default: the server's, 2 fps)")
    add("--device", default="cpu", help="consumer device")
    add("--transport", choices=["auto", "ipc", "serialized"], default="auto")
    add("--retries", type=int, default=5, help="per request, after a RESOURCE_EXHAUSTED refusal (backing off)")
    add("--decode-reps", type=int, default=3)
    add("--skip-serve", action="store_true", help="decode cost only (no server needed)")
    add("--json", type=Path, default=None)
    add("--markdown", type=Path, default=None)
    add("--quiet", action="store_true")
    args = p.parse_args(argv)
    w, _, h = args.video_resolution.partition("x")
    args.spec = VideoSpec(args.video_seconds, int(w), int(h), args.video_fps, args.codec, "mp4", args.gop)
    return args


def _cpu(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(max(1, reps)):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def decode_costs(videos: Sequence[bytes], sample_fps: float, reps: int) -> dict:
    """CPU ms per sampled frame of each way to get the sampled frames (one FFmpeg thread each)."""
    import av
    import torch

    from mmproc.media.video import VideoSampling, decode_video
    from mmproc.media.video_limits import VideoLimits
    from mmproc.preprocess.video import preprocess_video
    from mmproc.preprocess.video_config import VideoRules

    torch.set_num_threads(1)
    limits, rules = VideoLimits(decode_cpu_s=3600.0), VideoRules()
    totals = {"mmproc": 0.0, "every_frame": 0.0, "floor": 0.0, "preprocess": 0.0}
    sampled = decoded_planned = frames_total = 0
    for data in videos:
        video = decode_video(data, limits, VideoSampling(fps=sample_fps), rules.fps)
        wanted = set(video.indices)
        sampled += len(wanted)
        decoded_planned += video.decoded_frames
        frames_total += video.index.num_frames

        def every_frame(data=data, wanted=wanted) -> None:
            last = max(wanted)
            with av.open(io.BytesIO(data)) as container:
                container.streams.video[0].codec_context.thread_count = 1
                for i, frame in enumerate(container.decode(video=0)):
                    if i > last:
                        break
                    if i in wanted:
                        frame.to_ndarray(format="rgb24")

        def floor(data=data) -> None:
            with av.open(io.BytesIO(data)) as container:
                container.streams.video[0].codec_context.thread_count = 1
                for _ in container.decode(video=0):
                    pass

        totals["mmproc"] += _cpu(lambda data=data: decode_video(data, limits, VideoSampling(fps=sample_fps), 2.0), reps)
        totals["every_frame"] += _cpu(every_frame, reps)
        totals["floor"] += _cpu(floor, reps)
        totals["preprocess"] += _cpu(lambda v=video: preprocess_video(v.frames, v.indices, v.index.fps, rules), reps)
    per_frame = {k: 1000 * v / sampled for k, v in totals.items()}
    return {
        "sampled_frames": sampled,
        "frames_decoded": decoded_planned,
        "frames_in_streams": frames_total,
        "ms_per_sampled_frame": per_frame,
        "mmproc_vs_floor": per_frame["mmproc"] / per_frame["floor"],
        "mmproc_vs_every_frame": per_frame["mmproc"] / per_frame["every_frame"],
    }


def serve(args: argparse.Namespace, videos: Sequence[bytes]) -> dict:
    from mmproc.client import EncoderClient, VideoEmbedding, VideoInput

    def item(i: int) -> VideoInput:
        return VideoInput(videos[i % len(videos)], fps=args.sample_fps)

    clients = [
        EncoderClient(args.target, device=args.device, transport=args.transport, timeout=args.timeout)
        for _ in range(args.concurrency)
    ]
    try:
        for i in range(args.warmup):
            clients[0].encode_videos([item(i)])
        latencies: list[float] = []
        tokens, frames, errors, retries = [0], [0], [], [0]
        refused: Counter[str] = Counter()  # by code, after --retries
        failed: Counter[str] = Counter()  # by code
        next_index, lock = [0], threading.Lock()
        bar = Progress(args.requests, "video", unit="req", enabled=False if args.quiet else None)

        def encode(client: EncoderClient, i: int) -> VideoEmbedding:
            """The request, retried after a refusal as the server asks (else a jittered doubling back-off)."""
            for attempt in range(args.retries + 1):
                try:
                    return client.encode_videos([item(i)])[0]
                except ResourceExhaustedError as exc:
                    if attempt == args.retries:
                        raise
                    with lock:
                        retries[0] += 1
                    time.sleep(exc.retry_after_s or random.uniform(0, min(2.0, 0.05 * 2**attempt)))
            raise AssertionError("unreachable")

        def loop(client: EncoderClient) -> None:
            while True:
                with lock:
                    i = next_index[0]
                    if i >= args.requests:
                        return
                    next_index[0] += 1
                start = time.perf_counter()  # latency includes the back-off of a refused request
                try:
                    video = encode(client, i)
                except Exception as exc:  # counted by code; one failure never stops the run
                    code = getattr(exc, "grpc_code", type(exc).__name__)
                    with lock:
                        (refused if isinstance(exc, ResourceExhaustedError) else failed)[code] += 1
                        errors.append(f"{code}: {str(exc)[:200]}")
                    bar.tick()
                    continue
                bar.tick()
                with lock:
                    latencies.append(time.perf_counter() - start)
                    tokens[0] += video.num_tokens
                    frames[0] += len(video.frame_indices)

        started = time.perf_counter()
        threads = [threading.Thread(target=loop, args=(c,)) for c in clients]
        with bar:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        wall = time.perf_counter() - started
    finally:
        for client in clients:
            client.close()
    done = len(latencies)
    lat = np.array(latencies) * 1000 if latencies else np.zeros(1)
    return {
        "completed": done,
        "refused": dict(refused),  # RESOURCE_EXHAUSTED after every retry: the server's limits, not a fault
        "retries": retries[0],
        "failed": dict(failed),
        "errors": errors[:5],
        "wall_s": wall,
        "video_seconds_per_s": done * args.spec.seconds / wall,
        "sampled_frames_per_s": frames[0] / wall,
        "tokens_per_s": tokens[0] / wall,
        "latency_ms": {
            "p50": float(np.percentile(lat, 50)),
            "p95": float(np.percentile(lat, 95)),
            "mean": float(lat.mean()),
        },
    }


def markdown(record: dict) -> str:
    spec, lines = record["workload"], []
    lines.append(
        f"video workload: {spec['seconds']} s of {spec['width']}x{spec['height']} at {spec['fps']} fps "
        f"({spec['codec']}, keyframe every {spec['gop']} frames), {spec['mean_kib']:.0f} KiB per file, sampled at "
        f"{spec['sample_fps'] or 'the server default'}"
    )
    cost = record["decode"]
    ms = cost["ms_per_sampled_frame"]
    lines += [
        "",
        "| CPU ms per sampled frame (1 thread) | mmproc decode | every frame (transformers' reader) | FFmpeg floor "
        "(decode all, no RGB) | preprocess |",
        "|---|---|---|---|---|",
        f"| {cost['sampled_frames']} sampled of {cost['frames_in_streams']} frames, {cost['frames_decoded']} "
        f"decoded | {ms['mmproc']:.2f} | {ms['every_frame']:.2f} | {ms['floor']:.2f} | {ms['preprocess']:.2f} |",
        "",
        f"mmproc / floor = {cost['mmproc_vs_floor']:.2f}, mmproc / every frame = {cost['mmproc_vs_every_frame']:.2f}",
    ]
    run = record.get("serve")
    if run is not None:
        lat = run["latency_ms"]
        lines += [
            "",
            "| completed | refused (retries) | failed | video s / s | sampled frames / s | tokens / s | latency p50 / "
            "p95 ms |",
            "|---|---|---|---|---|---|---|",
            f"| {run['completed']} | {_by_code(run['refused'])} ({run['retries']}) | {_by_code(run['failed'])} | "
            f"{run['video_seconds_per_s']:.2f} | "
            f"{run['sampled_frames_per_s']:.1f} | {run['tokens_per_s']:.0f} | {lat['p50']:.0f} / {lat['p95']:.0f} |",
        ]
    return "\n".join(lines)


def _by_code(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {code}" for code, n in sorted(counts.items())) or "0"


def main(argv: Sequence[str]) -> int:
    args = _parse(argv)
    started = time.perf_counter()
    videos = [make_video(args.spec, args.seed, i) for i in range(max(1, args.distinct))]
    if not args.quiet:
        print(f"generated {len(videos)} videos in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    spec = args.spec
    record: dict = {
        "bench": "serve --workload video",
        "environment": environment(list(argv), args.device),
        "workload": {
            "seconds": spec.seconds,
            "width": spec.width,
            "height": spec.height,
            "fps": spec.fps,
            "codec": spec.codec,
            "gop": spec.gop,
            "sample_fps": args.sample_fps,
            "distinct": len(videos),
            "mean_kib": sum(map(len, videos)) / len(videos) / 1024,
            "requests": args.requests,
            "concurrency": args.concurrency,
        },  # fmt: skip
        "decode": decode_costs(videos, args.sample_fps or 2.0, args.decode_reps),
    }
    if not args.skip_serve:
        record["serve"] = serve(args, videos)
    text = markdown(record)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=2))
    run = record.get("serve")
    return 0 if run is None or run["completed"] == args.requests else 1
