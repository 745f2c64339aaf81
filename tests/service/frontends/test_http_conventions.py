"""HTTP conventions a client library expects: 413 for a body too large, Retry-After on 429 and 503, and the
service's error envelope for unknown paths and methods (never FastAPI's {"detail": ...})."""

from __future__ import annotations

import httpx

from mmproc.errors import ResourceExhaustedError, UnavailableError
from service.frontends.error_mapping import map_error
from tests.support.server import ServiceThread, test_settings


def test_a_body_over_the_limit_is_413_in_the_envelope() -> None:
    server = ServiceThread(test_settings(max_message_mb=6, max_request_mb=5, max_image_mb=5)).start()  # body cap 6 MiB
    try:
        body = b'{"images": ["' + b"A" * (7 << 20) + b'"]}'
        headers = {"content-type": "application/json", "x-request-id": "too-big-1"}
        reply = httpx.post(f"{server.http_url}/v1/encode", content=body, headers=headers)
    finally:
        server.stop()
    assert reply.status_code == 413, reply.text
    error = reply.json()["error"]
    assert error["reason"] == "request_too_large" and error["code"] == "INVALID_ARGUMENT"
    assert reply.json()["request_id"] == "too-big-1" and reply.headers["x-request-id"] == "too-big-1"


def test_unknown_paths_and_methods_use_the_envelope(tiny_server) -> None:
    missing = httpx.get(f"{tiny_server.http_url}/v1/nothing-here")
    assert missing.status_code == 404 and missing.json()["error"]["reason"] == "not_found"
    wrong = httpx.get(f"{tiny_server.http_url}/v1/encode")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert "allow" in {k.lower() for k in wrong.headers}  # which methods are allowed, as HTTP wants
    assert "detail" not in missing.json() and "detail" not in wrong.json()
    assert missing.json()["request_id"] == missing.headers["x-request-id"] != "-"


def test_info_prints_numbers_as_numbers_and_rules_as_values(tiny_server) -> None:
    info = httpx.get(f"{tiny_server.http_url}/v1/info").json()
    assert info["limits"]["max_image_bytes"] == 32 << 20 and info["max_message_bytes"] == 64 << 20
    assert info["key_store"]["max_bytes"] == 256 << 20
    rules = info["preprocess"]["rules"]
    assert rules["patch_size"] == 14 and rules["merge_kernel_size"] == [2, 2] and rules["family"] == "kimi_vl"
    assert rules["image_mean"] == [0.5, 0.5, 0.5]
    assert info["dtype"] == "float32"  # the spelling of /v1/encode's replies, not the proto's DTYPE_FLOAT32


def test_429_and_503_tell_the_client_when_to_retry() -> None:
    assert map_error(ResourceExhaustedError("queue full")).http_headers == {"Retry-After": "1"}
    assert map_error(UnavailableError("draining")).http_headers == {"Retry-After": "1"}
    assert map_error(ValueError("boom")).http_headers == {}


def test_cli_prints_its_version(capsys) -> None:
    import mmproc
    from service.app.cli import main

    try:
        main(["--version"])
    except SystemExit as exit_:
        assert exit_.code == 0
    assert capsys.readouterr().out.strip() == f"mmproc {mmproc.__version__}"
