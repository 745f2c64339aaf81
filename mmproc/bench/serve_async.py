"""`bench serve --client async`: one measured pass on one event loop, `--concurrency` tasks sharing one
`AsyncEncoderClient`; same samples and Phase as the threaded client (no send->reply split)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable

import torch

from mmproc.bench.serve_pass import ClientConfig, Payload, Phase, Progress
from mmproc.bench.serve_server import at_start
from mmproc.bench.serve_stats import Sample


def measure_async(
    label: str,
    cfg: ClientConfig,
    args: argparse.Namespace,
    measured: list[Payload],
    warmup: list[Payload],
    start: Callable[[], object] | None = None,
    metrics: str = "",
) -> Phase:
    """`serve_load.measure` with one AsyncEncoderClient on a fresh event loop in this thread."""
    return asyncio.run(_measure(label, cfg, args, measured, warmup, start, metrics))


async def _measure(label: str, cfg: ClientConfig, args: argparse.Namespace, measured: list[Payload],
                   warmup: list[Payload], start: Callable[[], object] | None, metrics: str) -> Phase:  # fmt: skip
    from mmproc.client import AsyncEncoderClient

    client = AsyncEncoderClient(cfg.target, device=cfg.device, transport=cfg.transport, timeout=cfg.timeout,
                                handle_cache=cfg.handle_cache, cache=cfg.cache)  # fmt: skip
    try:
        if warmup:
            await _burst(client, cfg, warmup, args.concurrency, time.perf_counter() + args.max_seconds, None)
        before = await asyncio.to_thread(at_start, start, metrics)  # the loop stays free while others get ready
        progress = Progress(len(measured), label, sys.stderr.isatty() and not args.quiet)
        t0 = time.perf_counter()
        samples = await _burst(client, cfg, measured, args.concurrency, t0 + args.max_seconds, progress)
        wall = time.perf_counter() - t0
        progress.close()
        ipc = client.ipc_stats
    finally:
        await client.close()
    counts = {"dropped": 0, "late": 0, "not_sent": len(measured) - len(samples)}
    return Phase(samples, wall, t0, counts, ipc, False, [before] if before else [])


async def _burst(client: object, cfg: ClientConfig, payloads: list[Payload], concurrency: int, deadline: float,
                 progress: Progress | None) -> list[Sample]:  # fmt: skip
    """Every payload, `concurrency` at a time, until done or `deadline` (perf_counter) for taking the next one."""
    todo = iter(payloads)
    samples: list[Sample] = []

    async def loop() -> None:
        while time.perf_counter() < deadline and (payload := next(todo, None)) is not None:
            samples.append(await _request(client, cfg, payload))
            if progress is not None:
                progress.tick()

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return samples


async def _request(client, cfg: ClientConfig, payload: Payload) -> Sample:  # noqa: ANN001 (an AsyncEncoderClient)
    """One timed request; `ready`: the embeddings are usable (on CUDA the consumer stream synchronized, off the
    loop, so that the other requests go on meanwhile)."""
    index, images = payload
    device = torch.device(cfg.device)
    start = time.perf_counter()
    try:
        outs = await client.encode_images(images, timeout=cfg.timeout)
        got = time.perf_counter()
        if device.type == "cuda":
            await asyncio.to_thread(torch.cuda.current_stream(device).synchronize)
        ready = time.perf_counter()
    except Exception as exc:  # counted by type; one failed request never stops the run
        return Sample(index, len(images), start, time.perf_counter(), error=type(exc).__name__,
                      message=str(exc)[:300])  # fmt: skip
    out_bytes = sum(t.numel() * t.element_size() for t in outs)
    return Sample(index, len(images), start, ready, None, got, ready, None, out_bytes)
