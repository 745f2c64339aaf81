"""NIXL against serialized on one machine, the real server and client without the model's cost per request: the
server keeps 4 images' results under keys once (encoded once), then each measured request fetches them, which
copies them into the request's destination (a NIXL lease, or serialized bytes) as an encode would write them.
The client runs in a process of its own; both sides' CPU is counted. docs/benchmarks/nixl.md.

    UCX_TLS=tcp UCX_NET_DEVICES=lo python3 -m benchmarks.nixl_loopback --sizes 4 20 --requests 40
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

# MB per request -> images of W x H: the tiny preset (float32, 256 wide) caps an image near 1024 rows (1 MB), so
# 20 MB replies take 20 images, not 4 of 5 MB (those need a checkpoint's width: scripts/gpu_xnode_check.sh).
SIZES = {4: (4, 896, 896), 20: (20, 896, 896)}


def client_main(target: str, mb: int, requests: int) -> None:
    """In the client process: keep, then alternate serialized and NIXL fetches; one JSON line of results."""
    import torch

    from mmproc.client import EncoderClient
    from mmproc.client.nixl_reader import NixlReader
    from tests.support.media_samples import make_image_bytes

    count, w, h = SIZES[mb]
    images = [make_image_bytes(w, h, fmt="PNG", seed=i) for i in range(count)]
    keys = [f"k{mb}-{i}" for i in range(count)]
    plain = EncoderClient(target, transport="serialized", timeout=600)
    fast = EncoderClient(target, transport="nixl", timeout=600)
    reader = fast._reader
    assert isinstance(reader, NixlReader)
    plain.keep(images, keys, timeout=600)
    want = [e.tensor for e in plain.fetch(keys)]
    nbytes = sum(t.numel() * t.element_size() for t in want)
    times: dict[str, list[float]] = {"serialized": [], "nixl": [], "nixl_send_to_reply": [], "nixl_reply_to_ready": []}
    cpu = {"serialized": 0.0, "nixl": 0.0}

    def serialized() -> list[torch.Tensor]:
        return plain.fetch(keys)

    def nixl() -> list[torch.Tensor]:
        start = time.perf_counter()
        reply = reader.request([], keys, "bench", 60)
        replied = time.perf_counter()
        with reader.session.read(reply, 60) as views:
            got = [v.clone() for v in views]
        times["nixl_send_to_reply"].append(replied - start)
        times["nixl_reply_to_ready"].append(time.perf_counter() - replied)
        return got

    assert all(torch.equal(a, b) for a, b in zip(nixl(), want, strict=True)), "NIXL bytes differ from serialized"
    for fn in (serialized, nixl, serialized, nixl):
        fn()  # warm-up
    times = {k: [] for k in times}
    for name, fn in (("serialized", serialized), ("nixl", nixl)):  # one phase each: the server's CPU per phase
        print(json.dumps({"phase": name}), flush=True)
        sys.stdin.readline()
        c0 = time.process_time()
        for _ in range(requests):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        cpu[name] = time.process_time() - c0
    print(json.dumps({"phase": "end"}), flush=True)
    sys.stdin.readline()
    print(json.dumps({"bytes": nbytes, "times": times, "client_cpu_s": cpu}), flush=True)


def ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[4, 20], choices=sorted(SIZES))
    p.add_argument(
        "--requests", type=int, default=40, help="measured requests per transport (serialized first, then NIXL)"
    )
    p.add_argument("--client", nargs=3, metavar=("TARGET", "MB", "REQUESTS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        client_main(args.client[0], int(args.client[1]), int(args.client[2]))
        return 0
    from tests.support.server import ServiceThread, test_settings

    settings = test_settings(nixl=True, nixl_ucx_tls=os.environ.get("UCX_TLS", "tcp"), http_address="", cache_mb=0,
                             dtype="float32", max_reply_mb=256, nixl_pool_mb=512)  # fmt: skip
    server = ServiceThread(settings).start()
    print(f"# nixl_loopback {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}; {server.service.pipeline.ipc_status}")
    try:
        for mb in args.sizes:
            cmd = [sys.executable, "-m", "benchmarks.nixl_loopback", "--client", server.grpc_target, str(mb),
                   str(args.requests)]  # fmt: skip
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ)
            server_cpu, mark, line = {}, None, ""
            for line in proc.stdout:
                if not line.startswith("{"):
                    continue
                event = json.loads(line)
                if "phase" not in event:
                    break
                now = time.process_time()
                if mark is not None:
                    server_cpu[mark[0]] = now - mark[1]
                mark = (event["phase"], now)
                proc.stdin.write("go\n")
                proc.stdin.flush()
            proc.wait(60)
            if not line.startswith("{") or "bytes" not in line:
                return 1
            got = json.loads(line)
            t, n, size = got["times"], args.requests, got["bytes"] / 1e6
            print(
                f"\n## {size:.1f} MB per request ({SIZES[mb][0]} images), {n} requests per transport, one after the other"
            )
            print(
                "| transport | req/s | GB/s | latency p50 / p99 (ms) | reply->ready p50 / p99 (ms) | client CPU/image (ms) "
                "| server CPU/image (ms) |"
            )
            print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
            for name in ("serialized", "nixl"):
                wall = sum(t[name])
                ready = (f"{ms(t['nixl_reply_to_ready'], 50):.1f} / {ms(t['nixl_reply_to_ready'], 99):.1f}"
                         if name == "nixl" else "- (in the stream)")  # fmt: skip
                print(f"| {name} | {n / wall:.1f} | {n * size / 1e3 / wall:.2f} | {ms(t[name], 50):.1f} / "
                      f"{ms(t[name], 99):.1f} | {ready} | {got['client_cpu_s'][name] / (SIZES[mb][0] * n) * 1e3:.2f} | "
                      f"{server_cpu[name] / (SIZES[mb][0] * n) * 1e3:.2f} |")  # fmt: skip
            print("raw: " + json.dumps({"mb": mb, "server_cpu_s": server_cpu, **got}))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
