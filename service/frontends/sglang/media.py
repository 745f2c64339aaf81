"""SGLang's `mm_items` -> image bytes. They are the user's strings: `data:` URIs, bare base64, http(s) URLs, paths,
or `{"url": ...}` dicts. data: URIs and base64 decode here and then meet the same validation as every image (the
pipeline's media step). Paths are refused: an encoder reads no file a request names. http(s) is fetched only when
`FetchConfig.enabled`: an allow-listed host, a public address (every address the name resolves to; the connection
goes to the checked one), no redirects, at most `max_bytes`, within `timeout_s`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import http.client
import ipaddress
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from mmproc.errors import InvalidRequestError, Reason


@dataclass(frozen=True)
class FetchConfig:
    enabled: bool = False
    allow_hosts: tuple[str, ...] = ()  # exact host names (lower case); empty: none
    max_bytes: int = 20 << 20
    timeout_s: float = 10.0
    allow_private: bool = False  # loopback / private / link-local addresses too (tests, a trusted network)


def _bad(message: str, index: int) -> InvalidRequestError:
    return InvalidRequestError(message, reason=Reason.BAD_REQUEST, index=index)


def item_string(item: object, index: int) -> str:
    """The media string of one mm_item (a string, or a dict's "url")."""
    if isinstance(item, Mapping):
        item = item.get("url")
    if not isinstance(item, str) or not item:
        raise _bad("mm_items entries must be strings or {'url': string}", index)
    return item


async def media_bytes(item: object, index: int, fetch: FetchConfig) -> bytes:
    text = item_string(item, index)
    scheme = text.split(":", 1)[0].lower() if ":" in text[:8] else ""
    if scheme in ("http", "https"):
        if not fetch.enabled:
            raise _bad("http(s) media URLs are not fetched by this encoder (send data: URIs or base64)", index)
        return await fetch_url(text, index, fetch)
    if scheme == "data" or not scheme:
        return decode_base64(text, index)
    raise _bad(f"unsupported media scheme {scheme!r}", index)


def decode_base64(text: str, index: int) -> bytes:
    """`data:<mime>;base64,<...>` or bare base64 (standard or URL-safe) -> bytes."""
    payload = text
    if text.startswith("data:"):
        header, sep, payload = text.partition(",")
        if not sep or not header.endswith(";base64"):
            raise _bad("data: URI must be base64-encoded", index)
    payload = payload.strip()
    try:
        if "-" in payload or "_" in payload:
            return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        # a path ("/img/cat.png") lands here too: this encoder reads no file a request names
        raise _bad("media is neither a data: URI nor base64 (paths are not read)", index) from None


def _checked_address(host: str, port: int, fetch: FetchConfig, index: int) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise _bad(f"cannot resolve media host {host!r}", index) from None
    addresses = [info[4][0] for info in infos]
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        if not ip.is_global and not fetch.allow_private:
            raise _bad(f"media host {host!r} resolves to a non-public address", index)
    return addresses[0]


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to an address checked beforehand, with the certificate checked for the URL's host name."""

    def __init__(self, address: str, host: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def _get(url: str, index: int, fetch: FetchConfig) -> bytes:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if host not in fetch.allow_hosts:
        raise _bad(f"media host {host!r} is not on the fetch allow-list", index)
    https = parts.scheme.lower() == "https"
    port = parts.port or (443 if https else 80)
    address = _checked_address(host, port, fetch, index)
    if https:
        conn: http.client.HTTPConnection = _PinnedHTTPS(address, host, port, fetch.timeout_s)
    else:
        conn = http.client.HTTPConnection(address, port, timeout=fetch.timeout_s)
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers={"Host": parts.netloc, "Accept": "image/*"})
        response = conn.getresponse()
        if response.status != 200:  # redirects included: where they lead was never checked
            raise _bad(f"media URL answered HTTP {response.status}", index)
        data = response.read(fetch.max_bytes + 1)
        if len(data) > fetch.max_bytes:
            raise InvalidRequestError(
                f"media URL body over {fetch.max_bytes} bytes", reason=Reason.TOO_LARGE, index=index
            )
        return data
    except (OSError, http.client.HTTPException) as exc:
        raise _bad(f"fetching the media URL failed: {type(exc).__name__}", index) from None
    finally:
        conn.close()


async def fetch_url(url: str, index: int, fetch: FetchConfig) -> bytes:
    """GET `url` off the event loop; every socket operation times out, and so does the whole."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(_get, url, index, fetch), fetch.timeout_s + 1)
    except asyncio.TimeoutError:
        raise _bad(f"fetching the media URL took over {fetch.timeout_s:g} s", index) from None
