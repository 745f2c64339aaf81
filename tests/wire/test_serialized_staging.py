"""The server's staging of serialized replies: per-image readiness (start_staging), page-locked messages the D2H
lands in (and their reuse, through real gRPC), and multi-MiB replies still carry exactly protobuf's bytes."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch

from mmproc.transport.serialized.pinned_messages import PinnedMessages
from mmproc.transport.serialized.staging import stage_to_host, start_staging, tensor_to_bytes
from mmproc.units import MiB
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.results import EncodedImage, embedding_header
from mmproc.wire.serialized import serialized_payloads, serialized_reply, serialized_stream
from tests.support.encoded import results_of


def test_cpu_tensors_pass_through_already_ready() -> None:
    tensors = [torch.randn(3, 8), torch.randn(0, 8).bfloat16()]
    staged = start_staging(tensors)
    assert all(s.ready is None and s.wait() is t for s, t in zip(staged, tensors))
    assert all(h is t for h, t in zip(stage_to_host(tensors), tensors))


@pytest.mark.cuda
def test_gpu_tensors_land_in_one_pinned_buffer_each_with_its_event() -> None:
    tensors = [torch.randn(n, 64, device="cuda").bfloat16() for n in (5, 0, 7)] + [torch.randn(2, 64)]
    staged = start_staging(tensors)
    assert [s.ready is None for s in staged] == [False, False, False, True]
    hosts = [s.wait() for s in reversed(staged)][::-1]  # any order: each waits for its own copy
    assert all(h.device.type == "cpu" and torch.equal(h, t.cpu()) for h, t in zip(hosts, tensors))
    assert hosts[0].is_pinned() and hosts[0].untyped_storage().data_ptr() == hosts[2].untyped_storage().data_ptr()


@pytest.mark.cuda
def test_stream_from_the_gpu_carries_the_same_bytes_as_from_the_cpu() -> None:
    # Each image's messages are copied out of the pinned staging buffer as soon as its own D2H has landed.
    results = results_of([300, 0, 1300, 7], hidden=4096)
    on_gpu = [dataclasses.replace(r, embedding=r.embedding.cuda()) for r in results]
    assert serialized_stream("req-s", on_gpu, MiB) == serialized_stream("req-s", results, MiB)


@pytest.mark.cuda
def test_replies_landing_in_page_locked_messages_carry_the_cpus_bytes_and_reuse_them() -> None:
    results = results_of([300, 0, 1300, 7], hidden=4096)  # 2.3 MiB, none, 10 MiB, 56 KiB: tails under MIN_MESSAGE
    on_gpu = [dataclasses.replace(r, embedding=r.embedding.cuda()) for r in results]
    pinned = PinnedMessages(64 * MiB)
    assert serialized_stream("req-p", on_gpu, MiB, pinned) == serialized_stream("req-p", results, MiB)
    assert serialized_reply("req-p", on_gpu, pinned) == serialized_reply("req-p", results)
    registered = pinned.registered_bytes
    assert registered > 0 and pinned.misses == 0
    for _ in range(3):  # the earlier replies are gone: their messages serve again, nothing more is page-locked
        assert serialized_stream("req-q", on_gpu, MiB, pinned) == serialized_stream("req-q", results, MiB)
    assert pinned.registered_bytes == registered and pinned.misses == 0


@pytest.mark.cuda
def test_page_locked_messages_are_never_rewritten_while_grpc_sends_them() -> None:
    from benchmarks.d2h import loopback
    from mmproc.client import EncoderClient
    from mmproc.client.rpc import channel_options, encoder_stub

    base = torch.randn(600, 4096, device="cuda").bfloat16()  # 4.9 MB an image

    def answer(images: list[bytes]) -> list[EncodedImage]:  # each request's own values (its first byte)
        return [EncodedImage(i, (2, 1200), 600, base + images[0][0] + i) for i in range(len(images))]

    def expected(k: int) -> list[bytes]:
        return [(base + k + i).cpu().view(torch.uint8).numpy().tobytes() for i in range(2)]

    def streams(worker: int, target: str) -> int:
        with EncoderClient(target, device="cpu", transport="serialized") as client:
            for k in range(worker, 120, 6):
                got = client.encode_images([bytes([k]), b"x"])
                assert [t.view(torch.uint8).numpy().tobytes() for t in got] == expected(k), f"stream {k}"
        return k

    def unary(worker: int, target: str) -> int:
        with grpc.insecure_channel(target, options=channel_options(64 * MiB)) as channel:
            stub = encoder_stub(channel)
            for k in range(worker, 120, 6):
                request = pb.EncodeImagesRequest(images=[bytes([k]), b"x"], transport=pb.TRANSPORT_SERIALIZED)
                reply = stub.EncodeImages(request, timeout=30)
                assert [e.data for e in reply.embeddings] == expected(k), f"unary {k}"
        return k

    # 16 MiB of page-locked messages for 6 callers of ~10 MB replies: some replies are copied (the pool full)
    with loopback(answer, 4 * MiB, pinned_bytes=16 * MiB) as target, ThreadPoolExecutor(6) as pool:
        calls = [pool.submit(streams if w % 2 else unary, w, target) for w in range(6)]
        assert [c.result(timeout=120) for c in calls]


@pytest.mark.cuda
def test_a_wait_behind_queued_gpu_work_sleeps_and_spins_only_through_the_copy() -> None:
    tensor = torch.randn(1000, 7168, device="cuda").bfloat16()  # a 14 MB reply
    torch.cuda.synchronize()
    torch.cuda._sleep(300_000_000)  # ~0.15 s of device time queued before the copy, as a forward would be
    (staged,) = start_staging([tensor])
    cpu, wall = time.thread_time(), time.perf_counter()
    host = staged.wait()
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    assert wall > 0.05, "the copy did not wait for the work queued before it"
    assert cpu < 0.25 * wall, f"the waiting thread used {cpu * 1e3:.0f} ms of CPU in {wall * 1e3:.0f} ms"
    assert torch.equal(host.view(torch.int16), tensor.cpu().view(torch.int16))


def test_large_stream_is_protobufs_bytes() -> None:
    # 300 x 4096 x bf16 = 2.3 MiB per image: two 1 MiB chunks and a tail per image, and an empty image.
    results = results_of([300, 0, 130], hidden=4096)
    chunk_bytes = MiB
    want = []
    for result in results:
        data = tensor_to_bytes(result.embedding)
        for offset in range(0, max(len(data), 1), chunk_bytes):
            header = embedding_header(result) if offset == 0 else None
            piece = data[offset : offset + chunk_bytes]
            want.append(pb.EncodeImagesChunk(request_id="req-big", header=header, index=result.index, offset=offset,
                                             data=piece).SerializeToString())  # fmt: skip
    assert serialized_stream("req-big", results, chunk_bytes) == want  # byte for byte
    assert serialized_payloads(results) == [r.embedding.view(torch.uint8).numpy().tobytes() for r in results]


@pytest.mark.parametrize("tokens", [[300, 0, 130], [1], []])
def test_unary_reply_bytes_parse_to_the_message_protobuf_would_build(tokens: list[int]) -> None:
    # The servicer returns these bytes to gRPC as they are: a client parses them with the generated code.
    results = results_of(tokens, hidden=4096)
    want = pb.EncodeImagesResponse(request_id="req-u", transport=pb.TRANSPORT_SERIALIZED, transport_name="serialized")
    for result in results:
        header = embedding_header(result)
        header.data = tensor_to_bytes(result.embedding)  # set even when empty: `data` sits in a oneof
        want.embeddings.append(header)
    wire = serialized_reply("req-u", results)
    assert type(wire) is bytes and len(wire) == want.ByteSize()
    got = pb.EncodeImagesResponse.FromString(wire)
    assert got == want
    assert [e.WhichOneof("payload") for e in got.embeddings] == ["data"] * len(results)


@pytest.mark.cuda
def test_unary_reply_from_the_gpu_carries_the_same_bytes_as_from_the_cpu() -> None:
    # Each payload is copied out of the pinned staging buffer as soon as its own D2H has landed.
    results = results_of([300, 0, 1300, 7], hidden=4096)
    on_gpu = [dataclasses.replace(r, embedding=r.embedding.cuda()) for r in results]
    assert serialized_reply("req-g", on_gpu) == serialized_reply("req-g", results)
