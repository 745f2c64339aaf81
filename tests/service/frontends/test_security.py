"""Security defaults: loopback / unix socket 0600, the optional bearer token, bytes only (no URLs, no paths),
no pickle on any wire, no secret in logs or in `mmproc config`."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from mmproc.client import AsyncEncoderClient, EncoderClient
from mmproc.errors import ConfigError, InvalidMediaError, UnauthenticatedError
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from service.app.config_sources import load_settings
from service.app.settings import ServerSettings
from tests.support.media_samples import make_image_bytes
from tests.support.server import ServiceThread, serving, test_settings

TOKEN = "s3cret-Token-0123456789-abcdef"
IMAGE = make_image_bytes(40, 30, fmt="PNG")
ROOT = Path(__file__).resolve().parents[3]


def test_defaults_listen_on_loopback_only() -> None:
    defaults = ServerSettings.model_fields
    assert defaults["grpc_address"].default.startswith("127.0.0.1:")
    assert defaults["http_address"].default.startswith("127.0.0.1:")
    assert defaults["auth_token"].default is None


def test_unix_socket_is_created_0600_and_serves(tmp_path: Path) -> None:
    path = tmp_path / "encoder.sock"
    server = ServiceThread(test_settings(grpc_address=f"unix:{path}", http_address="")).start()
    try:
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        with EncoderClient(f"unix:{path}") as client:
            (embedding,) = client.encode_images([IMAGE])
        assert embedding.shape[1] == 256
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------------ token


@pytest.fixture(scope="module")
def locked_server() -> Iterator[ServiceThread]:
    with serving(test_settings(auth_token=TOKEN)) as server:
        yield server


def test_grpc_calls_need_the_token(locked_server: ServiceThread) -> None:
    target = locked_server.grpc_target
    for token in (None, "wrong-token-0123456789", TOKEN + "x", TOKEN[:-1]):
        with EncoderClient(target, token=token) as client, pytest.raises(UnauthenticatedError):
            client.encode_images([IMAGE])
    with EncoderClient(target, token=TOKEN) as client:
        assert client.encode_images([IMAGE])[0].shape[1] == 256
        assert client.server_info().model_name == "tiny"
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.EncoderStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.EncodeImages(pb.EncodeImagesRequest(images=[IMAGE]), metadata=(("authorization", TOKEN),))
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED  # "Bearer " is part of the value
        with pytest.raises(grpc.RpcError) as info:
            stub.GetServerInfo(pb.GetServerInfoRequest())
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_async_client_sends_the_token(locked_server: ServiceThread) -> None:
    async def run() -> int:
        async with AsyncEncoderClient(locked_server.grpc_target, token=TOKEN) as client:
            return (await client.encode_images([IMAGE]))[0].shape[1]

    assert asyncio.run(run()) == 256


def test_health_and_reflection_stay_open_for_probes(locked_server: ServiceThread) -> None:
    with grpc.insecure_channel(locked_server.grpc_target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert "mmproc.v1.Encoder" in ProtoReflectionDescriptorDatabase(channel).get_services()


def test_http_needs_the_token_except_for_probes(locked_server: ServiceThread) -> None:
    url = locked_server.http_url
    body = {"images": [base64.b64encode(IMAGE).decode()]}
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": TOKEN}):
        reply = httpx.post(f"{url}/v1/encode", json=body, headers=headers)
        assert reply.status_code == 401 and reply.headers["www-authenticate"] == "Bearer"
        assert reply.json()["error"]["code"] == "UNAUTHENTICATED"
    for path in ("/v1/info", "/nowhere", "/v1/../v1/info"):
        assert httpx.get(url + path).status_code == 401
    good = {"authorization": f"Bearer {TOKEN}"}
    assert httpx.post(f"{url}/v1/encode", json=body, headers=good).status_code == 200
    assert httpx.get(f"{url}/v1/info", headers=good).status_code == 200
    for path in ("/healthz", "/readyz", "/metrics"):
        assert httpx.get(url + path).status_code == 200


def test_the_token_never_reaches_logs_or_config_output(locked_server, caplog, capsys, monkeypatch) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = EncoderClient(locked_server.grpc_target, token="wrong-token-0123456789")
    with wrong as client, pytest.raises(UnauthenticatedError):
        client.encode_images([IMAGE])
    with EncoderClient(locked_server.grpc_target, token=TOKEN) as client:
        client.encode_images([IMAGE])
    assert TOKEN not in caplog.text and "wrong-token" not in caplog.text
    assert TOKEN not in repr(locked_server.settings) and TOKEN not in str(locked_server.settings.model_dump())

    from service.app.cli import main

    monkeypatch.setenv("MMPROC_AUTH_TOKEN", TOKEN)
    assert main(["config"]) == 0
    printed = capsys.readouterr().out
    assert TOKEN not in printed and json.loads(printed)["auth_token"] == "**********"


@pytest.mark.parametrize("token", ["short", " padded-token-0123456789 ", "tab\there-0123456789abc"])
def test_weak_or_odd_tokens_are_refused_at_start_up(token: str) -> None:
    with pytest.raises(ConfigError, match="auth_token"):
        load_settings(None, auth_token=token)


def test_an_empty_token_variable_means_no_token(monkeypatch) -> None:
    monkeypatch.setenv("MMPROC_AUTH_TOKEN", "")
    assert load_settings(None).auth_token is None


# ------------------------------------------------------------------------------------------------ bytes only


def test_http_takes_bytes_only_never_urls_or_paths(tiny_server) -> None:
    for value in ("https://example.com/cat.png", "file:///etc/passwd", "/etc/passwd", "data:image/png,rawbytes"):
        reply = httpx.post(f"{tiny_server.http_url}/v1/encode", json={"images": [value]})
        assert reply.status_code == 400, value
        assert reply.json()["error"]["reason"] in {"bad_request", "unsupported_format"}, value
    with EncoderClient(tiny_server.grpc_target) as client, pytest.raises(InvalidMediaError) as info:
        client.encode_images([b"https://example.com/cat.png"])
    assert info.value.reason == "unsupported_format"


def test_http_refuses_bodies_without_a_declared_length(tiny_server) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"images": ['
        yield b'"AAAA"]}'

    reply = httpx.post(
        f"{tiny_server.http_url}/v1/encode", content=chunks(), headers={"content-type": "application/json"}
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["reason"] == "bad_request"


_UNPICKLING = re.compile(
    r"^\s*(import|from)\s+(pickle|cPickle|_pickle|dill|cloudpickle|shelve|marshal|joblib)\b"
    r"|\bpickle\.loads?\(|allow_pickle\s*=\s*True|yaml\.load\((?![^)]*SafeLoader)|\bweights_only\s*=\s*False",
    re.MULTILINE,
)


# SGLang's encoder protocol frames its header as a pickle (its receiver loads it with an allow-listed unpickler):
# mmproc writes that one frame from plain values and never loads a pickle.
WRITES_SGLANG_PICKLE = {"service/frontends/sglang/header.py": "import pickle"}


def test_no_pickle_on_any_wire() -> None:
    """Neither the library nor the service unpickles anything (nor pickles, but SGLang's header frame), and
    checkpoints load without pickle."""
    offenders = []
    sources = sorted([*ROOT.glob("mmproc/**/*.py"), *ROOT.glob("service/**/*.py")])
    assert len(sources) > 100  # the tree was found
    for path in sources:
        if "/v1/" in path.as_posix():  # generated protobuf code
            continue
        text = path.read_text()
        name = path.relative_to(ROOT).as_posix()
        found = [m.group(0).strip() for m in _UNPICKLING.finditer(text)]
        offenders += [f"{name}: {hit}" for hit in found if hit != WRITES_SGLANG_PICKLE.get(name)]
        offenders += [
            f"{path.relative_to(ROOT)}: torch.load without weights_only=True"
            for call in re.findall(r"torch\.load\([^)]*\)", text)
            if "weights_only=True" not in call
        ]
    assert offenders == []
