"""POST /v1/encode takes one image as the raw body (content-type image/*), checked and limited as a base64 one."""

from __future__ import annotations

import base64

import httpx

from tests.support.media_samples import make_image_bytes


def test_a_raw_jpeg_body_is_one_image_like_its_base64_twin(tiny_server) -> None:
    image = make_image_bytes(96, 64, fmt="JPEG")
    url = f"{tiny_server.http_url}/v1/encode"
    raw = httpx.post(url, content=image, headers={"content-type": "image/jpeg", "x-request-id": "raw-1"}, timeout=30)
    as_json = httpx.post(url, json={"images": [base64.b64encode(image).decode()]}, timeout=30)
    assert raw.status_code == 200 == as_json.status_code, raw.text
    assert raw.json()["request_id"] == "raw-1"
    (got,), (want,) = raw.json()["embeddings"], as_json.json()["embeddings"]
    assert got["sha256"] == want["sha256"] and got["image_size"] == [96, 64] and "data" not in got
    with_data = httpx.post(f"{url}?return_embeddings=true", content=image, headers={"content-type": "image/jpeg"})
    assert base64.b64decode(with_data.json()["embeddings"][0]["data"])


def test_a_raw_body_is_validated_like_any_image(tiny_server) -> None:
    url = f"{tiny_server.http_url}/v1/encode"
    bad = httpx.post(url, content=b"not a png at all", headers={"content-type": "image/png"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["reason"] == "unsupported_format"
    malformed = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"}, timeout=30)
    assert malformed.status_code == 400 and malformed.json()["error"]["reason"] == "bad_request"
