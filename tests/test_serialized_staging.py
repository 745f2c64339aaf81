"""The server's staging of serialized replies: per-image readiness (start_staging), and replies whose payloads
are large enough to be copied by the pool still carry exactly protobuf's bytes."""

from __future__ import annotations

import pytest
import torch

from mmproc.transport import host_copy, stage_to_host, start_staging, tensor_to_bytes
from mmproc.transport.host_copy import split_plan
from mmproc.v1 import encoder_pb2 as pb
from service.convert import embedding_header, serialized_payloads, serialized_stream
from service.engine import EncodedImage

MiB = 1 << 20


def results_of(token_counts: list[int], hidden: int = 4096) -> list[EncodedImage]:
    gen = torch.Generator().manual_seed(0)
    return [
        EncodedImage(
            index=i, grid_hw=(2, 2 * n), num_tokens=n, embedding=torch.randn(n, hidden, generator=gen).bfloat16()
        )
        for i, n in enumerate(token_counts)
    ]


@pytest.fixture
def pool_pieces(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the pieces handed to the copy pool during the test."""
    sizes: list[int] = []
    submit = host_copy._POOL.submit

    def spy(run):
        sizes.append(run.__self__.nbytes)  # run: a piece's bound `run`
        return submit(run)

    monkeypatch.setattr(host_copy._POOL, "submit", spy)
    return sizes


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


def test_large_stream_is_protobufs_bytes_copied_by_the_pool(pool_pieces: list[int]) -> None:
    # 300 x 4096 x bf16 = 2.3 MiB per image: a 1 MiB chunk and the 0.34 MiB tail per image go to the pool.
    results = results_of([300, 0, 130])
    chunk_bytes = MiB
    want, planned = [], []
    for result in results:
        data = tensor_to_bytes(result.embedding)
        for offset in range(0, max(len(data), 1), chunk_bytes):
            header = embedding_header(result) if offset == 0 else None
            piece = data[offset : offset + chunk_bytes]
            want.append(pb.EncodeImagesChunk(request_id="req-big", header=header, index=result.index, offset=offset,
                                             data=piece).SerializeToString())  # fmt: skip
            if len(piece) >= host_copy.INLINE_BYTES:
                planned += [stop - start for start, stop in split_plan(len(piece))]
    pool_pieces.clear()  # tensor_to_bytes above used the pool too
    wire = serialized_stream("req-big", results, chunk_bytes)
    assert wire == want  # byte for byte
    assert len(planned) > 0 and sorted(pool_pieces) == sorted(planned)
    pool_pieces.clear()
    assert serialized_payloads(results) == [tensor_to_bytes(r.embedding) for r in results]
    assert len(pool_pieces) > 0
