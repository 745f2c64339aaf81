"""A consumer process for the CUDA IPC tests: `python -m tests.ipc_consumer MODE TARGET [ARGS]`.

Modes (each prints one JSON line per event on stdout):
  compare N        N requests over IPC and the same over serialized; bit-equal? handle-cache counters.
  hold             encode, keep the zero-copy views open and sleep (the test kills it with SIGKILL).
  slow             encode, keep the views, print their checksum, wait for a line on stdin, print it again.
  loop N           N requests, retrying UNAVAILABLE (the test restarts the server meanwhile).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

import torch

from mmproc.client import EncoderClient
from mmproc.errors import UnavailableError
from mmproc.transport import tensor_to_bytes
from tests.media_samples import make_image_bytes


def images(seed: int, count: int = 2, size: int = 224) -> list[bytes]:
    return [make_image_bytes(size + 28 * i, size, fmt="PNG", seed=seed * 31 + i) for i in range(count)]


def digest(tensors: list[torch.Tensor]) -> str:
    torch.cuda.synchronize()
    return hashlib.sha256(b"".join(tensor_to_bytes(t.cpu()) for t in tensors)).hexdigest()


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


def main(argv: list[str]) -> int:
    mode, target = argv[0], argv[1]
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
        elif mode in ("hold", "slow"):
            with ipc.encode_images_view(images(5, count=4, size=448)) as views:
                before = digest(views)
                emit(mode=mode, state="holding", digest=before, **ipc.ipc_stats)
                if mode == "hold":
                    time.sleep(3600)
                sys.stdin.readline()
                emit(mode=mode, state="after", digest=digest(views), unchanged=digest(views) == before)
        elif mode == "loop":
            count, done, retries = int(argv[2]), 0, 0
            reference = None
            while done < count:
                try:
                    got = digest(ipc.encode_images(images(3)))
                except UnavailableError:
                    retries += 1
                    time.sleep(0.2)
                    continue
                reference = reference or got
                assert got == reference, "a reopened pool returned different values"
                done += 1
                time.sleep(0.01)
            emit(mode=mode, done=done, retries=retries, **ipc.ipc_stats)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
