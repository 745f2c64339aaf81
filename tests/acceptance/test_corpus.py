"""Every case of the hostile corpus (tests/support/corpus.py) through a real server: gRPC for all, HTTP for a sample.

For each case the server's answer must be (a) one of the outcomes the case allows and (b) exactly what the
library says when called directly: the same refusal reason, or an embedding of the right shape. Anything
else (INTERNAL, UNKNOWN, a hang, a dead server) fails.
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib

import grpc
import httpx
import pytest
import torch

from mmproc.client import error_from_rpc
from mmproc.errors import InvalidMediaError
from mmproc.transport.serialized.staging import bytes_to_tensor
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from service.pipeline.decode.worker import prepare_image
from tests.support.corpus import FAMILIES, OK, Case, build_corpus

CASES = build_corpus()
HTTP_SAMPLE = CASES[::9]


def library_outcome(server, case: Case) -> tuple[str, int]:
    """(reason or "ok", tokens) from the library itself, with the server's limits and preprocessing."""
    pipeline = server.service.pipeline
    try:
        prepared = prepare_image(case.data, pipeline.media_limits, pipeline.preprocess)
    except InvalidMediaError as exc:
        return exc.reason, 0
    return OK, prepared.image.num_tokens


def grpc_outcome(stub: pb_grpc.EncoderStub, case: Case) -> tuple[str, int]:
    request = pb.EncodeImagesRequest(images=[case.data], request_id=case.name, transport=pb.TRANSPORT_SERIALIZED)
    try:
        reply = stub.EncodeImages(request, timeout=60)
    except grpc.RpcError as err:
        error = error_from_rpc(err)
        if err.code() is not grpc.StatusCode.INVALID_ARGUMENT:
            return f"{err.code().name}: {err.details()}", 0
        assert isinstance(error, InvalidMediaError) and error.index == 0, (case.name, error)
        return error.reason, 0
    (embedding,) = reply.embeddings
    tensor = bytes_to_tensor(embedding.data, "float32", tuple(embedding.shape), torch.device("cpu"))
    assert tensor.shape[1] == 256 and torch.isfinite(tensor).all(), case.name
    return OK, tensor.shape[0]


@pytest.fixture(scope="module")
def outcomes(tiny_server) -> dict[str, tuple[str, int]]:
    """Every case sent once, eight requests at a time."""
    options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    with grpc.insecure_channel(tiny_server.grpc_target, options=options) as channel:
        stub = pb_grpc.EncoderStub(channel)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda case: grpc_outcome(stub, case), CASES))
    return {case.name: answer for case, answer in zip(CASES, answers)}


def test_corpus_is_large_and_deterministic() -> None:
    assert len(CASES) >= 200
    assert len({case.name.split("/")[0] for case in CASES}) == len(FAMILIES)
    again = [case for family in FAMILIES for case in family()]
    digest = lambda cases: hashlib.sha256(b"".join(c.name.encode() + c.data for c in cases)).hexdigest()  # noqa: E731
    assert digest(again) == digest(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_grpc_answers_like_the_library(tiny_server, outcomes, case: Case) -> None:
    got = outcomes[case.name]
    assert got[0] in case.expect, f"{case.name}: server said {got[0]!r}, allowed {sorted(case.expect)}"
    assert got == library_outcome(tiny_server, case)


@pytest.mark.parametrize("case", HTTP_SAMPLE, ids=[case.name for case in HTTP_SAMPLE])
def test_http_answers_like_grpc(tiny_server, outcomes, case: Case) -> None:
    body = {"images": [base64.b64encode(case.data).decode()], "request_id": "corpus"}
    reply = httpx.post(f"{tiny_server.http_url}/v1/encode", json=body, timeout=60)
    reason, tokens = outcomes[case.name]
    if reason == OK:
        assert reply.status_code == 200, reply.text
        assert reply.json()["embeddings"][0]["num_tokens"] == tokens
    else:
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["code"], error["reason"], error["index"]) == ("INVALID_ARGUMENT", reason, 0)


def test_server_is_idle_and_serving_after_the_corpus(tiny_server, outcomes) -> None:
    pipeline = tiny_server.service.pipeline
    assert pipeline.inflight == 0 and pipeline.queued_images == 0
    assert pipeline.decode_pool.crashes == 0  # nothing in the corpus should crash a decoder
    assert httpx.get(f"{tiny_server.http_url}/readyz").status_code == 200
