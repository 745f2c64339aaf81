"""Every front end's access line carries what the README promises: tokens and transport, not only gRPC unary's."""

from __future__ import annotations

import base64
import logging

import httpx

from mmproc.client import EncoderClient
from tests.support.common import wait_until
from tests.support.media_samples import make_image_bytes


def _access(caplog, method: str) -> dict | None:
    lines = [r.fields for r in caplog.records if r.name == "mmproc.access" and r.fields["method"] == method]
    return lines[0] if lines else None


def test_http_and_streaming_access_lines_name_tokens_and_transport(tiny_server, caplog) -> None:
    image = make_image_bytes(64, 48, fmt="PNG")
    with caplog.at_level(logging.INFO, logger="mmproc.access"):
        with EncoderClient(tiny_server.grpc_target, transport="serialized") as client:
            (stream,) = client.encode_images([image])  # serialized: the streaming RPC
        data = base64.b64encode(image).decode()
        reply = httpx.post(f"{tiny_server.http_url}/v1/encode", json={"images": [data]})
        assert reply.status_code == 200
        assert wait_until(lambda: _access(caplog, "EncodeImagesStream") and _access(caplog, "/v1/encode"), timeout=5)
    grpc_line, http_line = _access(caplog, "EncodeImagesStream"), _access(caplog, "/v1/encode")
    assert grpc_line["method"] == "EncodeImagesStream" and grpc_line["tokens"] == stream.shape[0]
    assert grpc_line["transport"] == "serialized"
    assert http_line["tokens"] == reply.json()["embeddings"][0]["num_tokens"] and http_line["transport"] == "json"
