"""Logging set-up for `mmproc serve`: one request id on every line of a request, text or JSON lines.

The request id lives in a ContextVar set at the gRPC/HTTP entry (`request_context`). asyncio tasks
inherit it; work handed to threads carries it with `contextvars.copy_context().run` (see
`service.engine`). `RequestIdFilter` copies it onto every record the handler writes, so library
code just logs with `logging.getLogger(__name__)` and never passes ids around.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import uuid
from collections.abc import Iterator
from contextvars import ContextVar

NO_REQUEST = "-"
REQUEST_ID: ContextVar[str] = ContextVar("mmproc_request_id", default=NO_REQUEST)

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


@contextlib.contextmanager
def request_context(request_id: str) -> Iterator[str]:
    """Every log line inside (this task, and threads started with a copy of its context) names `request_id`."""
    token = REQUEST_ID.set(request_id)
    try:
        yield request_id
    finally:
        REQUEST_ID.reset(token)


class RequestIdFilter(logging.Filter):
    """Adds `record.request_id` (the current request's id, or "-") to every record; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, request_id, message (+ exception when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "request_id": getattr(record, "request_id", NO_REQUEST),
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str, as_json: bool) -> logging.Handler:
    """Replace the root handlers with one stderr handler (text or JSON lines) that stamps request ids."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    return handler
