"""An OpenAI chat request made ready for a `vllm serve` that loads images through mmproc (no vLLM imported here).

Each `image_url` part (a data: URI, or an http(s) URL the proxy downloads, bounded) is kept in mmproc under its
content key plus a per-request suffix, and the part gets `"uuid": key`, which vLLM's chat parser turns into the item's `multi_modal_uuids`
entry; a downloaded image is sent on as a data: URI of the same bytes, so vLLM sizes its placeholders from exactly
what mmproc encoded. The suffix: vLLM keeps zero rows under a key whose load failed, and the connector then refuses
that key, so a retried request must not reuse it (mmproc's embedding cache still encodes a repeated image once).
Failures are `ProxyError`s with an OpenAI-style status and message.
"""

from __future__ import annotations

import base64
import binascii
import copy
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from mmproc.engines.vllm import content_key
from mmproc.errors import DeadlineExceededError, InvalidMediaError, MmprocError, UnavailableError, UnknownKeyError

_MAGIC = [(b"\x89PNG", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"), (b"RIFF", "image/webp")]


@dataclass(frozen=True)
class ProxyConfig:
    """upstream: `vllm serve`'s base URL; target: mmproc's gRPC address. fallback: when mmproc is unreachable,
    forward the request anyway (vLLM encodes the images itself if its connector has `fallback_to_vllm`)."""

    upstream: str = "http://127.0.0.1:8000"
    target: str = "127.0.0.1:50051"
    token: str | None = None
    fallback: bool = False
    keep_timeout_s: float = 60.0
    upstream_timeout_s: float = 600.0
    max_images: int = 64
    max_body_bytes: int = 256 << 20
    max_image_bytes: int = 32 << 20
    fetch_urls: bool = True
    url_timeout_s: float = 10.0


class ProxyError(Exception):
    """A request the proxy answers itself: HTTP `status`, OpenAI error `type` and `code`, and the message."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

    def body(self) -> dict[str, Any]:
        kind = (
            "BadRequestError" if self.status < 500 else "ServiceUnavailableError" if self.status == 503 else "APIError"
        )
        return {"error": {"message": self.message, "type": kind, "param": None, "code": self.code}}


class Keeper(Protocol):
    async def keep(self, images: list[bytes], keys: list[str], *, timeout: float | None = None) -> list[Any]: ...
    async def lookup(self, keys: list[str], *, timeout: float | None = None) -> list[Any]: ...


@dataclass
class Prepared:
    body: dict[str, Any]
    keys: list[str]  # one per image part, in order (duplicates when an image repeats)
    fallback: bool = False  # mmproc was unreachable and the request goes on without it


def image_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The `image_url` content parts of every message, in order."""
    parts = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            parts += [p for p in content if isinstance(p, dict) and p.get("type") == "image_url"]
    return parts


async def prepare(body: dict[str, Any], keeper: Keeper, http: httpx.AsyncClient, config: ProxyConfig) -> Prepared:
    """A copy of `body` whose image parts carry mmproc keys, after mmproc kept every image."""
    if not isinstance(body.get("messages"), list):
        raise ProxyError(400, "the request has no messages list", "bad_request")
    body = copy.deepcopy(body)
    parts = image_parts(body)
    if len(parts) > config.max_images:
        raise ProxyError(400, f"{len(parts)} images, over the proxy's {config.max_images}", "too_many_images")
    images = [await _image_bytes(i, part, http, config) for i, part in enumerate(parts)]
    suffix = secrets.token_hex(4)
    keys = [f"{content_key(data)}-{suffix}" for data in images]
    unique = dict(zip(keys, images))  # one image twice in a request: kept once (keys of one call must differ)
    fallback = False
    if unique:
        try:
            await keeper.keep(list(unique.values()), list(unique), timeout=config.keep_timeout_s)
        except InvalidMediaError as exc:
            index = keys.index(list(unique)[exc.index]) if 0 <= exc.index < len(unique) else -1
            where = f"image {index}" if index >= 0 else "the request's images"
            raise ProxyError(400, f"mmproc refused {where}: {exc.message} [{exc.reason}]", "invalid_image") from exc
        except (UnavailableError, DeadlineExceededError) as exc:
            if not config.fallback:
                raise ProxyError(503, f"mmproc at {config.target} is unreachable: {exc}", "mmproc_unavailable") from exc
            fallback = True
        except MmprocError as exc:
            raise ProxyError(502, f"mmproc at {config.target} failed: {exc}", "mmproc_error") from exc
    for part, key in zip(parts, keys):
        part["uuid"] = key
    return Prepared(body, keys, fallback)


async def explain(keeper: Keeper, keys: list[str], config: ProxyConfig) -> str:
    """Why vLLM may have failed a request whose images were kept: asks mmproc for each key (vLLM's own answer is a
    bare "Internal server error"; the connector's reason is in vLLM's log)."""
    missing = []
    for key in dict.fromkeys(keys):
        try:
            await keeper.lookup([key], timeout=config.keep_timeout_s)
        except UnknownKeyError:
            missing.append(f"image {keys.index(key)} (key {key})")
        except MmprocError as exc:
            return f"mmproc at {config.target} became unreachable before vLLM loaded the images: {exc}"
    if missing:
        return (
            f"mmproc no longer holds {', '.join(missing)}: expired or evicted before vLLM loaded it "
            "(mmproc's --key-store-ttl-s / --key-store-mb); send the request again"
        )
    return "mmproc holds every image of the request; vLLM's log says why its connector failed it"


async def _image_bytes(index: int, part: dict[str, Any], http: httpx.AsyncClient, config: ProxyConfig) -> bytes:
    """The image's bytes (data: URI or downloaded); a downloaded image's part then carries them as a data: URI."""
    image_url = part.get("image_url")
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if not isinstance(url, str) or not url:
        raise ProxyError(400, f"image {index}: image_url has no url", "bad_request")
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if not header.endswith(";base64"):
            raise ProxyError(400, f"image {index}: a data: URI must be base64", "bad_request")
        if len(payload) > config.max_image_bytes * 4 // 3 + 4:
            raise ProxyError(400, f"image {index}: over {config.max_image_bytes} bytes", "image_too_large")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ProxyError(400, f"image {index}: bad base64 in its data: URI", "bad_request") from exc
    if not url.startswith(("http://", "https://")):
        raise ProxyError(400, f"image {index}: unsupported image URL (data: or http(s) only)", "bad_request")
    if not config.fetch_urls:
        raise ProxyError(400, f"image {index}: this proxy takes images as data: URIs only", "bad_request")
    data = await _download(index, url, http, config)
    part["image_url"] = {**image_url, "url": f"data:{_mime(data)};base64,{base64.b64encode(data).decode()}"}
    return data


async def _download(index: int, url: str, http: httpx.AsyncClient, config: ProxyConfig) -> bytes:
    chunks, size = [], 0
    try:
        async with http.stream("GET", url, timeout=config.url_timeout_s, follow_redirects=True) as resp:
            if resp.status_code != 200:
                raise ProxyError(400, f"image {index}: its URL answered HTTP {resp.status_code}", "image_url")
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > config.max_image_bytes:
                    raise ProxyError(400, f"image {index}: over {config.max_image_bytes} bytes", "image_too_large")
                chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise ProxyError(400, f"image {index}: could not download it: {type(exc).__name__}", "image_url") from exc
    return b"".join(chunks)


def _mime(data: bytes) -> str:
    return next((mime for magic, mime in _MAGIC if data.startswith(magic)), "application/octet-stream")
