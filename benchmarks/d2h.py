"""The serialized path's yardstick and its stages.

`transport_microbench` (CUDA): pinned vs pageable device<->host copy bandwidth, timed with CUDA events, then
`serialized_stages` against the pinned D2H figure of the same run. `serialized_stages` (CUDA or CPU) times the
production code of the serialized transport on N MB of bf16 embeddings split into 4 images. On the CPU the
embeddings already lie in host memory, so there is no D2H; everything after it is real, and a host memcpy of
the same size stands in for the pinned D2H yardstick.

`python -m benchmarks.d2h --device cpu|cuda:0 --mb 20 --reps 20 [--rounds N] [--json FILE]` prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from mmproc.client.rpc import Assembler
from mmproc.transport.serialized.pinned_messages import PinnedMessages
from mmproc.transport.serialized.staging import start_staging
from mmproc.units import MiB
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.chunks import read_chunk
from mmproc.wire.serialized import passthrough_serializer, serialized_payloads, serialized_reply, serialized_stream
from service.app.host_memory import reuse_freed_host_memory, set_torch_threads
from service.app.settings import CUDA_HOST_MALLOC_REUSE_MB, STREAM_CHUNK_MB, ServerSettings
from service.pipeline.reply_budget import ReplyBudgetConfig
from service.pipeline.requests import EncodedImage


def _copy_ms(src: torch.Tensor, dst: torch.Tensor, reps: int) -> float:
    """Median ms of `dst.copy_(src)` timed with CUDA events (3 untimed copies first)."""
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def transport_microbench(
    device: str, megabytes: int, reps: int, *, chunk_bytes: int = STREAM_CHUNK_MB * MiB, rounds: int = 1
) -> dict:
    """Pinned vs pageable device->host copy (and host->device) of one `megabytes` MB uint8 tensor, then the
    serialized path's stages (`serialized_stages`, `rounds` rounds) on the same GPU, each against the pinned D2H
    measured again in its own round."""
    nbytes = megabytes * 10**6
    dev = torch.device(device if torch.device(device).type == "cuda" else "cuda")
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(7)
    hosts = {
        "pinned": torch.empty(nbytes, dtype=torch.uint8, pin_memory=True),
        "pageable": torch.empty(nbytes, dtype=torch.uint8),
    }
    rows = []
    for direction in ("d2h", "h2d"):
        for kind, host in hosts.items():
            src, dst = (gpu, host) if direction == "d2h" else (host, gpu)
            with torch.cuda.device(dev):  # events and copy on that GPU's current stream
                ms = _copy_ms(src, dst, reps)
            rows.append({"direction": direction, "host_memory": kind, "ms": ms, "gb_per_s": nbytes / ms / 1e6})

    def pinned_d2h_gb_per_s() -> float:
        with torch.cuda.device(dev):
            return nbytes / _copy_ms(gpu, hosts["pinned"], reps) / 1e6

    stages = serialized_stages(str(dev), megabytes, reps, chunk_bytes=chunk_bytes, rounds=rounds,
                               reference=("pinned D2H", pinned_d2h_gb_per_s))  # fmt: skip
    return {"bytes": nbytes, "reps": reps, "gpu": torch.cuda.get_device_name(dev), "rows": rows,
            "serialized_target_gb_per_s": 0.5 * rows[0]["gb_per_s"], "serialized": stages}  # fmt: skip


# -- the serialized path, stage by stage ---------------------------------------------------------------------

IMAGES, HIDDEN = 4, 7168  # a Kimi K2.5 reply: 4 images x tokens x 7168 x bf16


def _server_wire(results: list[EncodedImage], chunk_bytes: int, pinned: PinnedMessages | None = None) -> list[bytes]:
    """What the EncodeImagesStream servicer hands gRPC: every message it yields, through the response
    serializer that its handler is registered with."""
    return [passthrough_serializer(m) for m in serialized_stream("bench", results, chunk_bytes, pinned)]


def _client_tensors(wire: Sequence[bytes], device: torch.device) -> list[torch.Tensor]:
    """What EncoderClient does with the messages gRPC received: its response deserializer (`read_chunk`, which
    `encoder_stub` registers), the Assembler, the H2D copy."""
    assembler = Assembler(IMAGES, device)
    for message in wire:
        assembler.add(read_chunk(message))
    return assembler.tensors()


def _median_ms(fn: Callable[[], object], reps: int, sync: Callable[[], None]) -> float:
    """Median wall ms of `fn()` (2 untimed runs first); `sync` waits for the device before and after."""
    times = []
    for i in range(reps + 2):
        sync()
        start = time.perf_counter()
        out = fn()
        sync()
        if i >= 2:
            times.append((time.perf_counter() - start) * 1e3)
        del out  # freed before the next run, as in a server that answers one request after another
    return float(np.median(times))


def _embeddings(dev: torch.device, megabytes: int) -> list[EncodedImage]:
    tokens = max(1, round(megabytes * 10**6 / (IMAGES * HIDDEN * 2)))
    gen = torch.Generator(device=dev).manual_seed(0)
    return [
        EncodedImage(index=i, grid_hw=(2, 2 * tokens), num_tokens=tokens,
                     embedding=torch.randn(tokens, HIDDEN, generator=gen, device=dev).to(torch.bfloat16))
        for i in range(IMAGES)
    ]  # fmt: skip


def _landed(results: list[EncodedImage]) -> list[EncodedImage]:
    """`results` with every embedding staged to the host and waited for (start_staging, all D2H landed)."""
    staged = start_staging([r.embedding for r in results])
    return [replace(r, embedding=s.wait()) for r, s in zip(results, staged)]


def _host_memcpy(nbytes: int, reps: int) -> Callable[[], float]:
    """The CPU's stand-in for the pinned D2H yardstick: GB/s of a host memcpy of `nbytes` (median of `reps`)."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    return lambda: nbytes / _median_ms(lambda: dst.copy_(src), reps, lambda: None) / 1e6


@contextlib.contextmanager
def loopback(
    answer: Callable[[list[bytes]], list[EncodedImage]], chunk_bytes: int, pinned_bytes: int = 0
) -> Iterator[str]:
    """The real gRPC server (`create_server`, its servicer and handlers, the delivery's reply budget and page-locked
    messages of `pinned_bytes`) on 127.0.0.1, in its own thread and event loop, with an engine that answers a
    request's images with `answer(images)`: the transport alone, no model. Yields the target address."""
    from service.frontends.grpc.server import create_server
    from service.observe.metrics import Metrics
    from service.pipeline.delivery import Delivery
    from service.pipeline.state import ServingState

    metrics = Metrics()
    sample = answer([b"\x00"])[0].embedding

    class FixedPipeline:  # what the servicer uses of service.pipeline.requests.RequestPipeline
        pool = None
        delivery = Delivery(sample.shape[-1], sample.dtype, metrics, ReplyBudgetConfig(pinned_bytes=pinned_bytes))

        def check_door(self, *, sheddable: bool = False) -> None:  # never refuses: the bench measures replies
            pass

        async def encode(self, images, request_id, deadline, *, ipc_session=None, readers=1, **cache_options):
            return answer(images)

    state = ServingState(metrics)
    info = pb.ServerInfo(max_message_bytes=64 * MiB, stream_chunk_bytes=chunk_bytes)
    state.publish(FixedPipeline(), info)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bench-grpc", daemon=True)
    thread.start()
    server, port, _ = asyncio.run_coroutine_threadsafe(
        create_server(state, "127.0.0.1:0", max_message_bytes=64 * MiB), loop
    ).result()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


STAGES = {
    "payloads": "server, HTTP: GPU -> one bytes per image (serialized_payloads)",
    "server_unary": "server, unary gRPC: GPU -> the reply's bytes, as handed to gRPC (serialized_reply)",
    "server_stream": "server, stream: GPU -> the bytes of every message, as handed to gRPC (server staging)",
    "unary_copied": "  server_unary without page-locked messages: staged, then copied into new bytes",
    "stream_copied": "  server_stream without page-locked messages: staged, then copied into new bytes",
    "stream_d2h_only": "  the copied path's D2H and the waits for it alone (start_staging, no copy, no framing)",
    "stream_from_host": "  its framing and copies alone, the embeddings already in pinned host memory",
    "stream_sequential": "  both halves one after the other (what stream_copied saves against it: their overlap)",
    "client_assemble": "client: those bytes -> tensors on the device (deserializer, Assembler, H2D)",
    "in_process": "both, in process (end to end without gRPC)",
    "grpc_loopback": "EncoderClient.encode_images over loopback gRPC (real server and client, no model)",
}


def serialized_stages(
    device: str,
    megabytes: int,
    reps: int,
    *,
    chunk_bytes: int = STREAM_CHUNK_MB * MiB,
    rounds: int = 1,
    reference: tuple[str, Callable[[], float]] | None = None,
) -> dict:
    """Median ms and GB/s of each stage of the serialized transport for `megabytes` MB of bf16 embeddings in
    4 images (4 x tokens x 7168) on `device`, and each stage's bandwidth as a fraction of `reference`
    ((name, a function measuring its GB/s); default: a host memcpy of the same size, the CPU stand-in for pinned D2H).

    In each of `rounds` rounds the reference and then every stage are measured (median of `reps` each); a stage's
    figures are the medians over the rounds, its fraction the median of its rounds' fractions. A host's speed
    drifts by tens of percent from one minute to the next (docs/benchmarks/transport.md): a stage is compared
    with the reference measured beside it, not minutes apart."""
    from mmproc.client import EncoderClient

    dev = torch.device(device)
    results = _embeddings(dev, megabytes)
    nbytes = sum(r.embedding.nbytes for r in results)
    pinned_bytes = ServerSettings(device=device).pinned_reply_bytes  # as the server's default (0 on the CPU)
    pinned = PinnedMessages(pinned_bytes) if pinned_bytes else None

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    name, measure_reference = reference or ("host memcpy", _host_memcpy(nbytes, reps))
    wire = _server_wire(results, chunk_bytes)
    # The copied stream's two halves timed apart (their sum against stream_copied: how much of them overlaps)
    on_gpu = dev.type == "cuda"
    on_host = [replace(r, embedding=r.embedding.cpu().pin_memory() if on_gpu else r.embedding) for r in results]
    for got, want in zip(_client_tensors(wire, dev), results):  # the stages move the right bytes
        assert torch.equal(got.view(torch.int16), want.embedding.view(torch.int16)), "serialized stages corrupt data"
    assert _server_wire(results, chunk_bytes, pinned) == wire, "page-locked messages corrupt data"
    fns: dict[str, Callable[[], object]] = {
        "payloads": lambda: serialized_payloads(results),
        "server_unary": lambda: serialized_reply("bench", results, pinned),
        "server_stream": lambda: _server_wire(results, chunk_bytes, pinned),
        "unary_copied": lambda: serialized_reply("bench", results),
        "stream_copied": lambda: _server_wire(results, chunk_bytes),
        "stream_d2h_only": lambda: [staged.wait() for staged in start_staging([r.embedding for r in results])],
        "stream_from_host": lambda: _server_wire(on_host, chunk_bytes),
        "stream_sequential": lambda: _server_wire(_landed(results), chunk_bytes),
        "client_assemble": lambda: _client_tensors(wire, dev),
        "in_process": lambda: _client_tensors(_server_wire(results, chunk_bytes), dev),
    }
    images = [b"\xff"] * IMAGES  # never decoded: the engine answers with `results`
    references: list[float] = []
    times: dict[str, list[float]] = {name: [] for name in STAGES}
    with (
        loopback(lambda images: results, chunk_bytes, pinned_bytes) as target,
        EncoderClient(target, device=dev, transport="serialized") as c,
    ):
        fns["grpc_loopback"] = lambda: c.encode_images(images)
        for _ in range(rounds):
            references.append(measure_reference())
            for stage, fn in fns.items():
                times[stage].append(_median_ms(fn, reps, sync))
    rows = []
    for stage, ms in times.items():
        fractions = [nbytes / t / 1e6 / ref for t, ref in zip(ms, references)]
        rows.append({"stage": stage, "what": STAGES[stage], "ms": float(np.median(ms)), "ms_min": min(ms),
                     "ms_max": max(ms), "gb_per_s": nbytes / float(np.median(ms)) / 1e6,
                     "fraction_of_reference": float(np.median(fractions)),
                     "fraction_min": min(fractions), "fraction_max": max(fractions)})  # fmt: skip
    by_stage = {row["stage"]: row for row in rows}
    return {
        "device": str(dev), "bytes": nbytes, "images": IMAGES, "hidden": HIDDEN, "chunk_bytes": chunk_bytes,
        "messages": len(wire), "reps": reps, "rounds": rounds,
        "reference": {"name": name, "gb_per_s": float(np.median(references)), "per_round": references},
        "rows": rows,
        "server_staging_gb_per_s": by_stage["server_stream"]["gb_per_s"],
        "server_staging_fraction": by_stage["server_stream"]["fraction_of_reference"],
        "end_to_end_in_process_gb_per_s": by_stage["in_process"]["gb_per_s"],
    }  # fmt: skip


def stages_markdown(stages: dict) -> str:
    ref, rounds = stages["reference"], stages["rounds"]
    spread = rounds > 1  # min..max over the rounds, beside the medians
    lines = [
        f"# Serialized path: {stages['bytes'] / 1e6:.1f} MB of bf16 in {stages['images']} images on "
        f"{stages['device']}, {stages['messages']} stream messages of <= {stages['chunk_bytes'] / MiB:g} MiB "
        f"(median of {stages['reps']}"
        + (f"; then the median of {rounds} rounds, each against its own {ref['name']})" if spread else ")"),
        "",
        f"| stage | what | ms | GB/s | x {ref['name']} ({ref['gb_per_s']:.1f} GB/s) |"
        + (" rounds: x min..max |" if spread else ""),
        "| --- | --- | ---: | ---: | ---: |" + (" --- |" if spread else ""),
    ]
    for r in stages["rows"]:
        line = (
            f"| {r['stage']} | {r['what']} | {r['ms']:.3f} | {r['gb_per_s']:.2f} | {r['fraction_of_reference']:.3f} |"
        )
        lines.append(line + (f" {r['fraction_min']:.3f}..{r['fraction_max']:.3f} |" if spread else ""))
    lines += ["", f"server staging (GPU -> wire-ready bytes): {stages['server_staging_gb_per_s']:.2f} GB/s = "
              f"{stages['server_staging_fraction']:.3f} x {ref['name']}; "
              f"end to end in process: {stages['end_to_end_in_process_gb_per_s']:.2f} GB/s; "
              f"target: >= 0.5 x {ref['name']}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--mb", type=int, default=20, help="embedding megabytes (10^6) per reply")
    parser.add_argument("--reps", type=int, default=20, help="repetitions per stage (median reported)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of every stage, each with the reference measured again beside it")  # fmt: skip
    parser.add_argument(
        "--chunk-mb", type=int, default=STREAM_CHUNK_MB, help="stream chunk size in MiB (the server's default)"
    )
    parser.add_argument("--json", type=Path, help="write the record here")
    parser.add_argument("--host-malloc-reuse-mb", type=int, default=CUDA_HOST_MALLOC_REUSE_MB,
                        help="as the server's setting (0: glibc defaults)")  # fmt: skip
    parser.add_argument("--torch-threads", type=int, default=ServerSettings.model_fields["torch_threads"].default,
                        help="as the server's setting (0: torch's default)")  # fmt: skip
    args = parser.parse_args(argv)
    reuse_freed_host_memory(args.host_malloc_reuse_mb * MiB)  # what `mmproc serve` does at start-up
    set_torch_threads(args.torch_threads)
    if torch.device(args.device).type == "cuda":
        record = transport_microbench(
            args.device, args.mb, args.reps, chunk_bytes=args.chunk_mb * MiB, rounds=args.rounds
        )
        stages = record["serialized"]
        print(
            f"# D2H/H2D copy of {record['bytes'] / 1e6:.0f} MB on {record['gpu']} (median of {args.reps}, CUDA events)"
        )
        print("\n| direction | host memory | ms | GB/s |\n| --- | --- | ---: | ---: |")
        for r in record["rows"]:
            print(f"| {r['direction']} | {r['host_memory']} | {r['ms']:.3f} | {r['gb_per_s']:.1f} |")
        print()
    else:
        record = stages = serialized_stages(
            args.device, args.mb, args.reps, chunk_bytes=args.chunk_mb * MiB, rounds=args.rounds
        )
    print(stages_markdown(stages), end="")
    if args.json is not None:
        from mmproc.bench.serve_stats import environment

        env = environment(argv, args.device)
        env["command"] = ["python", "-m", "benchmarks.d2h", *(sys.argv[1:] if argv is None else argv)]
        record = {"bench": "d2h", "environment": env, **record}
        args.json.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
