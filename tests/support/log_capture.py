"""A logging handler that keeps records, stamped by the filter `mmproc serve` installs, for tests to read."""

from __future__ import annotations

import logging

from service.observe.logs import RequestIdFilter


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.addFilter(RequestIdFilter())
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
