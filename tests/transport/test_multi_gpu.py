"""Tensor-parallel fan-out of the CUDA IPC pool across GPUs: the encoder on GPU 0 (in this process), consumer
ranks as separate processes on the other GPUs, each opening the pool with its OWN device.

Needs >= 2 GPUs; skipped otherwise. Run on a multi-GPU host with scripts/gpu_multi_check.sh.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import torch

from tests.support.common import wait_until
from tests.support.ipc import consumer, next_event, pool_stats, start_ipc_server
from tests.support.server import ServiceThread

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(GPUS < 2, reason=f"needs >= 2 GPUs for cross-GPU fan-out; this host has {GPUS}"),
]


def start(**overrides: object) -> ServiceThread:
    return start_ipc_server(**{"ipc_pool_mb": 64, **overrides})


@pytest.fixture
def server() -> Iterator[ServiceThread]:
    srv = start()
    yield srv
    srv.stop()


def uuid(index: int) -> str:
    from mmproc.transport.cuda_ipc.runtime import device_uuid

    return device_uuid(index)


def visible_orders() -> list[str]:
    """This process's GPU list and the same list reversed: ranks alternate between the two orderings, so a
    local index means a different GPU in neighbouring ranks (they must find their GPU by UUID)."""
    base = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(str(i) for i in range(GPUS))
    items = [item.strip() for item in base.split(",") if item.strip()][:GPUS]
    return [",".join(items), ",".join(reversed(items))]


def rank_plan() -> list[tuple[str, str]]:
    """(GPU uuid, CUDA_VISIBLE_DEVICES) per rank: never the encoder's GPU 0; at least two ranks."""
    others = list(range(1, GPUS))
    count = max(2, len(others))
    orders = visible_orders()
    return [(uuid(others[r % len(others)]), orders[r % 2]) for r in range(count)]


def rank(mode: str, target: str, *args: str, visible: str) -> subprocess.Popen:
    return consumer(mode, target, *args, CUDA_VISIBLE_DEVICES=visible)


def say(proc: subprocess.Popen, line: str = "go") -> None:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def compute_apps() -> set[tuple[int, str]]:
    """(pid, GPU uuid) of every process holding a CUDA context, as nvidia-smi sees them."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    rows = set()
    for line in out.splitlines():
        pid, _, gpu = line.partition(",")
        if pid.strip().isdigit():
            rows.add((int(pid), gpu.strip()))
    return rows


def start_group(srv: ServiceThread, plan: list[tuple[str, str]]) -> tuple[list[subprocess.Popen], dict, list[dict]]:
    """Rank 0 encodes and shares; ranks 1.. read the bytes; every rank reports its views (held)."""
    readers = str(len(plan))
    owner = rank("owner", srv.grpc_target, readers, plan[0][0], visible=plan[0][1])
    shared = next_event(owner, timeout=300)
    assert shared["transport"] == "ipc", shared
    peers = [rank("peer", srv.grpc_target, str(r), gpu, visible=vis) for r, (gpu, vis) in enumerate(plan) if r]
    for peer in peers:
        say(peer, shared["blob"])
    held = [next_event(proc, timeout=300) for proc in [owner, *peers]]
    return [owner, *peers], shared, held


def stop_all(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def test_every_rank_reads_the_slice_on_its_own_gpu_and_reuse_waits_for_all_acks(server: ServiceThread) -> None:
    plan = rank_plan()
    procs, shared, held = start_group(server, plan)
    try:
        contexts = compute_apps()
        for r, event in enumerate(held):
            assert event["state"] == "holding" and event["rank"] == r, event
            assert event["digest"] == shared["want"], f"rank {r} read other values than a serialized encode"
            assert event["view_gpu"] == plan[r][0], f"rank {r}'s views are not on its own GPU"
            assert event["opens"] == 1, event  # one open per process, on its own device
        owner, *peers = procs
        assert pool_stats(server).leases_active == 1

        say(owner)  # rank 0: ack + release; the peers still read
        assert next_event(owner)["state"] == "acked"
        time.sleep(1.0)  # many reclaimer passes
        stats = pool_stats(server)
        assert stats.leases_awaiting_ack == 1 and stats.bytes_in_use > 0, stats
        for i, peer in enumerate(peers):
            say(peer)
            assert next_event(peer)["state"] == "acked"
            if i < len(peers) - 1:
                time.sleep(0.5)
                assert pool_stats(server).bytes_in_use > 0, "the slice was freed before every rank acked"
        assert wait_until(lambda: pool_stats(server).bytes_in_use == 0), pool_stats(server)

        contexts |= compute_apps()
        encoder_gpu = uuid(0)
        pids = {event["pid"] for event in held}
        on_encoder = sorted(pid for pid, gpu in contexts if pid in pids and gpu == encoder_gpu)
        assert not on_encoder, f"consumer ranks {on_encoder} created a CUDA context on the encoder's GPU"
        seen = {pid for pid, _ in contexts} & pids
        if not seen:
            pytest.skip("nvidia-smi lists none of the rank pids (another PID namespace?): context check not possible")
        for event, (gpu, _) in zip(held, plan):
            if event["pid"] in seen:
                assert (event["pid"], gpu) in contexts, f"rank {event['rank']} has no context on its own GPU"
        for proc in procs:
            say(proc)
            assert proc.wait(60) == 0, proc.stderr.read()[-3000:]
    finally:
        stop_all(procs)


def test_a_dead_peer_holds_the_slice_until_the_ttl() -> None:
    srv = start(ipc_ttl_s=6.0)
    plan = rank_plan()[:2]
    procs, _, _ = start_group(srv, plan)
    try:
        owner, peer = procs
        say(owner)
        assert next_event(owner)["state"] == "acked"
        peer.send_signal(signal.SIGKILL)  # rank 1 dies holding its views: its ack never comes
        peer.wait(30)
        time.sleep(2.0)
        assert pool_stats(srv).bytes_in_use > 0, "freed without rank 1's ack"
        assert wait_until(lambda: pool_stats(srv).bytes_in_use == 0, timeout=20), pool_stats(srv)
        assert pool_stats(srv).expired_total == 1
    finally:
        stop_all(procs)
        srv.stop()


def test_owner_death_frees_the_shared_lease_at_once(server: ServiceThread) -> None:
    plan = rank_plan()[:2]
    procs, _, _ = start_group(server, plan)
    try:
        owner, peer = procs
        owner.send_signal(signal.SIGKILL)  # the TP group is going down; rank 0's session ends first
        owner.wait(30)
        assert wait_until(lambda: pool_stats(server).bytes_in_use == 0, timeout=10), pool_stats(server)
        assert pool_stats(server).reclaimed_total == 1 and pool_stats(server).expired_total == 0
    finally:
        stop_all(procs)


def test_single_reader_path_is_unchanged_on_another_gpu(server: ServiceThread) -> None:
    """The plain (one reader) IPC client on GPU 1, with the GPU list reversed: bit-equal to serialized."""
    script = (
        "import json, sys, torch\n"
        "from mmproc.client import EncoderClient\n"
        "from tests.support.ipc_consumer import images, rank_device\n"
        "device = rank_device(sys.argv[2])\n"
        "with EncoderClient(sys.argv[1], device=device, transport='ipc') as ipc, "
        "EncoderClient(sys.argv[1], device=device, transport='serialized') as plain:\n"
        "    equal = all(torch.equal(a, b) for i in range(20) for a, b in zip(ipc.encode_images(images(i)), "
        "plain.encode_images(images(i))))\n"
        "    print(json.dumps({'equal': equal, **ipc.ipc_stats}))\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible_orders()[1]}
    done = subprocess.run(
        [sys.executable, "-c", script, server.grpc_target, uuid(1)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    event = json.loads(done.stdout.strip().splitlines()[-1])
    assert event["equal"] is True and event["opens"] == 1 and event["fallbacks"] == 0, event
    assert wait_until(lambda: pool_stats(server).bytes_in_use == 0), pool_stats(server)
