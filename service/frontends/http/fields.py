"""Request fields of the HTTP routes that the gRPC front end carries in its own types: the deadline header, the
priority note, base64 or data: URI images."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING

from fastapi import Request

from mmproc.errors import InvalidRequestError, Reason
from mmproc.priority import BATCH, PRIORITY_HEADER, is_batch

if TYPE_CHECKING:
    pass


TIMEOUT_HEADER = "x-mmproc-timeout-ms"  # the client's deadline, as gRPC's grpc-timeout carries it
MAX_TIMEOUT_MS = 3_600_000


def request_budget_s(value: str | None, default_s: float) -> float:
    """Seconds the request may take: the timeout header (whole milliseconds), else `default_s`."""
    if value is None:
        return default_s
    text = value.strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_TIMEOUT_MS:
        raise InvalidRequestError(
            f"{TIMEOUT_HEADER} must be whole milliseconds in 1..{MAX_TIMEOUT_MS}, got {value!r}",
            reason=Reason.BAD_REQUEST,
        )
    return int(text) / 1000


def priority_fields(request: Request) -> dict[str, str]:
    """The access line's note of batch work (the header was checked at the door: a bad value never gets here)."""
    return {"priority": BATCH} if is_batch(request.headers.get(PRIORITY_HEADER)) else {}


def decode_image_field(value: str, index: int) -> bytes:
    """base64 (standard or URL-safe) or `data:<mime>;base64,<...>` -> bytes; InvalidRequestError otherwise."""
    payload = value
    if value.startswith("data:"):
        header, sep, payload = value.partition(",")
        if not sep or not header.endswith(";base64"):
            raise InvalidRequestError("data: URI must be base64-encoded", reason=Reason.BAD_REQUEST, index=index)
    payload = payload.strip()
    try:
        if "-" in payload or "_" in payload:
            return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError("image is not valid base64", reason=Reason.BAD_REQUEST, index=index) from None
