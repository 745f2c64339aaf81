"""A consumer process for the CUDA IPC tests: `python -m tests.support.ipc_consumer MODE TARGET [ARGS]`.

Modes (each prints one JSON line per event on stdout):
  compare N        N requests over IPC and the same over serialized; bit-equal? handle-cache counters.
  hold             encode, keep the zero-copy views open and sleep (the test kills it with SIGKILL).
  slow             encode, keep the views, print their checksum, wait for a line on stdin, print it again.
  loop N           N requests, retrying UNAVAILABLE (the test restarts the server meanwhile).
  async N          N requests through AsyncEncoderClient (IPC in a worker thread) vs the blocking serialized client.
  owner N UUID     rank 0 of a TP group of N on the GPU with that UUID: encode_images_shared(readers=N), print
                   the bytes for the peers (hex), read rank 0's views, hold them until a stdin line, ack and
                   release, then stay alive (its session owns the lease) until another stdin line.
  fetch N SIZE     keep 4 SIZExSIZE images under keys, then fetch them N times over IPC and over serialized (what
                   the vLLM connector does): bit-equal? ms per image (median), bytes per image, handle-cache counters.
  peer R UUID      rank R on the GPU with that UUID: read the hex bytes from stdin, read_shared, hold the views
                   until a stdin line, ack, stay alive until another stdin line.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time

import torch

from mmproc.client import AsyncEncoderClient, EncoderClient, SharedEmbeddings
from mmproc.errors import UnavailableError
from mmproc.transport.cuda_ipc.runtime import device_index_by_uuid, device_uuid
from mmproc.transport.serialized.staging import tensor_to_bytes
from tests.support.media_samples import make_image_bytes


def images(seed: int, count: int = 2, size: int = 224) -> list[bytes]:
    return [make_image_bytes(size + 28 * i, size, fmt="PNG", seed=seed * 31 + i) for i in range(count)]


def digest(tensors: list[torch.Tensor]) -> str:
    torch.cuda.synchronize()
    return hashlib.sha256(b"".join(tensor_to_bytes(t.cpu()) for t in tensors)).hexdigest()


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


def rank_device(uuid: str) -> str:
    """This process's GPU, found by UUID (CUDA_VISIBLE_DEVICES may order the GPUs differently in every rank);
    made current first, so that nothing defaults to device 0, which may be the encoder's GPU."""
    index = device_index_by_uuid(uuid)
    assert index is not None, (
        f"GPU {uuid} is not visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})"
    )
    torch.cuda.set_device(index)
    return f"cuda:{index}"


def fanout_rank(mode: str, target: str, argv: list[str]) -> None:
    device = rank_device(argv[1])
    with EncoderClient(target, device=device, transport="ipc", timeout=60) as client:
        if mode == "owner":
            data = images(5, count=4, size=448)
            with EncoderClient(target, device=device, transport="serialized", timeout=60) as plain:
                want = digest(plain.encode_images(data))
            shared = client.encode_images_shared(data, readers=int(argv[0]))
            emit(mode=mode, state="shared", blob=shared.to_bytes().hex(), transport=shared.transport, want=want,
                 pid=os.getpid())  # fmt: skip
            rank = 0
        else:
            rank = int(argv[0])
            shared = SharedEmbeddings.from_bytes(bytes.fromhex(sys.stdin.readline().strip()))
        with client.read_shared(shared, rank) as views:
            emit(mode=mode, rank=rank, state="holding", digest=digest(views), pid=os.getpid(),
                 view_gpu=device_uuid(views[0].device.index), **client.ipc_stats)  # fmt: skip
            sys.stdin.readline()
        torch.cuda.synchronize()  # the ack is on the device before we say so
        emit(mode=mode, rank=rank, state="acked", **client.ipc_stats)
        sys.stdin.readline()  # rank 0's session owns the lease: it must outlive the others' reads


async def async_compare(target: str, count: int) -> dict:
    equal = True
    async with AsyncEncoderClient(target, device="cuda:0", transport="ipc", timeout=60) as client:
        with EncoderClient(target, device="cuda:0", transport="serialized", timeout=60) as plain:
            for i in range(count):
                data = images(i % 17)
                got, want = await client.encode_images(data), plain.encode_images(data)
                equal &= all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, want))
                equal &= all(t.device.type == "cuda" for t in got)
        return {"equal": equal, "requests": count, **client.ipc_stats}


def fetch_compare(ipc: EncoderClient, target: str, count: int, size: int) -> dict:
    """Results kept by key, fetched as `mmproc.engines.vllm`'s worker does, over both transports."""
    data = [make_image_bytes(size, size, fmt="JPEG", seed=40 + i) for i in range(4)]
    keys = [f"fetch-bench-{size}-{i}" for i in range(len(data))]
    with EncoderClient(target, device="cuda:0", transport="serialized", timeout=60) as plain:
        plain.keep(data, keys)
        timings: dict[str, list[float]] = {"ipc": [], "serialized": []}
        equal, on_gpu = True, True
        for _ in range(count):
            fetched = {}
            for name, client in (("ipc", ipc), ("serialized", plain)):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fetched[name] = [r.tensor for r in client.fetch(keys)]
                torch.cuda.synchronize()
                timings[name].append((time.perf_counter() - t0) * 1e3 / len(keys))
            equal &= all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(*fetched.values()))
            on_gpu &= all(t.device.type == "cuda" for t in fetched["ipc"])
    nbytes = fetched["ipc"][0].numel() * fetched["ipc"][0].element_size()
    median = {f"{k}_ms_per_image": sorted(v)[len(v) // 2] for k, v in timings.items()}
    return {"equal": equal, "on_gpu": on_gpu, "size": size, "bytes_per_image": nbytes, "fetches": count, **median}


def main(argv: list[str]) -> int:
    mode, target = argv[0], argv[1]
    if mode in ("owner", "peer"):
        fanout_rank(mode, target, argv[2:])
        return 0
    if mode == "async":
        emit(mode=mode, **asyncio.run(async_compare(target, int(argv[2]))))
        return 0
    device = "cuda:0"
    with EncoderClient(target, device=device, transport="ipc", timeout=60) as ipc:
        if mode == "compare":
            count = int(argv[2])
            with EncoderClient(target, device=device, transport="serialized", timeout=60) as plain:
                equal = True
                for i in range(count):
                    data = images(i % 17)
                    got, want = ipc.encode_images(data), plain.encode_images(data)
                    equal &= all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, want))
                    equal &= all(t.device.type == "cuda" for t in got)
            emit(mode=mode, equal=equal, requests=count, **ipc.ipc_stats)
        elif mode == "fetch":
            emit(mode=mode, **fetch_compare(ipc, target, int(argv[2]), int(argv[3])), **ipc.ipc_stats)
        elif mode in ("hold", "slow"):
            with ipc.encode_images_view(images(5, count=4, size=448)) as views:
                before = digest(views)
                emit(mode=mode, state="holding", digest=before, **ipc.ipc_stats)
                if mode == "hold":
                    time.sleep(3600)
                sys.stdin.readline()
                emit(mode=mode, state="after", digest=digest(views), unchanged=digest(views) == before)
        elif mode == "loop":
            # Says "started" once the first pool served it (the test restarts the server only then), and at the
            # end which pools served it, in order.
            count, done, retries = int(argv[2]), 0, 0
            reference, pools = None, []
            while done < count:
                try:
                    got = digest(ipc.encode_images(images(3)))
                except UnavailableError:
                    retries += 1
                    time.sleep(0.2)
                    continue
                reference = reference or got
                assert got == reference, "a reopened pool returned different values"
                pool = ipc.ipc_pool_id
                if not pools or pools[-1] != pool:
                    pools.append(pool)
                if done == 0:
                    emit(mode=mode, state="started", pool=pool, **ipc.ipc_stats)
                done += 1
                time.sleep(0.01)
            emit(mode=mode, state="done", done=done, retries=retries, pools=pools, **ipc.ipc_stats)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
