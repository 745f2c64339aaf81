"""The load of `bench serve --mode open`: unique images, the three kinds of client (Python client, raw stub,
HTTP), closed and open loops, each request's outcome."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time

import numpy as np

from mmproc.bench.images import ImageSpec, generate_requests
from mmproc.priority import BATCH, PRIORITY_HEADER

KINDS = ("client", "stub", "http")


OVER_CODES = ("DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED")


@dataclasses.dataclass
class Outcome:
    kind: str
    start: float  # perf_counter seconds
    end: float
    code: str  # gRPC code name (HTTP statuses mapped to theirs)
    retry_after: bool = False  # a refusal that said when to come back (Retry-After / RetryInfo)
    deadline_s: float | None = None
    back_off_s: float = 0.0  # the Python client's refusal: the server's retry-after, which a closed loop honours
    batch: bool = False  # sent as batch work (x-mmproc-priority: batch)


def unique_jpeg(jpeg: bytes, index: int) -> bytes:
    """The same picture with a COM segment naming `index`: other bytes, same pixels (defeats content caches)."""
    text = f"mmproc-bench {index}".encode()
    return jpeg[:2] + b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text + jpeg[2:]


def _status_name(http_status: int) -> str:
    return {200: "OK", 400: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE",
            504: "DEADLINE_EXCEEDED", 500: "INTERNAL"}.get(http_status, f"HTTP_{http_status}")  # fmt: skip


class Load:
    """The three kinds of client of one run, on the running loop."""

    def __init__(self, args) -> None:
        import grpc

        from mmproc.client import AsyncEncoderClient
        from mmproc.v1 import encoder_pb2_grpc as pb_grpc

        self.args = args
        self.client = AsyncEncoderClient(args.target, transport="serialized", timeout=args.deadline_s)
        self.batch_client = AsyncEncoderClient(
            args.target, transport="serialized", timeout=args.deadline_s, priority=BATCH
        )
        self.channel = grpc.aio.insecure_channel(args.target, options=[("grpc.max_receive_message_length", 64 << 20)])
        self.stub = pb_grpc.EncoderStub(self.channel)
        self.http = self.http_address(args)

    @staticmethod
    def http_address(args) -> tuple[str, int]:
        host, _, port = args.http_target.removeprefix("http://").rpartition(":")
        return host, int(port)

    async def close(self) -> None:
        await self.client.close()
        await self.batch_client.close()
        await self.channel.close()

    async def one(self, kind: str, image: bytes, batch: bool = False) -> Outcome:
        start = time.perf_counter()
        deadline = self.args.deadline_s
        back_off = 0.0
        if kind == "client":
            code, back_off = await self._client(image, batch)
            hint = back_off > 0
        elif kind == "stub":
            code, hint = await self._stub(image, batch)
        else:
            code, hint = await self._http(image, batch)
            deadline = self.args.http_timeout_ms / 1000 if self.args.http_timeout_ms else None
        return Outcome(kind, start, time.perf_counter(), code, hint, deadline, back_off, batch)

    async def _client(self, image: bytes, batch: bool) -> tuple[str, float]:
        from mmproc.errors import MmprocError, ResourceExhaustedError

        client = self.batch_client if batch else self.client
        try:
            await client.encode_images([image], timeout=self.args.deadline_s)
            return "OK", 0.0
        except ResourceExhaustedError as err:
            return err.grpc_code, err.retry_after_s or 0.0
        except MmprocError as err:
            return err.grpc_code, 0.0

    async def _stub(self, image: bytes, batch: bool) -> tuple[str, bool]:
        import grpc
        from google.rpc import error_details_pb2, status_pb2

        from mmproc.v1 import encoder_pb2 as pb

        request = pb.EncodeImagesRequest(images=[image], transport=pb.TRANSPORT_SERIALIZED)
        try:
            await self.stub.EncodeImages(request, timeout=self.args.deadline_s, metadata=_priority(batch))
            return "OK", False
        except grpc.aio.AioRpcError as err:
            hint = False
            for key, value in err.trailing_metadata() or ():
                if key == "grpc-status-details-bin":
                    status = status_pb2.Status.FromString(value)
                    hint = any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details)
            return err.code().name, hint

    async def _http(self, image: bytes, batch: bool) -> tuple[str, bool]:
        body = json.dumps({"images": [base64.b64encode(image).decode()]}).encode()
        head = f"POST /v1/encode HTTP/1.1\r\nHost: {self.http[0]}\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(body)}\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in _priority(batch))
        if self.args.http_timeout_ms:
            head += f"x-mmproc-timeout-ms: {self.args.http_timeout_ms}\r\n"
        try:
            reader, writer = await asyncio.open_connection(*self.http)
            writer.write(head.encode() + b"\r\n" + body)
            response = await asyncio.wait_for(reader.read(), timeout=self.args.http_wait_s)
            writer.close()
        except (OSError, asyncio.TimeoutError) as exc:
            return type(exc).__name__, False
        status_line, _, rest = response.partition(b"\r\n")
        headers = rest.split(b"\r\n\r\n", 1)[0].lower()
        status = int(status_line.split()[1]) if len(status_line.split()) > 1 else 0
        return _status_name(status), b"\nretry-after:" in b"\n" + headers


def _priority(batch: bool) -> tuple[tuple[str, str], ...]:
    return ((PRIORITY_HEADER, BATCH),) if batch else ()


async def closed_loop(load: Load, base: list[bytes], first: int, seconds: float, workers: int) -> list[Outcome]:
    """`workers` Python clients back to back for `seconds` (a refused one after the server's retry-after); request k
    sends image `first + k` (unique)."""
    out: list[Outcome] = []
    stop = time.perf_counter() + seconds
    counter = iter(range(first, first + 10**9))

    async def worker() -> None:
        while time.perf_counter() < stop:
            k = next(counter)
            outcome = await load.one("client", unique_jpeg(base[k % len(base)], k))
            out.append(outcome)
            # A refused client comes back when the server said (at most 1 s), as a well-behaved one does; sent
            # again at once, refusals would measure how fast the server refuses, not its capacity.
            await asyncio.sleep(min(1.0, outcome.back_off_s))

    await asyncio.gather(*(worker() for _ in range(workers)))
    return out


async def open_loop(
    load: Load, images: list[bytes], rate: float, seconds: float, seed: int, batch_fraction: float = 0.0
) -> list[asyncio.Task]:
    """Poisson arrivals for `seconds`, each sent as batch work with probability `batch_fraction`; returns the tasks
    (still running when the arrivals stop)."""
    rng = np.random.default_rng([seed, 0x0FE])
    marks = np.random.default_rng([seed, 0xBA7])  # its own stream: the arrival times do not depend on the fraction
    tasks: list[asyncio.Task] = []
    start = time.perf_counter()
    at = 0.0
    while at < seconds:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        i = len(tasks)
        batch = bool(batch_fraction) and marks.random() < batch_fraction
        tasks.append(asyncio.create_task(load.one(KINDS[i % len(KINDS)], images[i % len(images)], batch)))
        at += rng.exponential(1.0 / rate)
    return tasks


def base_images(args) -> list[bytes]:
    """The run's 32 source JPEGs (seeded); every request sends one of them made unique (`unique_jpeg`)."""
    spec = ImageSpec(args.resolutions, "cycle", "jpeg", args.quality)
    return [p[0] for p in generate_requests(args.seed, range(32), 1, spec, max_bytes=1 << 30)]
