"""Tensor-parallel fan-out on the CPU: the SharedEmbeddings wire format, the `readers` field, and the serialized
fallback of `encode_images_shared` / `read_shared` against the tiny server. The IPC side is tests/transport/test_multi_gpu.py."""

from __future__ import annotations

import dataclasses
import json
import queue
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
import torch

from mmproc.client import EncoderClient, SharedEmbeddings
from mmproc.client.ipc import IpcClient
from mmproc.client.readers import IpcReader
from mmproc.errors import InvalidMediaError, StaleSessionError, UnavailableError
from mmproc.transport.cuda_ipc.destination import PoolSlice
from mmproc.transport.cuda_ipc.pool import PoolIdentity, SliceDescriptor
from mmproc.transport.leases.allocator import Slice, SliceAllocator
from mmproc.transport.leases.records import MAX_READERS, Lease
from mmproc.transport.leases.table import LeaseTable
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from mmproc.wire.cuda_ipc import descriptor_from_pb
from mmproc.wire.results import EncodedImage
from mmproc.wire.transports import Table
from tests.support.media_samples import make_image_bytes

IMAGES = [make_image_bytes(448, 448, fmt="PNG", seed=1), make_image_bytes(300, 200, fmt="JPEG", seed=2)]
POOL = PoolIdentity(
    pool_id="a" * 32, epoch=7, device_uuid="GPU-0", ipc_handle=bytes(range(64)), pool_bytes=1 << 20,
    num_word_slots=16, data_offset=4096,
)  # fmt: skip


def ipc_shared(readers: int) -> SharedEmbeddings:
    """What a GPU server's reply to a `readers`-reader request looks like, built without a GPU."""
    acks = tuple(16 * slot + 8 for slot in (3, 5, 9, 11)[:readers])
    lease = Lease(42, "session", Slice(0, 128, 128), (3, 5, 9, 11)[:readers], 9, 0.0)
    results = [
        EncodedImage(
            index=i, grid_hw=(4, 4), num_tokens=4, embedding=torch.zeros(4, 8, dtype=torch.bfloat16),
            handle=PoolSlice(SliceDescriptor(lease_id=42, generation=9, offset=4096 + 64 * i, nbytes=64,
                                             ready_offset=48, ack_offsets=acks), lease, POOL),
        )
        for i in range(2)
    ]  # fmt: skip
    reply = Table().reply("req-1", results)
    assert reply is not None
    return SharedEmbeddings.from_reply(reply, POOL, readers)


# -- wire format --------------------------------------------------------------------------------------------------


def test_ipc_shared_embeddings_round_trip_through_bytes() -> None:
    shared = ipc_shared(readers=4)
    blob = shared.to_bytes()
    assert isinstance(blob, bytes) and len(blob) < 1024  # descriptors only: cheap to broadcast
    back = SharedEmbeddings.from_bytes(blob)
    assert back == shared and back.to_bytes() == blob
    assert (back.transport, back.readers, back.request_id, back.shapes) == ("ipc", 4, "req-1", [(4, 8), (4, 8)])
    assert back.pool == dataclasses.replace(POOL, data_offset=0)  # descriptors hold absolute offsets
    descs = back.descriptors()
    assert [d.ack_offsets for d in descs] == [(56, 88, 152, 184)] * 2
    assert [d.offset for d in descs] == [4096, 4160] and descs[0].ready_offset == 48 and descs[0].generation == 9


def test_serialized_shared_embeddings_round_trip_through_bytes() -> None:
    emb = torch.arange(12, dtype=torch.float32).view(3, 4)
    reply = pb.EncodeImagesResponse(request_id="r", transport=pb.TRANSPORT_SERIALIZED)
    reply.embeddings.add(index=0, num_tokens=3, dtype=pb.DTYPE_FLOAT32, shape=[3, 4], data=emb.numpy().tobytes())
    shared = SharedEmbeddings.from_reply(reply, None, readers=2)
    back = SharedEmbeddings.from_bytes(shared.to_bytes())
    assert back == shared and back.transport == "serialized" and back.pool is None
    (tensor,) = back.tensors(torch.device("cpu"))
    assert torch.equal(tensor, emb)


def test_from_bytes_rejects_foreign_or_inconsistent_bytes() -> None:
    with pytest.raises(ValueError, match="SharedEmbeddings"):
        SharedEmbeddings.from_bytes(b"\xff\xff\xff")
    with pytest.raises(ValueError, match="readers"):
        SharedEmbeddings.from_bytes(b"")  # empty message: readers 0
    message = pb.SharedEmbeddings.FromString(ipc_shared(readers=2).to_bytes())
    message.readers = 3  # the descriptors carry two ack words: a third rank would ack nowhere
    with pytest.raises(ValueError, match="3 readers"):
        SharedEmbeddings.from_bytes(message.SerializeToString())
    message.readers = 2
    message.reply.embeddings[1].ipc.lease_id = 43
    with pytest.raises(ValueError, match="more than one lease"):
        SharedEmbeddings.from_bytes(message.SerializeToString())


# -- readers defaults to 1 --------------------------------------------------------------------------------------


def test_readers_defaults_to_one_everywhere() -> None:
    request = pb.EncodeImagesRequest(images=[b"x"])
    assert not request.HasField("readers")  # unset on the wire; the server reads it as 1
    table = LeaseTable(SliceAllocator(1024), num_word_slots=4)
    lease = table.acquire(table.open_session("w"), 100, deadline=None)
    assert lease is not None and lease.readers == 1 and lease.slots == (lease.slot,)
    single = ipc_shared(readers=1).reply.embeddings[0].ipc
    assert single.readers == 1 and list(single.reader_ack_offset_bytes) == [single.ack_offset_bytes]
    # A descriptor from a server that predates fan-out has one ack word and means one reader.
    old = pb.IpcDescriptor(lease_id=1, generation=2, offset_bytes=4096, nbytes=64, ready_offset_bytes=0,
                           ack_offset_bytes=8)  # fmt: skip
    assert descriptor_from_pb(old).ack_offsets == (8,) and descriptor_from_pb(old).readers == 1


# -- the read/ack/release protocol of read_shared, with a fake pool (the real one is tests/transport/test_multi_gpu.py) ---


class FakePool:
    """Records what an OpenedPool would enqueue on the consumer's stream."""

    def __init__(self) -> None:
        self.waits: list[tuple[int, int]] = []
        self.acks: list[tuple[int, int]] = []

    def wait_ready(self, desc: SliceDescriptor, stream: object, timeout: float) -> None:
        self.waits.append((desc.ready_offset, desc.generation))

    def view(self, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype)

    def ack(self, desc: SliceDescriptor, stream: object, reader: int = 0) -> None:
        self.acks.append((reader, desc.ack_offsets[reader]))


class FakeCache:
    enabled = True

    def __init__(self, fail: bool = False) -> None:
        self.pool, self.fail, self.devices = FakePool(), fail, []

    def acquire(self, identity: PoolIdentity, device: torch.device) -> FakePool:
        self.devices.append(device)
        if self.fail:
            raise RuntimeError("cudaIpcOpenMemHandle failed")
        return self.pool

    def release(self, pool: FakePool) -> None:
        pass


def rank_client(monkeypatch: pytest.MonkeyPatch, session: str, *, index: int, fail: bool = False) -> IpcClient:
    """An IpcClient of a rank on cuda:`index` whose session is open, minus gRPC and CUDA."""
    client = IpcClient.__new__(IpcClient)
    client._device, client._uuid, client._lock = torch.device("cuda", index), f"GPU-{index}", threading.Lock()
    client._owned, client._outbox, client._call = {}, queue.Queue(), None
    client.session_id, client.identity, client.refused, client.fallbacks = session, POOL, None, 0
    client._cache = FakeCache(fail)
    client._session = lambda: session  # type: ignore[method-assign]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    return client


def sent(client: IpcClient) -> list[pb.SessionRequest]:
    return [client._outbox.get_nowait() for _ in range(client._outbox.qsize())]


def test_each_rank_acks_its_own_word_and_only_rank_0_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    shared = ipc_shared(readers=3)
    owner = rank_client(monkeypatch, "s0", index=1)
    requests: list[pb.EncodeImagesRequest] = []
    owner._stub = SimpleNamespace(EncodeImages=lambda r, timeout: requests.append(r) or shared.reply)
    owner.request([b"img"], "req-1", 5.0, readers=3)
    assert requests[0].readers == 3 and requests[0].consumer.session_id == "s0"

    peers = [rank_client(monkeypatch, f"s{r}", index=1 + r % 2) for r in (1, 2)]
    blob = shared.to_bytes()
    for r, peer in enumerate(peers, start=1):
        with peer.read_shared(SharedEmbeddings.from_bytes(blob), r, 5.0) as views:
            assert [tuple(v.shape) for v in views] == [(4, 8), (4, 8)] and views[0].dtype == torch.bfloat16
        assert peer._cache.devices == [torch.device("cuda", 1 + r % 2)]  # opened with its own device
        assert peer._cache.pool.waits == [(48, 9)]  # the one shared ready word and generation
        assert peer._cache.pool.acks == [(r, shared.descriptors()[0].ack_offsets[r])]
        assert sent(peer) == []  # a non-owner rank never releases

    with owner.read_shared(shared, 0, 5.0):
        pass
    assert owner._cache.pool.acks == [(0, 56)]
    (release,) = sent(owner)
    assert list(release.release.lease_ids) == [42] and not release.release.unread
    with pytest.raises(ValueError, match="rank 0 reads"), owner.read_shared(shared, 0, 5.0):
        pass  # once: its lease is released


def test_single_reader_request_sends_no_readers_field(monkeypatch: pytest.MonkeyPatch) -> None:
    client = rank_client(monkeypatch, "s0", index=0)
    requests: list[pb.EncodeImagesRequest] = []
    client._stub = SimpleNamespace(EncodeImages=lambda r, timeout: requests.append(r) or ipc_shared(1).reply)
    client.request([b"img"], "req-1", 5.0)
    assert not requests[0].HasField("readers") and client._owned == {}  # encode_images' lease: read at once


def test_a_server_that_ignores_readers_is_detected_and_its_lease_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    client = EncoderClient.__new__(EncoderClient)
    client._reader = IpcReader(
        rank_client(monkeypatch, "s0", index=0), SimpleNamespace(device=torch.device("cpu"), cache_bypass=False)
    )
    client.timeout = 5.0
    old_reply = ipc_shared(readers=1).reply  # one ack word: the server leased for one reader
    client._ipc._stub = SimpleNamespace(EncodeImages=lambda r, timeout: old_reply)
    with pytest.raises(ValueError, match="2 readers"):
        client.encode_images_shared([b"img"], readers=2)
    (release,) = sent(client._ipc)
    assert list(release.release.lease_ids) == [42] and release.release.unread and client._ipc._owned == {}


def test_rank_0_must_be_the_client_that_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    other = rank_client(monkeypatch, "s9", index=0)
    with pytest.raises(ValueError, match="rank 0"), other.read_shared(ipc_shared(readers=2), 0, 5.0):
        pass
    assert other._cache.devices == [] and sent(other) == []


def test_a_restarted_server_makes_shared_embeddings_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    peer = rank_client(monkeypatch, "s1", index=1)
    peer.identity = dataclasses.replace(POOL, epoch=POOL.epoch + 1)
    with pytest.raises(StaleSessionError, match="encode again"), peer.read_shared(ipc_shared(2), 1, 5.0):
        pass
    assert peer._cache.devices == []  # the old pool is never mapped


def test_a_rank_that_cannot_map_the_pool_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    shared = ipc_shared(readers=2)
    peer = rank_client(monkeypatch, "s1", index=1, fail=True)
    with pytest.raises(UnavailableError, match="cannot open"), peer.read_shared(shared, 1, 5.0):
        pass
    assert sent(peer) == []  # its ack never comes: the server's TTL frees the slice
    owner = rank_client(monkeypatch, "s0", index=1, fail=True)
    owner._owned[42] = "s0"
    with pytest.raises(UnavailableError), owner.read_shared(shared, 0, 5.0):
        pass
    (release,) = sent(owner)
    assert release.release.unread  # the server holds a shared lease until the TTL anyway (peers may read it)


# -- against the tiny CPU server (no pool: serialized) -----------------------------------------------------------


@pytest.mark.parametrize("readers", [0, MAX_READERS + 1])
def test_server_rejects_readers_out_of_range(tiny_server, readers: int) -> None:
    stub = pb_grpc.EncoderStub(grpc.insecure_channel(tiny_server.grpc_target))
    request = pb.EncodeImagesRequest(images=IMAGES[:1], readers=readers, transport=pb.TRANSPORT_SERIALIZED)
    for call in (stub.EncodeImages, lambda r, timeout: list(stub.EncodeImagesStream(r, timeout=timeout))):
        with pytest.raises(grpc.RpcError) as info:
            call(request, timeout=30)
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "readers" in info.value.details()
    with EncoderClient(tiny_server.grpc_target) as client, pytest.raises(InvalidMediaError) as err:
        client.encode_images_shared(IMAGES[:1], readers=readers)
    assert err.value.reason == "bad_request" and err.value.http_status == 400


def test_server_accepts_the_largest_reader_count(tiny_server) -> None:
    stub = pb_grpc.EncoderStub(grpc.insecure_channel(tiny_server.grpc_target))
    reply = stub.EncodeImages(pb.EncodeImagesRequest(images=IMAGES[:1], readers=MAX_READERS), timeout=30)
    assert reply.transport == pb.TRANSPORT_SERIALIZED and len(reply.embeddings) == 1


def test_cpu_server_shared_request_falls_back_to_serialized(tiny_server) -> None:
    with EncoderClient(tiny_server.grpc_target) as rank0, EncoderClient(tiny_server.grpc_target) as rank1:
        want = rank0.encode_images(IMAGES)
        shared = rank0.encode_images_shared(IMAGES, readers=2)
        assert shared.transport == "serialized" and shared.readers == 2 and shared.pool is None
        blob = shared.to_bytes()  # carries the embeddings themselves
        for rank, client in ((0, rank0), (1, rank1)):
            with client.read_shared(SharedEmbeddings.from_bytes(blob), rank) as got:
                assert len(got) == len(want)
                assert all(torch.equal(a, b) for a, b in zip(got, want))
        with pytest.raises(ValueError, match="rank"), rank1.read_shared(shared, 2):
            pass


def test_fanout_driver_runs_on_cpu(tiny_server, tmp_path: Path) -> None:
    """The multi-GPU benchmark's driver, end to end on CPU ranks (gloo broadcast, serialized payloads)."""
    out = tmp_path / "fanout.json"
    command = [sys.executable, "-m", "benchmarks.fanout", "--target", tiny_server.grpc_target, "--tp", "2",
               "--devices", "cpu", "--transport", "auto", "--requests", "3", "--warmup", "1", "--resolutions",
               "64x64", "--json", str(out), "--max-seconds", "120"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    record = json.loads(out.read_text())
    (side,) = record["sides"]
    assert side["completed"] == 3 and side["failed"] == 0
    assert len(side["read_mean_ms_by_rank"]) == 2 and all(m is not None for m in side["read_mean_ms_by_rank"])
