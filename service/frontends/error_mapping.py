"""Where typed mmproc errors become gRPC statuses (with google.rpc details) and HTTP responses; the codes are
mmproc/errors.py's. Anything untyped is INTERNAL with a generic message. Every failure is counted and logged here,
once: expected ones (4xx, 503, 504) as one INFO line, unexpected ones as ERROR with the traceback."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from mmproc.errors import HTTP_STATUS_BY_REASON, STATUS_ERRORS, InvalidMediaError, ResourceExhaustedError
from service.observe.logs import NO_REQUEST, REQUEST_ID, REQUEST_ID_HEADER

if TYPE_CHECKING:
    from service.observe.metrics import Metrics

logger = logging.getLogger(__name__)

ERROR_DOMAIN = "mmproc"
RETRY_AFTER_S = 1  # what a 429 / 503 tells an HTTP client to wait before trying again
INTERNAL_MESSAGE = "internal error; see the server log"


@dataclass(frozen=True)
class MappedError:
    grpc_code: grpc.StatusCode
    http_status: int
    message: str
    reason: str  # machine-readable: a Reason value for 400s, a refusal's cause, else the code name in lower case
    index: int = -1
    retry_after_s: float | None = None  # the server's estimate for a 429 (None: RETRY_AFTER_S)
    kind: str = ""  # a 400's: "media" (InvalidMediaError) or "request" (InvalidRequestError)

    @property
    def http_headers(self) -> dict[str, str]:
        if self.http_status not in (429, 503):
            return {}
        wait = RETRY_AFTER_S if self.retry_after_s is None else max(1, math.ceil(self.retry_after_s))  # whole seconds
        return {"Retry-After": str(wait)}

    def http_body(self, request_id: str) -> dict[str, object]:
        error: dict[str, object] = {"code": self.grpc_code.name, "reason": self.reason, "message": self.message}
        if self.index >= 0:
            error["index"] = self.index
        return {"request_id": request_id, "error": error}


def map_error(exc: BaseException, *, metrics: Metrics | None = None) -> MappedError:
    """Classify any exception; count it as a rejection and log it."""
    mapped = _classify(exc)
    if mapped.grpc_code is grpc.StatusCode.INTERNAL:
        logger.error("unexpected error", exc_info=exc)
    else:  # shed load at DEBUG: hundreds a second under overload, and each request's access line has the reason
        where = f" (item {mapped.index} of the request)" if mapped.index >= 0 else ""
        level = logging.DEBUG if mapped.grpc_code is grpc.StatusCode.RESOURCE_EXHAUSTED else logging.INFO
        logger.log(level, "refused: %s %s%s: %s", mapped.grpc_code.name, mapped.reason, where, mapped.message)
    if metrics is not None:
        metrics.rejections.labels(mapped.reason).inc()
    return mapped


def _classify(exc: BaseException) -> MappedError:
    if isinstance(exc, InvalidMediaError):
        http = HTTP_STATUS_BY_REASON.get(exc.reason, exc.http_status)
        return MappedError(grpc.StatusCode.INVALID_ARGUMENT, http, exc.message, exc.reason, exc.index, kind=exc.kind)
    if isinstance(exc, ResourceExhaustedError):
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
        return MappedError(code, exc.http_status, str(exc), exc.cause or code.name.lower(), -1, exc.retry_after_s)
    if isinstance(exc, STATUS_ERRORS):
        code = grpc.StatusCode[exc.grpc_code]
        return MappedError(code, exc.http_status, str(exc), code.name.lower())
    return MappedError(grpc.StatusCode.INTERNAL, 500, INTERNAL_MESSAGE, "internal")


def to_grpc_status(mapped: MappedError, items: str = "images") -> grpc.Status:
    """A grpc.Status with google.rpc details and the request id as `x-request-id` trailing metadata; `items`: the
    repeated field a bad item's index refers to ("images", "videos")."""
    status = status_pb2.Status(code=getattr(code_pb2, mapped.grpc_code.name), message=mapped.message)
    if mapped.grpc_code is grpc.StatusCode.INVALID_ARGUMENT:
        field = f"{items}[{mapped.index}]" if mapped.index >= 0 else items
        bad_request = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=field, description=f"{mapped.reason}: {mapped.message}"
                )
            ]
        )
        info = error_details_pb2.ErrorInfo(
            reason=mapped.reason, domain=ERROR_DOMAIN, metadata={"index": str(mapped.index), "kind": mapped.kind}
        )
        for detail in (bad_request, info):
            packed = any_pb2.Any()
            packed.Pack(detail)
            status.details.append(packed)
    elif mapped.grpc_code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        wait = RETRY_AFTER_S if mapped.retry_after_s is None else mapped.retry_after_s
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(max(1, round(wait * 1000)))
        for detail in (
            error_details_pb2.RetryInfo(retry_delay=delay),
            error_details_pb2.ErrorInfo(reason=mapped.reason, domain=ERROR_DOMAIN),
        ):
            packed = any_pb2.Any()
            packed.Pack(detail)
            status.details.append(packed)
    grpc_status = rpc_status.to_status(status)
    request_id = REQUEST_ID.get()
    if request_id == NO_REQUEST:
        return grpc_status
    return grpc_status._replace(trailing_metadata=(*grpc_status.trailing_metadata, (REQUEST_ID_HEADER, request_id)))


def end_call(context: grpc.aio.ServicerContext, status: grpc.Status) -> None:
    """End the call with `status` once its handler returns: `abort_with_status` without its exception, whose
    traceback made a reference cycle of every refused call (docs/reliability.md, "Overload")."""
    context.set_code(status.code)
    context.set_details(status.details)
    context.set_trailing_metadata(status.trailing_metadata)
