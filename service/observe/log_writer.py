"""Log lines written by a thread of their own, from a bounded queue, so a slow stderr reader never blocks the event
loop; a full queue drops records, counted and reported (docs/reliability.md)."""

from __future__ import annotations

import atexit
import contextlib
import copy
import logging
import logging.handlers
import queue
import threading

QUEUED_RECORDS = 10_000  # ~9 MB of access-line records: tens of seconds of them at overload rates


class QueuedHandler(logging.handlers.QueueHandler):
    """Puts a finished record (message and traceback as text) on a bounded queue; drops it when the queue is full."""

    def __init__(self, records: queue.Queue) -> None:
        super().__init__(records)
        self.dropped = 0  # total, for the metric
        self._unreported = 0  # dropped since the last report line

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # text now: formatted later, on another thread, with no frames kept alive
        record = copy.copy(record)
        record.msg, record.args = record.getMessage(), None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        if self._unreported and self._put(_dropped_record(self._unreported)):
            self._unreported = 0
        if not self._put(record):
            self.dropped += 1
            self._unreported += 1

    def _put(self, record: logging.LogRecord) -> bool:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            return False
        return True


def _dropped_record(count: int) -> logging.LogRecord:
    return logging.LogRecord(
        "service.observe.log_writer", logging.WARNING, __file__, 0,
        f"{count} log records dropped: the log's reader fell behind", None, None,
    )  # fmt: skip


class BackgroundWriter:
    """`handler`'s writes moved to a thread of their own; `queued` is what loggers attach instead."""

    def __init__(self, handler: logging.Handler, capacity: int = QUEUED_RECORDS) -> None:
        self._records: queue.Queue = queue.Queue(capacity)
        self._handler = handler
        self.queued = QueuedHandler(self._records)
        # A daemon: a writer stuck on a reader that never reads must not keep the process from exiting.
        self._thread = threading.Thread(target=self._write, name="mmproc-log-writer", daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # what is queued is written before the process exits

    def _write(self) -> None:
        while (record := self._records.get()) is not None:
            if isinstance(record, threading.Event):  # flush(): all before it is written
                record.set()
            else:
                self._handler.handle(record)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until what is queued now has been written; False if that took over `timeout` s."""
        written = threading.Event()
        try:
            self._records.put(written, timeout=timeout)
        except queue.Full:
            return False
        return written.wait(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Write what is queued (for up to `timeout` s) and end the thread; idempotent."""
        atexit.unregister(self.stop)
        if self._thread.is_alive():
            with contextlib.suppress(queue.Full):
                self._records.put(None, timeout=timeout)
            self._thread.join(timeout)
