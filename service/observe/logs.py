"""Logging set-up for `mmproc serve`: one request id on every line of a request, text or JSON lines.

The request id lives in a ContextVar set at the gRPC/HTTP entry (`request_context`). asyncio tasks
inherit it; work handed to threads carries it with `contextvars.copy_context().run` (see
`service.pipeline.requests`). `RequestIdFilter` copies it onto every record the handler writes, so library
code just logs with `logging.getLogger(__name__)` and never passes ids around.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import sys
import uuid
from collections.abc import Iterator
from contextvars import ContextVar

from service.observe.log_writer import BackgroundWriter

NO_REQUEST = "-"
REQUEST_ID: ContextVar[str] = ContextVar("mmproc_request_id", default=NO_REQUEST)

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
REQUEST_ID_HEADER = "x-request-id"  # read and echoed by both front ends (HTTP header, gRPC metadata)
# Chatty libraries stay at WARNING whatever --log-level says: their DEBUG lines drown a request's.
QUIET_LOGGERS = ("grpc", "PIL", "asyncio", "urllib3", "httpx", "httpcore", "uvicorn.access", "multipart", "torch")
ACCESS = logging.getLogger("mmproc.access")


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def log_access(front_end: str, method: str, code: str, elapsed_s: float, **fields: object) -> None:
    """The one INFO line every request leaves, whatever its outcome: front end, method, final code, latency and
    what the caller knows (images, tokens, transport); structured under `--log-json`."""
    fields = {"front_end": front_end, "method": method, "code": code, "ms": round(elapsed_s * 1e3, 2), **fields}
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    ACCESS.info("%s", text, extra={"fields": fields})


@contextlib.contextmanager
def request_context(request_id: str) -> Iterator[str]:
    """Every log line inside (this task, and threads started with a copy of its context) names `request_id`."""
    token = REQUEST_ID.set(request_id)
    try:
        yield request_id
    finally:
        # ValueError: closed from another context (gRPC finalizing a cancelled stream): nothing to restore there
        with contextlib.suppress(ValueError):
            REQUEST_ID.reset(token)


class RequestIdFilter(logging.Filter):
    """Adds `record.request_id` (the current request's id, or "-") to every record; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


class ClosedCallFilter(logging.Filter):
    """gRPC logs `ExecuteBatchError raised in core by servicer method`, an ERROR with a traceback, when a reply is
    sent on a call the client has just ended (its deadline fired between the handler's last check and the send):
    the client's doing, already counted as the client saw it. Kept, as one INFO line without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith("ExecuteBatchError raised in core"):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args, record.exc_info, record.exc_text = (
                "a reply was not sent: the client had ended the call (%s)", (record.getMessage(),), None, None,
            )  # fmt: skip
        return True


CLOSED_CALL = ClosedCallFilter()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, request_id, message, an access line's
    fields (+ exception when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "request_id": getattr(record, "request_id", NO_REQUEST),
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update({k: v for k, v in fields.items() if k not in entry})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:  # formatted already (a record that came through the writer's queue)
            entry["exception"] = record.exc_text
        return json.dumps(entry)


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(text: str) -> str:
    """`text` with every non-printable character (CR, LF, other line breaks, escapes, bidi marks) escaped as
    `\\n`, `\\x1b`, `\\u2028`...: what a client put in a message can never start a line of its own."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _ESCAPES.get(c) or repr(c)[1:-1] for c in text)


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT, one record a line: the message and request id escaped (one_line), and a traceback's lines,
    escaped too, indented under it; so every line that starts at column 0 is a record's own first line. A record
    that passed no RequestIdFilter (the log writer's own report) reads as no request's."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        safe = dict(record.__dict__, message=one_line(record.message))
        safe["request_id"] = one_line(str(safe.get("request_id", NO_REQUEST)))
        safe["name"] = one_line(record.name)
        line = self._fmt % safe  # type: ignore[operator]
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        for text in (record.exc_text, record.stack_info and self.formatStack(record.stack_info)):
            if text:
                line += "".join(f"\n    {one_line(part)}" for part in text.splitlines())
        return line


def text_formatter() -> logging.Formatter:
    return TextFormatter()


_writer: BackgroundWriter | None = None


def flush_logs(timeout: float = 5.0) -> bool:
    """Wait until every record logged so far has been written (tests read what was written)."""
    return _writer.flush(timeout) if _writer is not None else True


def dropped_log_records() -> int:
    """Records dropped because the log's writer was behind (mmproc_log_records_dropped_total)."""
    return _writer.queued.dropped if _writer is not None else 0


class StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a line is written, not the one it was made with (a stream that a
    caller replaced and closed since, as pytest's capture does, would fail every later line)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def configure_logging(level: str, as_json: bool, *, background: bool = True) -> logging.Handler:
    """Replace the root handlers with one stderr handler (text or JSON lines) that stamps request ids; written
    by a thread of its own when `background` (service/observe/log_writer.py), else by the thread that logs.
    Returns the handler the root logger has."""
    global _writer
    stream = StderrHandler()
    stream.setFormatter(JsonFormatter() if as_json else text_formatter())
    if _writer is not None:  # configured again (tests): the earlier writer finishes its queue first
        _writer.stop()
        _writer = None
    if background:
        _writer = BackgroundWriter(stream)
    handler = _writer.queued if _writer is not None else stream
    handler.addFilter(RequestIdFilter())  # on the logging thread: the request id is that thread's context
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    logging.getLogger("grpc._cython.cygrpc").addFilter(CLOSED_CALL)  # once: the same object is not added twice
    return handler
