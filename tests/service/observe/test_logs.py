"""Logs: one request id on every line of a request (worker threads included), no traceback for client errors."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest

import service.pipeline.decode.worker
from mmproc.client import EncoderClient
from mmproc.errors import InvalidMediaError
from service.observe.logs import JsonFormatter, RequestIdFilter, request_context
from tests.support.log_capture import Capture
from tests.support.media_samples import make_image_bytes
from tests.support.server import ServiceThread, serving, test_settings


@pytest.fixture(scope="module")
def tiny_server() -> Iterator[ServiceThread]:
    """Decoding in threads: the test patches the per-image function, which a worker process would not see."""
    with serving(test_settings(decode_isolation="thread")) as server:
        yield server


@pytest.fixture
def captured(monkeypatch) -> Iterator[Capture]:
    """Root-logger records at INFO and above, stamped by the same filter `mmproc serve` installs; the decode
    worker logs one line per image, so that the test can see which request id a worker thread carries."""
    original = service.pipeline.decode.worker.prepare_image

    def logging_prepare_image(*args):
        logging.getLogger("test.worker").info("decoding one image")
        return original(*args)

    monkeypatch.setattr(service.pipeline.decode.worker, "prepare_image", logging_prepare_image)
    handler, root = Capture(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_one_request_id_on_every_line_including_worker_threads(tiny_server, captured) -> None:
    good = make_image_bytes(40, 40, fmt="PNG")
    with EncoderClient(tiny_server.grpc_target, cache=False) as client:  # every request decodes (no cache hits)
        client.encode_images([good, good], request_id="req-good-1")
        with pytest.raises(InvalidMediaError):
            client.encode_images([good, b"GIF89a-garbage"], request_id="req-bad-2")

    workers = [r for r in captured.records if r.name == "test.worker"]
    assert {r.request_id for r in workers} == {"req-good-1", "req-bad-2"}
    assert all(r.threadName.startswith("mmproc-decode") for r in workers)
    refused = [r for r in captured.records if "refused" in r.getMessage()]
    assert len(refused) == 1
    assert refused[0].request_id == "req-bad-2"
    assert refused[0].levelno == logging.INFO and refused[0].exc_info is None  # expected: no traceback
    assert all(r.exc_info is None for r in captured.records)


def test_a_request_without_an_id_gets_one(tiny_server, captured) -> None:
    with EncoderClient(tiny_server.grpc_target, cache=False) as client:
        client.encode_images([make_image_bytes(40, 40, fmt="PNG")])
    (line,) = [r for r in captured.records if r.name == "test.worker"]
    assert line.request_id not in ("", "-")


def test_http_requests_carry_their_id(tiny_server, captured) -> None:
    import httpx

    reply = httpx.post(f"{tiny_server.http_url}/v1/encode", json={"images": ["@@"], "request_id": "http-7"})
    assert reply.status_code == 400
    (refused,) = [r for r in captured.records if "refused" in r.getMessage()]
    assert refused.request_id == "http-7"


def test_json_lines_name_the_request() -> None:
    record = logging.LogRecord("mmproc.x", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    with request_context("abc123"):
        RequestIdFilter().filter(record)
    entry = json.loads(JsonFormatter().format(record))
    assert entry["request_id"] == "abc123"
    assert entry["message"] == "hello world"
    assert entry["level"] == "INFO"


# ----------------------------------------------------------------------------------- access lines, request ids


def access_lines(captured: Capture, at_least: int = 0) -> list[logging.LogRecord]:
    """The access lines so far; waits (bounded) for `at_least` of them: the server writes a gRPC call's line
    once the call has ended, which can be just after the client has its reply."""
    deadline = time.monotonic() + 10
    while True:
        lines = [r for r in captured.records if r.name == "mmproc.access"]
        if len(lines) >= at_least or time.monotonic() > deadline:
            return lines
        time.sleep(0.01)


def test_every_grpc_request_leaves_one_access_line(tiny_server, captured) -> None:
    good = make_image_bytes(40, 40, fmt="PNG")
    with EncoderClient(tiny_server.grpc_target) as client:
        client.encode_images([good, good])
        with pytest.raises(InvalidMediaError):
            client.encode_images([b"not an image"])
    ok, refused = [r.fields for r in access_lines(captured, 2) if r.fields["method"].startswith("EncodeImages")]
    assert ok["code"] == "OK" and ok["images"] == 2 and ok["ms"] > 0 and ok["front_end"] == "grpc"
    assert refused["code"] == "INVALID_ARGUMENT" and refused["images"] == 1


def test_grpc_reads_and_echoes_x_request_id(tiny_server, captured) -> None:
    import grpc

    from mmproc.v1 import encoder_pb2 as pb
    from mmproc.v1 import encoder_pb2_grpc as pb_grpc

    request = pb.EncodeImagesRequest(images=[make_image_bytes(40, 40, fmt="PNG")])
    with grpc.insecure_channel(tiny_server.grpc_target) as channel:
        reply, call = pb_grpc.EncoderStub(channel).EncodeImages.with_call(
            request, metadata=(("x-request-id", "trace-abc-123"),), timeout=60
        )
    assert reply.request_id == "trace-abc-123"
    assert ("x-request-id", "trace-abc-123") in tuple(call.trailing_metadata())
    (line,) = [r for r in access_lines(captured, 1) if r.request_id == "trace-abc-123"]
    assert line.fields["code"] == "OK" and line.fields["method"] == "EncodeImages"
    assert line.fields["tokens"] == reply.embeddings[0].num_tokens and line.fields["transport"] == "serialized"


def test_a_grpc_error_echoes_x_request_id_in_its_trailers_and_its_reason_in_the_access_line(
    tiny_server, captured
) -> None:
    import grpc

    from mmproc.v1 import encoder_pb2 as pb
    from mmproc.v1 import encoder_pb2_grpc as pb_grpc

    request = pb.EncodeImagesRequest(images=[b"GIF89a-garbage"])
    with grpc.insecure_channel(tiny_server.grpc_target) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.EncoderStub(channel).EncodeImages(request, metadata=(("x-request-id", "trace-bad-9"),), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ("x-request-id", "trace-bad-9") in tuple(refused.value.trailing_metadata())
    (line,) = [r for r in access_lines(captured, 1) if r.request_id == "trace-bad-9"]
    assert (
        line.fields["code"] == "INVALID_ARGUMENT" and line.fields["reason"] == "too_many_pixels"
    )  # a GIF header of 26413 x 29281


def test_shed_load_is_logged_at_debug_and_bad_input_at_info(caplog) -> None:
    from mmproc.errors import InvalidMediaError, ResourceExhaustedError
    from service.frontends.error_mapping import map_error

    with caplog.at_level(logging.DEBUG, logger="service.frontends.error_mapping"):
        map_error(ResourceExhaustedError("overloaded", retry_after_s=0.1, cause="queue_delay"))
        map_error(InvalidMediaError("not an image", reason="undecodable"))
    shed, bad = [r for r in caplog.records if "refused" in r.getMessage()]
    assert shed.levelno == logging.DEBUG and "queue_delay" in shed.getMessage()
    assert bad.levelno == logging.INFO and "undecodable" in bad.getMessage()


def test_http_reads_and_echoes_x_request_id(tiny_server, captured) -> None:
    import base64

    import httpx

    body = {"images": [base64.b64encode(make_image_bytes(40, 40, fmt="PNG")).decode()]}
    reply = httpx.post(f"{tiny_server.http_url}/v1/encode", json=body, headers={"x-request-id": "web-7"}, timeout=60)
    assert reply.status_code == 200 and reply.headers["x-request-id"] == "web-7"
    assert reply.json()["request_id"] == "web-7"
    bad = httpx.post(f"{tiny_server.http_url}/v1/encode", json={"nope": 1}, headers={"x-request-id": "web-8"})
    assert bad.status_code == 400 and bad.json()["request_id"] == "web-8"
    (line,) = [r for r in access_lines(captured) if r.request_id == "web-7"]
    assert line.fields == {**line.fields, "front_end": "http", "code": "OK", "status": 200, "images": 1}
    odd = httpx.post(f"{tiny_server.http_url}/v1/encode", json=body, headers={"x-request-id": "a b" * 100})
    assert odd.headers["x-request-id"] != "a b" * 100  # not a sane id: replaced by ours


def test_json_lines_carry_iso_utc_times_and_the_access_fields() -> None:
    record = logging.LogRecord("mmproc.access", logging.INFO, __file__, 1, "%s", ("x",), None)
    record.fields = {"method": "EncodeImages", "code": "OK", "ms": 1.5}
    entry = json.loads(JsonFormatter().format(record))
    assert entry["time"].endswith("+00:00") and "T" in entry["time"]
    assert entry["method"] == "EncodeImages" and entry["ms"] == 1.5


def test_chatty_libraries_stay_at_warning_even_at_debug() -> None:
    from service.observe.logs import configure_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging("DEBUG", as_json=False)
        assert logging.getLogger("PIL").getEffectiveLevel() == logging.WARNING
        assert logging.getLogger("grpc").getEffectiveLevel() == logging.WARNING
        assert logging.getLogger("mmproc.models").getEffectiveLevel() == logging.DEBUG
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
        for name in ("PIL", "grpc"):
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_refusals_before_the_handler_carry_the_callers_request_id(captured, tmp_path) -> None:
    """A wrong token (HTTP and gRPC) and a body too large are logged and answered under the caller's id."""
    import grpc
    import httpx

    from mmproc.v1 import encoder_pb2 as pb
    from mmproc.v1 import encoder_pb2_grpc as pb_grpc

    socket_path = tmp_path / "encoder.sock"
    settings = test_settings(auth_token="s3cret-token-0123456789", grpc_address=f"unix:{socket_path}")
    server = ServiceThread(settings).start()
    try:
        url = server.http_url
        denied = httpx.post(f"{url}/v1/encode", json={"images": []}, headers={"x-request-id": "auth-1"})
        big = httpx.post(
            f"{url}/v1/encode", content=b"x" * (70 << 20), headers={"x-request-id": "big-1", "authorization": "no"}
        )
        with grpc.insecure_channel(f"unix:{socket_path}") as channel, pytest.raises(grpc.RpcError) as refused:
            pb_grpc.EncoderStub(channel).EncodeImages(
                pb.EncodeImagesRequest(images=[b"x"]), metadata=(("x-request-id", "auth-2"),), timeout=10
            )
    finally:
        server.stop()
    assert denied.status_code == 401 and denied.json()["request_id"] == "auth-1"
    assert denied.headers["x-request-id"] == "auth-1"
    assert big.status_code == 401 and big.headers["x-request-id"] == "big-1"  # auth is checked first
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ("x-request-id", "auth-2") in tuple(refused.value.trailing_metadata())
    for request_id, front_end in (("auth-1", "http"), ("big-1", "http"), ("auth-2", "grpc")):
        lines = [r for r in captured.records if r.request_id == request_id]
        assert any(
            r.name == "service.frontends.error_mapping" and "UNAUTHENTICATED" in r.getMessage() for r in lines
        ), request_id
        (access,) = [r for r in lines if r.name == "mmproc.access"]
        assert access.fields["code"] == "UNAUTHENTICATED" and access.fields["front_end"] == front_end
    assert not [r for r in captured.records if r.name == "service.frontends.error_mapping" and r.request_id == "-"]
    (listening,) = [r.getMessage() for r in captured.records if r.getMessage().startswith("listening:")]
    assert f"gRPC unix:{socket_path}, HTTP 127.0.0.1:{server.service.http_port};" in listening  # not "(port 1)"


def test_grpcs_error_for_a_reply_on_a_call_the_client_ended_is_one_info_line(capsys) -> None:
    from service.observe.logs import configure_logging, flush_logs

    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    try:
        configure_logging("INFO", as_json=False)
        try:
            raise RuntimeError('Failed "execute_batch"')
        except RuntimeError:
            logging.getLogger("grpc._cython.cygrpc").exception(
                "ExecuteBatchError raised in core by servicer method [%s]", "/mmproc.v1.Encoder/EncodeImages"
            )
        logging.getLogger("grpc._cython.cygrpc").error("another gRPC error")  # left as it is
        assert flush_logs()  # written by the log's own thread
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[2] for line in lines] == ["INFO", "ERROR"], lines
    assert "the client had ended the call" in lines[0] and "EncodeImages" in lines[0]
    assert not any("Traceback" in line for line in lines)


def test_a_log_reader_that_falls_behind_costs_log_lines_never_a_wait() -> None:
    from service.observe.log_writer import BackgroundWriter

    class Stuck(logging.Handler):  # a reader that stopped reading: every write blocks until released
        def __init__(self) -> None:
            super().__init__()
            self.unblock, self.lines = threading.Event(), []

        def emit(self, record: logging.LogRecord) -> None:
            self.unblock.wait()
            self.lines.append(self.format(record))

    stuck = Stuck()
    writer = BackgroundWriter(stuck, capacity=4)
    log = logging.getLogger("tests.log_writer")
    log.propagate, log.handlers[:] = False, [writer.queued]
    try:
        started = time.perf_counter()
        for n in range(20):
            log.warning("line %d", n)
        assert time.perf_counter() - started < 0.5  # nobody waited for the stuck writer
        assert 14 <= writer.queued.dropped <= 16  # 4 queued, one taken by the writer (which may not have yet)
        stuck.unblock.set()
        assert writer.flush()  # caught up
        log.warning("after")  # room again: the drop is reported before this line
        assert writer.flush()
    finally:
        writer.stop()
    dropped = writer.queued.dropped
    assert stuck.lines[-2:] == [f"{dropped} log records dropped: the log's reader fell behind", "after"]
    assert stuck.lines[:-2] == [f"line {n}" for n in range(20 - dropped)]
    # The report is the writer's own record: the server's text format reads it as no request's.
    from service.observe.log_writer import _dropped_record
    from service.observe.logs import text_formatter

    assert (
        text_formatter()
        .format(_dropped_record(dropped))
        .endswith(f"WARNING service.observe.log_writer [-] {dropped} log records dropped: the log's reader fell behind")
    )


def test_a_server_whose_stderr_nobody_reads_keeps_answering() -> None:
    """A full pipe (a stuck log shipper) blocked the front ends' loops at their next access line."""
    import subprocess
    import sys

    import grpc

    from mmproc.v1 import encoder_pb2 as pb
    from mmproc.v1 import encoder_pb2_grpc as pb_grpc
    from tests.service.app.test_lifecycle import wait_serving
    from tests.support.common import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.app.cli", "serve", "--grpc-address", f"127.0.0.1:{port}",
         "--http-address", "", "--preprocess-workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_serving(f"127.0.0.1:{port}")
        calls = 1500  # ~200 KB of access lines: three times what a pipe holds
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.EncoderStub(channel)
            for _ in range(calls):
                stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
        proc.terminate()
        lines = proc.stderr.read().decode().splitlines()  # read at last: what was queued follows
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sum("method=GetServerInfo code=OK" in line for line in lines) == calls
    assert not [line for line in lines if "dropped" in line]
