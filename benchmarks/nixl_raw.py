"""The transfer engine alone, no mmproc code: one NIXL WRITE of 20 MB between two processes, both polling without
pause (no progress thread), the consumer seeing the notification. The ceiling of the NIXL transport on this host
(docs/benchmarks/nixl.md).

    UCX_TLS=tcp UCX_NET_DEVICES=lo python3 -m benchmarks.nixl_raw
"""

from __future__ import annotations

import multiprocessing as mp
import time

import torch
from nixl_cu13 import nixl_agent, nixl_agent_config

N = 20 << 20  # bytes per write


def conf():  # noqa: ANN201 - a nixl_agent_config, like mmproc/transport/nixl/engine.py's
    return nixl_agent_config(enable_prog_thread=False, backends=["UCX"])


def consumer(qo: mp.Queue) -> None:
    a = nixl_agent("consumer", conf())
    buf = torch.zeros(N, dtype=torch.uint8)
    a.register_memory(a.get_reg_descs([buf]))
    qo.put((a.get_agent_metadata(), buf.data_ptr()))
    while True:
        n = a.get_new_notifs()
        if n:
            for v in n.values():
                for m in v:
                    if m == b"stop":
                        return
                    qo.put(time.perf_counter())
        time.sleep(0)


def main() -> None:
    ctx = mp.get_context("spawn")
    qo = ctx.Queue()
    p = ctx.Process(target=consumer, args=(qo,))
    p.start()
    a = nixl_agent("producer", conf())
    pool = torch.ones(N, dtype=torch.uint8)
    a.register_memory(a.get_reg_descs([pool]))
    meta, addr = qo.get()
    peer = a.add_remote_agent(meta)
    src = a.get_xfer_descs([(pool.data_ptr(), N, 0)], "DRAM")
    dst = a.get_xfer_descs([(addr, N, 0)], "DRAM")
    ts = []
    for _i in range(12):
        t = time.perf_counter()
        h = a.initialize_xfer("WRITE", src, dst, peer, b"x")
        a.transfer(h)
        while a.check_xfer_state(h) == "PROC":
            time.sleep(0)
        a.release_xfer_handle(h)
        got = qo.get()
        ts.append(got - t)
    ts = sorted(ts[2:])
    print(
        f"20 MB NIXL WRITE + notification, 10 of 12: p50 {ts[len(ts) // 2] * 1e3:.1f} ms  {N / ts[len(ts) // 2] / 1e9:.2f} GB/s  min {ts[0] * 1e3:.1f}",
        flush=True,
    )
    h = a.initialize_xfer("WRITE", src, dst, peer, b"stop")
    a.transfer(h)
    while a.check_xfer_state(h) == "PROC":
        time.sleep(0)
    p.join(5)


if __name__ == "__main__":
    main()
