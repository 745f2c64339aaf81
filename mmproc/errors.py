"""Typed errors: each class names its HTTP status and gRPC code, the one table the server and client map with."""

from __future__ import annotations

from enum import Enum


class Reason(str, Enum):
    """Why a request was refused as the client's fault (BadRequest details, HTTP 400 body, rejection metric)."""

    EMPTY = "empty"
    TOO_LARGE = "too_large"  # bytes of one image over the limit
    UNSUPPORTED_FORMAT = "unsupported_format"  # magic bytes not on the allowlist
    UNDECODABLE = "undecodable"  # allowlisted format, but the decoder refused it
    TRUNCATED = "truncated"  # the data ends before the image does
    TOO_MANY_PIXELS = "too_many_pixels"  # header declares more pixels than allowed (bomb guard)
    TOO_SMALL = "too_small"  # zero-sized or below the minimum side
    ASPECT_RATIO = "aspect_ratio"  # one side over `max_aspect_ratio` times the other
    TOO_MANY_SCANS = "too_many_scans"  # a JPEG with more scans than `max_jpeg_scans` (scan bomb)
    TOO_MANY_CHUNKS = "too_many_chunks"  # more JPEG segments / PNG chunks / GIF blocks than `max_chunks`
    COMPRESSION_RATIO = "compression_ratio"  # declares more pixels than its compressed data can hold (RLE bomb)
    DECODE_TIME = "decode_time"  # decoding ran past the image's time budget (scaled to its pixels)
    TOO_MANY_IMAGES = "too_many_images"  # images per request over the limit
    TOO_MANY_PATCHES = "too_many_patches"  # total patches per request over the limit
    REQUEST_TOO_LARGE = "request_too_large"  # total request bytes over the limit
    BAD_REQUEST = "bad_request"  # malformed request (bad base64, unknown transport, ...)
    # videos: checked from the container's index before any frame is decoded
    UNSUPPORTED_CODEC = "unsupported_codec"  # allowlisted container, but its video codec is not allowed
    NO_VIDEO_STREAM = "no_video_stream"  # a container without a video stream (audio only, subtitles ...)
    VIDEO_TOO_LONG = "video_too_long"  # duration (header or stream, the larger) over the limit
    FRAME_RATE = "frame_rate"  # frames per second over the limit
    TOO_MANY_FRAMES = "too_many_frames"  # sampled frames per video or per request over the limit
    DECODE_COST = "decode_cost"  # frames that must be decoded x pixels over the limit (decoder bomb)


class MmprocError(Exception):
    """Base of every typed mmproc error."""

    http_status: int = 500
    grpc_code: str = "INTERNAL"  # a grpc.StatusCode name (this package does not import grpc)


# HTTP's own status for a client fault more specific than 400 (gRPC keeps INVALID_ARGUMENT for every reason).
HTTP_STATUS_BY_REASON: dict[str, int] = {Reason.REQUEST_TOO_LARGE.value: 413}


class InvalidMediaError(MmprocError, ValueError):
    """The request (or one image in it) is invalid: HTTP 400 / INVALID_ARGUMENT.

    `index`: the offending item's position, -1 for the whole request. `reason`: a `Reason` value (a plain
    string on the client side, so that newer servers may add reasons)."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"
    kind = "media"  # carried in the ErrorInfo metadata, so that the client raises the same class

    def __init__(self, message: str, *, reason: Reason | str, index: int = -1, item: str = "image") -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason.value if isinstance(reason, Reason) else str(reason)
        self.index = index
        self.item = item  # what `index` counts in its request: "image" or "video"

    def __str__(self) -> str:
        where = f"{self.item} {self.index}" if self.index >= 0 else "request"
        return f"{where}: {self.message} [{self.reason}]"

    def at_index(self, index: int) -> InvalidMediaError:
        """The same error, naming the item's position in its request."""
        return type(self)(self.message, reason=self.reason, index=index, item=self.item)

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments defeat BaseException's default pickling; decode workers send these back.
        return _rebuild_invalid_media, (type(self), self.message, self.reason, self.index, self.item)


class InvalidRequestError(InvalidMediaError):
    """The request itself is invalid, not an item in it (counts, sizes, keys, headers): still HTTP 400.

    A subclass so that `except InvalidMediaError` keeps catching every 400; catch this first to tell them apart."""

    kind = "request"


def _rebuild_invalid_media(
    cls: type[InvalidMediaError], message: str, reason: str, index: int, item: str = "image"
) -> InvalidMediaError:
    return cls(message, reason=reason, index=index, item=item)


class ResourceExhaustedError(MmprocError):
    """Queue or pool full, or refused early as too late: HTTP 429 / RESOURCE_EXHAUSTED. Retry after
    `retry_after_s` (None: no estimate); `cause` names the limit (the refusal metric's label)."""

    http_status = 429
    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, *, retry_after_s: float | None = None, cause: str = "") -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.cause = cause


class UnavailableError(MmprocError, ConnectionError):
    """Not ready yet, or draining for shutdown: HTTP 503 / UNAVAILABLE. Retry elsewhere."""

    http_status = 503
    grpc_code = "UNAVAILABLE"


class UnauthenticatedError(MmprocError):
    """Missing or wrong bearer token: HTTP 401 / UNAUTHENTICATED."""

    http_status = 401
    grpc_code = "UNAUTHENTICATED"


class DeadlineExceededError(MmprocError, TimeoutError):
    """The request's deadline passed before its embeddings were ready: HTTP 504 / DEADLINE_EXCEEDED."""

    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"


class StaleSessionError(MmprocError):
    """The request names an IPC session the server does not hold: HTTP 409 / FAILED_PRECONDITION (the client
    reopens and resends)."""

    http_status = 409
    grpc_code = "FAILED_PRECONDITION"


class UnknownKeyError(MmprocError, KeyError):
    """No result is kept under the key (never sent, expired, evicted): HTTP 404 / NOT_FOUND; send it again."""

    http_status = 404
    grpc_code = "NOT_FOUND"

    def __init__(self, message: str, *, index: int = -1) -> None:
        super().__init__(message)
        self.message = message
        self.index = index

    def __str__(self) -> str:
        return self.message


class InternalError(MmprocError):
    """A server-side failure. The message seen by clients is generic; detail is only in the log."""

    http_status = 500


class ConfigError(MmprocError):
    """A bad setting or checkpoint found at start-up; the message names the setting or tensor."""


# The classes a server sends as their own gRPC status (everything else is INTERNAL to a client).
STATUS_ERRORS: tuple[type[MmprocError], ...] = (
    InvalidMediaError,
    ResourceExhaustedError,
    UnavailableError,
    DeadlineExceededError,
    UnauthenticatedError,
    StaleSessionError,
    UnknownKeyError,
)
