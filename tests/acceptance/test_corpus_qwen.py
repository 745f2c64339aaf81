"""The hostile corpus (tests/support/corpus.py, decode-cost payloads included) through the Qwen3-VL rule: every
case answered as the library answers it with the same limits and rule (a 400 with its reason, or an embedding of
the right shape and token count), in bounded time, never INTERNAL. The cases' allowed outcomes were written for
the Kimi rules; Qwen's own refusals (an aspect ratio over 200) are the library's, so the comparison is with it.

A tiny random Qwen3-VL checkpoint whose preprocessor_config.json caps the budget at 1,048,576 pixels (a deployment
may lower max_pixels; the corpus's 16-megapixel image would otherwise be one 62,500-patch attention on a CPU)."""

from __future__ import annotations

import concurrent.futures
import json
import time

import grpc
import pytest
import torch

from mmproc.client import error_from_rpc
from mmproc.errors import InvalidMediaError
from mmproc.transport.serialized.staging import bytes_to_tensor
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from service.pipeline.decode.worker import prepare_image
from tests.support.corpus import OK, build_corpus
from tests.support.qwen_checkpoint import PREPROCESSOR, TINY_QWEN, write_qwen_checkpoint
from tests.support.server import serving, test_settings

CASES = build_corpus()
WIDTH = TINY_QWEN["out_hidden_size"] * (1 + len(TINY_QWEN["deepstack_visual_indexes"]))


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen_corpus")
    write_qwen_checkpoint(path)
    rules = {**PREPROCESSOR, "size": {"shortest_edge": 65_536, "longest_edge": 1 << 20}}
    (path / "preprocessor_config.json").write_text(json.dumps(rules))
    with serving(test_settings(model_path=str(path), dtype="float32")) as server:
        yield server


def _grpc(stub, case) -> tuple[str, int]:
    request = pb.EncodeImagesRequest(images=[case.data], request_id=case.name, transport=pb.TRANSPORT_SERIALIZED)
    try:
        reply = stub.EncodeImages(request, timeout=120)
    except grpc.RpcError as err:
        if err.code() is not grpc.StatusCode.INVALID_ARGUMENT:
            return f"{err.code().name}: {err.details()}", 0
        error = error_from_rpc(err)
        assert isinstance(error, InvalidMediaError) and error.index == 0, (case.name, error)
        return error.reason, 0
    (embedding,) = reply.embeddings
    tensor = bytes_to_tensor(embedding.data, "float32", tuple(embedding.shape), torch.device("cpu"))
    assert tensor.shape[1] == WIDTH and torch.isfinite(tensor).all(), case.name
    return OK, tensor.shape[0]


def test_the_corpus_through_the_qwen_rule(qwen_server) -> None:
    pipeline = qwen_server.service.pipeline
    assert pipeline.preprocess.family == "qwen3_vl" and pipeline.preprocess.max_pixels == 1 << 20
    options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    start = time.monotonic()
    with grpc.insecure_channel(qwen_server.grpc_target, options=options) as channel:
        stub = pb_grpc.EncoderStub(channel)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda case: _grpc(stub, case), CASES))
    assert time.monotonic() - start < 600
    mismatched = {}
    for case, got in zip(CASES, answers, strict=True):
        try:
            prepared = prepare_image(case.data, pipeline.media_limits, pipeline.preprocess)
            want = (OK, prepared.image.num_tokens)
        except InvalidMediaError as exc:
            want = (exc.reason, 0)
        if got != want:
            mismatched[case.name] = (got, want)
    assert not mismatched
    # the valid part: 105 cases allow an embedding, 21 of them a refusal too (truncated, bit flips), which they get
    assert sum(got[0] == OK for got in answers) >= 80
    assert pipeline.inflight == 0 and pipeline.decode_pool.crashes == 0
