"""A consumer process for the IPC embedding-cache tests: `python -m tests.support.ipc_cache_consumer MODE TARGET [ARGS]`.

Modes (one JSON line per event on stdout):
  mixed          [A, B] then [A, C, B] over IPC (hits and a miss in one reply: several leases): the hits bit for
                 bit what the first reply gave, everything within bf16 noise of a serialized, cache-bypassing encode
                 of [A, C, B] (bf16 results depend on the batch they were encoded in, so only the cached rows
                 themselves can be compared exactly); the cache status and lease of each image.
  hold_cached    A twice (the second a hit on the cached slice), keep the second reply's views open, sleep (the
                 test kills it with SIGKILL).
  churn N SIZE   N requests of two distinct SIZExSIZE images (more than the pool's cache share), each compared
                 with the serialized bypass; the fallbacks counted.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from mmproc.client import EncoderClient
from mmproc.v1 import encoder_pb2 as pb
from tests.support.ipc_consumer import digest, images

A, B, C = (images(seed, count=1, size=448)[0] for seed in (101, 102, 103))


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


def read_ipc(client: EncoderClient, data: list[bytes]) -> tuple[list[torch.Tensor], list[str], list[int]]:
    """Copies of one IPC reply's embeddings, with each image's cache status and lease id."""
    reply = client._reader.request(data, f"cache-{time.monotonic_ns()}", 60)
    assert reply is not None and reply.embeddings[0].HasField("ipc"), "no IPC reply"
    with client._ipc.read(reply, 60) as views:
        copies = [v.clone() for v in views]
    torch.cuda.synchronize()
    statuses = [pb.CacheStatus.Name(e.cache) for e in reply.embeddings]
    return copies, statuses, [e.ipc.lease_id for e in reply.embeddings]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x.view(torch.int16), y.to(x.device).view(torch.int16)) for x, y in zip(a, b))


def close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Within bf16 noise (another batch means other GEMM shapes and roundings): relative error below 2e-2."""
    return all(
        ((x.float() - y.to(x.device).float()).norm() / y.float().norm().clamp_min(1e-12)).item() < 2e-2
        for x, y in zip(a, b)
    )


def main(argv: list[str]) -> int:
    mode, target = argv[0], argv[1]
    with (
        EncoderClient(target, device="cuda:0", transport="ipc", timeout=60) as ipc,
        EncoderClient(target, device="cuda:0", transport="serialized", timeout=60, cache=False) as plain,
    ):
        if mode == "mixed":
            first, first_status, _ = read_ipc(ipc, [A, B])
            second, second_status, leases = read_ipc(ipc, [A, C, B])
            want = plain.encode_images([A, C, B])
            hits_exact = same([second[0], second[2]], [first[0], first[1]])  # the cached rows, as first given
            emit(mode=mode, first=first_status, second=second_status, leases=len(set(leases)),
                 equal=hits_exact and close(second, want), **ipc.ipc_stats)  # fmt: skip
        elif mode == "hold_cached":
            want = digest(plain.encode_images([A]))
            ipc.encode_images([A])
            with ipc.encode_images_view([A]) as views:
                emit(mode=mode, state="holding", equal=digest(views) == want, **ipc.ipc_stats)
                time.sleep(3600)
        elif mode == "churn":
            count, size, equal = int(argv[2]), int(argv[3]), True
            for i in range(count):
                data = images(200 + i, count=2, size=size)
                equal &= same(ipc.encode_images(data), plain.encode_images(data))
            emit(mode=mode, equal=equal, requests=count, **ipc.ipc_stats)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
