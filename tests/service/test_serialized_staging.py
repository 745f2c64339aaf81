"""The server's staging of serialized replies: per-image readiness (start_staging), and multi-MiB replies still
carry exactly protobuf's bytes."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from mmproc.transport import stage_to_host, start_staging, tensor_to_bytes
from mmproc.units import MiB
from mmproc.v1 import encoder_pb2 as pb
from service.frontends.replies import embedding_header, serialized_payloads, serialized_reply, serialized_stream
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
    want = pb.EncodeImagesResponse(request_id="req-u", transport=pb.TRANSPORT_SERIALIZED)
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
