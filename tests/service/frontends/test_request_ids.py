"""Request ids: one rule for the header, the JSON field and the proto field (1..128 visible ASCII, else replaced by
ours and logged as such), and text log lines that a client's text cannot forge."""

from __future__ import annotations

import base64
import logging
import socket
import sys
from collections.abc import Iterator

import grpc
import httpx
import pytest

from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from service.frontends.request_ids import is_sane_request_id, request_id_from
from service.observe.logs import RequestIdFilter, TextFormatter, request_context
from tests.support.log_capture import Capture
from tests.support.media_samples import make_image_bytes

FORGED = "x\n2026-01-01 00:00:00,000 ERROR mmproc.forged [-] forged"
BAD_IDS = {
    "non-ascii": "ид-запроса",
    "crlf": "abc\r\nx-evil: 1",
    "1 MiB": "a" * (1 << 20),
    "forged log line": FORGED,
    "space": "a b",
    "129 chars": "a" * 129,
}


@pytest.fixture
def captured() -> Iterator[Capture]:
    handler, root = Capture(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def replaced_lines(captured: Capture, new_id: str) -> list[logging.LogRecord]:
    return [r for r in captured.records if "replaced by" in r.getMessage() and r.request_id == new_id]


def test_the_rule() -> None:
    assert is_sane_request_id("trace-abc_123.x:y/z") and is_sane_request_id("a" * 128)
    assert not any(is_sane_request_id(value) for value in BAD_IDS.values())
    assert not is_sane_request_id("") and not is_sane_request_id("tab\there") and not is_sane_request_id("del\x7f")
    assert request_id_from("field-1", "header-1") == "field-1"  # the field wins, as before
    assert request_id_from(None, "header-1") == request_id_from("", "header-1") == "header-1"
    assert is_sane_request_id(request_id_from(None, None))
    replaced = request_id_from(BAD_IDS["crlf"], "header-1")  # a bad field is replaced, not mixed with the header
    assert replaced != "header-1" and is_sane_request_id(replaced)


@pytest.mark.parametrize("name", sorted(BAD_IDS))
def test_grpc_a_bad_proto_id_is_replaced_and_the_call_succeeds(tiny_server, captured, name) -> None:
    request = pb.EncodeImagesRequest(
        images=[make_image_bytes(32, 32, fmt="PNG")], request_id=BAD_IDS[name], transport=pb.TRANSPORT_SERIALIZED
    )
    with grpc.insecure_channel(tiny_server.grpc_target) as channel:
        reply, call = pb_grpc.EncoderStub(channel).EncodeImages.with_call(request, timeout=60)
    (echoed,) = [v for k, v in call.trailing_metadata() if k == "x-request-id"]
    assert call.code() == grpc.StatusCode.OK and len(reply.embeddings) == 1
    assert is_sane_request_id(echoed) and echoed == reply.request_id
    (line,) = replaced_lines(captured, echoed)
    assert line.levelno == logging.WARNING and len(line.getMessage()) < 400  # the refused id is cut


def test_grpc_a_bad_id_in_a_refused_call_is_replaced_too(tiny_server, captured) -> None:
    request = pb.EncodeImagesRequest(images=[b"not an image"], request_id=BAD_IDS["crlf"])
    with grpc.insecure_channel(tiny_server.grpc_target) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.EncoderStub(channel).EncodeImages(request, timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # not INTERNAL: the trailer is valid
    (echoed,) = [v for k, v in refused.value.trailing_metadata() if k == "x-request-id"]
    assert is_sane_request_id(echoed)


@pytest.mark.parametrize("name", sorted(BAD_IDS))
def test_http_a_bad_json_id_is_replaced_and_the_request_succeeds(tiny_server, captured, name) -> None:
    body = {"images": [base64.b64encode(make_image_bytes(32, 32, fmt="PNG")).decode()], "request_id": BAD_IDS[name]}
    reply = httpx.post(f"{tiny_server.http_url}/v1/encode", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    echoed = reply.headers["x-request-id"]
    assert is_sane_request_id(echoed) and reply.json()["request_id"] == echoed
    assert len(replaced_lines(captured, echoed)) == 1


def raw_http(url: str, head: bytes, body: bytes) -> bytes:
    """One request written byte for byte (httpx refuses to send what a hostile client would); the reply's bytes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_http_a_non_latin1_or_cut_header_id_never_breaks_the_reply(tiny_server, captured) -> None:
    body = b'{"images": ["%s"]}' % base64.b64encode(make_image_bytes(32, 32, fmt="PNG"))
    start = b"POST /v1/encode HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n"
    utf8 = raw_http(tiny_server.http_url, start + "x-request-id: ид\r\n".encode(), body)
    status, _, rest = utf8.partition(b"\r\n")
    assert status == b"HTTP/1.1 200 OK"
    (echoed,) = [line.split(b": ", 1)[1] for line in rest.split(b"\r\n") if line.lower().startswith(b"x-request-id")]
    assert is_sane_request_id(echoed.decode("ascii"))
    bare_cr = raw_http(tiny_server.http_url, start + b"x-request-id: a\rb\r\n", body)
    assert bare_cr.startswith(b"HTTP/1.1 400")  # the HTTP parser's own answer: a clean 400, never a closed socket


def test_a_forged_log_line_stays_on_its_record() -> None:
    """The text format escapes what a client wrote (message, id, an exception's text): every line at column 0
    is one record's first line."""
    formatter = TextFormatter()
    try:
        raise ValueError(FORGED)
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("mmproc.x", logging.INFO, __file__, 1, "client said %s", (FORGED,), exc_info)
    with request_context(FORGED):
        RequestIdFilter().filter(record)
    text = formatter.format(record)
    lines = text.split("\n")
    assert not any("\r" in line for line in lines) and FORGED.split("\n")[1] not in lines
    assert lines[0].endswith("client said x\\n2026-01-01 00:00:00,000 ERROR mmproc.forged [-] forged")
    assert all(line.startswith("    ") for line in lines[1:]) and "    ValueError: x" in lines  # indented: not a record
    for odd in ("\u2028", "\x85", "\x1b[2J", "\u202e"):
        assert "\n" not in formatter.format(logging.LogRecord("m", 20, "", 1, odd, (), None))
        assert odd not in formatter.format(logging.LogRecord("m", 20, "", 1, odd, (), None))


def test_grpc_a_message_that_does_not_parse_is_invalid_argument(tiny_server) -> None:
    """A proto string field's bad UTF-8 (the request id's here) was UNKNOWN: gRPC's own parse failed."""
    raw = pb.EncodeImagesRequest(images=[b"x"], request_id="zz").SerializeToString().replace(b"zz", b"\xff\xfe")
    with grpc.insecure_channel(tiny_server.grpc_target) as channel, pytest.raises(grpc.RpcError) as refused:
        channel.unary_unary("/mmproc.v1.Encoder/EncodeImages")(raw, timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    (echoed,) = [v for k, v in refused.value.trailing_metadata() if k == "x-request-id"]
    assert is_sane_request_id(echoed)
