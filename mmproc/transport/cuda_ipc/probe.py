"""Start-up probe, the producer's half of the same-node check: can a child process map our pool, read and write?"""

from __future__ import annotations

import logging
import multiprocessing as mp

import torch

from mmproc.transport.cuda_ipc import runtime as cuda_ipc
from mmproc.transport.cuda_ipc.pool import IpcPool, PoolIdentity

logger = logging.getLogger(__name__)

_MAGIC = 0x6D6D70726F63  # "mmproc"


def _child(identity: PoolIdentity, queue: mp.Queue) -> None:
    try:
        from mmproc.transport.cuda_ipc.consumer import OpenedPool

        index = cuda_ipc.device_index_by_uuid(identity.device_uuid)
        if index is None:
            queue.put("the child process cannot see the pool's GPU")
            return
        pool = OpenedPool(identity, torch.device("cuda", index))
        probe = pool.memory[identity.data_offset : identity.data_offset + 8].view(torch.int64)
        seen = int(probe.item())
        probe.fill_(seen + 1)
        torch.cuda.synchronize(index)
        pool.close()
        queue.put("ok" if seen == _MAGIC else f"the child read {seen:#x}, expected {_MAGIC:#x}")
    except Exception as exc:  # reported to the parent, which logs it
        queue.put(f"{type(exc).__name__}: {exc}")


def probe_pool(pool: IpcPool, timeout_s: float = 60.0) -> str | None:
    """None when a child process opened, read and wrote the pool; else the reason it could not."""
    start = pool.identity.data_offset
    cell = pool.memory[start : start + 8].view(torch.int64)
    cell.fill_(_MAGIC)
    torch.cuda.synchronize(pool.device)
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(pool.identity, queue), daemon=True)
    child.start()
    try:
        answer = queue.get(timeout=timeout_s)
    except Exception:
        answer = f"the probe process gave no answer within {timeout_s:.0f} s"
    child.join(10)
    if child.is_alive():
        child.kill()
    if answer == "ok" and int(cell.item()) != _MAGIC + 1:
        answer = "the child's write did not reach the pool"
    cell.zero_()
    torch.cuda.synchronize(pool.device)
    return None if answer == "ok" else answer
