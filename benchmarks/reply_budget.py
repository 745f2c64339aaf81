"""The server's main-process RSS under concurrent serialized replies of the full-size model's size, by reply budget.

Per budget and round: a fresh `mmproc serve` (the tiny tower with Kimi K2.5's rules and a projector to 7168, bf16:
1332 x 7168 x 2 B = 19 MB per 1024² image, the size of kimi-k2.5's reply). `--source cache` (default) serves every
request from the embedding cache, warmed before the baseline, so that the send path alone is measured: the replies
come as fast as the front ends take them, as from the H200's encoder; `--source encode` (cache off) encodes each
one, and on a CPU the batched forward's own memory then dominates. Once the server is SERVING and has answered the
images once and one request per front end, its peak RSS is reset (/proc/PID/clear_refs) and `--clients` threads
send `--requests` requests each (one 1024² JPEG), in turn gRPC unary, gRPC stream and HTTP /v1/encode with the
embeddings in the body. Reported: the main process's peak RSS over its RSS just before the load, the most reply
bytes in flight seen on /metrics (sampled every 20 ms), images/s and the reply codes.

    python -m benchmarks.reply_budget [--budgets default,1048576] [--source cache|encode] [--clients 16]
        [--requests 6] [--rounds 2] [--server-args '--host-malloc-reuse-mb 0']
"""

from __future__ import annotations

import argparse
import base64
import collections
import concurrent.futures
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import httpx

from mmproc.bench.images import ImageSpec, generate_requests
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc

CHECKOUT = Path(__file__).resolve().parents[1]
MESSAGE_BYTES = 64 << 20  # the server's default max_message_mb
GAUGE = re.compile(rb"^mmproc_reply_bytes_in_flight (\S+)$", re.M)


def write_model(path: Path) -> None:
    """The checkpoint served: the tiny tower with K2.5's rules and a full-size projector output (7168)."""
    from tests.support.checkpoints import write_checkpoint

    write_checkpoint(path, family="kimi_k25", text_hidden=7168, sharded=False, with_language_model=False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def status_mb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) >> 10 for line in status if line.startswith(key))


class Server:
    def __init__(self, model: Path, budget: str, cache: bool, extra: list[str], log: Path) -> None:
        self.grpc = f"127.0.0.1:{free_port()}"
        self.http = f"http://127.0.0.1:{free_port()}"
        command = [
            sys.executable, "-m", "service.app.cli", "serve", "--model-path", str(model), "--dtype", "bfloat16",
            "--cache-mb", "512" if cache else "0", "--max-queue-delay-ms", "600000", "--drain-delay-s", "0",
            "--grpc-address", self.grpc, "--http-address", self.http.removeprefix("http://"),
        ]  # fmt: skip
        if budget != "default":
            command += ["--max-reply-mb", budget]
        command += extra
        self._log = log.open("w")
        self.process = subprocess.Popen(command, cwd=CHECKOUT, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if httpx.get(f"{self.http}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server did not become ready; see {log}")

    def gauge(self) -> float:
        found = GAUGE.search(httpx.get(f"{self.http}/metrics", timeout=5).content)
        return float(found.group(1)) if found else 0.0

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)
        self._log.close()


def unary(server: Server, channel: grpc.Channel, image: bytes) -> int:
    reply = pb_grpc.EncoderStub(channel).EncodeImages(pb.EncodeImagesRequest(images=[image]), timeout=300)
    return sum(len(e.data) for e in reply.embeddings)


def stream(server: Server, channel: grpc.Channel, image: bytes) -> int:
    chunks = pb_grpc.EncoderStub(channel).EncodeImagesStream(pb.EncodeImagesRequest(images=[image]), timeout=300)
    return sum(len(c.data) for c in chunks)


def http(server: Server, channel: grpc.Channel, image: bytes) -> int:
    body = {"images": [base64.b64encode(image).decode()], "return_embeddings": True}
    reply = httpx.post(f"{server.http}/v1/encode", json=body, timeout=300)
    reply.raise_for_status()
    return sum(len(base64.b64decode(e["data"])) for e in reply.json()["embeddings"])


SENDERS: tuple[Callable[[Server, grpc.Channel, bytes], int], ...] = (unary, stream, http)


def load(
    server: Server, images: list[bytes], clients: int, requests: int, senders: Sequence[Callable[..., int]]
) -> tuple[collections.Counter, float]:
    """`clients` threads, `requests` each, `senders` (front ends) in turn; (codes, seconds)."""
    codes: collections.Counter = collections.Counter()
    options = [("grpc.max_receive_message_length", MESSAGE_BYTES)]

    def client(c: int) -> None:
        with grpc.insecure_channel(server.grpc, options=options) as channel:
            for r in range(requests):
                send = senders[(c + r) % len(senders)]
                try:
                    send(server, channel, images[(c * requests + r) % len(images)])
                    codes[f"{send.__name__} OK"] += 1
                except grpc.RpcError as exc:
                    codes[f"{send.__name__} {exc.code().name}"] += 1
                except httpx.HTTPError as exc:
                    codes[f"{send.__name__} {type(exc).__name__}"] += 1

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return codes, time.perf_counter() - started


def one_run(model: Path, budget: str, images: list[bytes], args: argparse.Namespace, log: Path) -> str:
    server = Server(model, budget, args.source == "cache", args.server_args.split(), log)
    try:
        with grpc.insecure_channel(server.grpc, options=[("grpc.max_receive_message_length", MESSAGE_BYTES)]) as ch:
            for image in images:  # into the cache (when on), before the baseline
                unary(server, ch, image)
            for send in SENDERS:  # every front end's first-use allocations, too
                send(server, ch, images[0])
        pid = server.process.pid
        time.sleep(1)
        idle = status_mb(pid, "VmRSS")
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS now
        most, stop = [0.0], threading.Event()

        def sample() -> None:
            while not stop.is_set():
                most[0] = max(most[0], server.gauge())
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        senders = [next(s for s in SENDERS if s.__name__ == name) for name in args.front_ends.split(",")]
        codes, seconds = load(server, images, args.clients, args.requests, senders)
        stop.set()
        sampler.join()
        peak = status_mb(pid, "VmHWM")
        images_per_s = sum(n for code, n in codes.items() if code.endswith(" OK")) / seconds
        return (
            f"| {budget} | {idle} | +{peak - idle} | {most[0] / 2**20:.0f} | {images_per_s:.1f} | "
            f"{', '.join(f'{k} {v}' for k, v in sorted(codes.items()))} |"
        )
    finally:
        server.stop()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reply_budget", description=__doc__.split("\n")[0])
    p.add_argument("--budgets", default="default,1048576", help="--max-reply-mb values, comma-separated")
    p.add_argument("--source", choices=("cache", "encode"), default="cache", help="replies from the cache or encoded")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--front-ends", default="unary,stream,http", help="taken in turn, comma-separated")
    p.add_argument("--server-args", default="", help="more `mmproc serve` flags, e.g. '--host-malloc-reuse-mb 0'")
    p.add_argument("--requests", type=int, default=6, help="requests per client")
    p.add_argument("--rounds", type=int, default=2, help="fresh servers per budget, budgets interleaved")
    p.add_argument("--model-path", type=Path, default=None, help="checkpoint to serve (default: written to a temp dir)")
    p.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()), help="where the server logs go")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    with tempfile.TemporaryDirectory(prefix="mmproc-reply-") as tmp:
        model = args.model_path or Path(tmp) / "ckpt7168"
        if args.model_path is None:
            write_model(model)
        spec = ImageSpec(resolutions=((1024, 1024),))
        images = [r[0] for r in generate_requests(0, range(8), 1, spec, max_bytes=64 << 20)]
        print(f"{args.clients} clients x {args.requests} requests (one 1024² JPEG each: unary, stream, HTTP in turn), "
              f"replies from {'the cache' if args.source == 'cache' else 'the encoder'}")  # fmt: skip
        print("\n| --max-reply-mb | idle RSS (MB) | peak over idle (MB) | most reply MB in flight | images/s | codes |")
        print("| --- | ---: | ---: | ---: | ---: | --- |")
        for round_ in range(args.rounds):
            for budget in args.budgets.split(","):
                log = args.logs / f"reply_budget_{args.source}_{budget}_{round_}.log"
                print(one_run(model, budget, images, args, log), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
