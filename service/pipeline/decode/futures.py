"""The decode pool's futures: a request's results in order (or its first error), a worker's shipped file mapped as
soon as it lands, and a video still in its worker told to stop when its request is gone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from concurrent.futures import Future

from mmproc.errors import InvalidMediaError

logger = logging.getLogger("service.pipeline.decode.pool")


def cancel_running(future: Future) -> None:
    """A video still in its worker whose request is gone: the worker ends it at its next frame (video_worker)."""
    path = getattr(future, "cancel_path", None)
    if path is not None:
        with contextlib.suppress(OSError):
            open(path, "wb").close()
        future.add_done_callback(lambda _: _unlink(path))


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


async def first_error_in_order(tasks: list[asyncio.Future]) -> list:
    """Results of `tasks` in order, or the exception of the lowest-indexed failed task (see prepare_all)."""
    first_bad = len(tasks)
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                first_bad = min(first_bad, tasks.index(task))
        if first_bad < len(tasks):
            for task in tasks[first_bad + 1 :]:
                task.cancel()
            pending = {task for task in pending if tasks.index(task) < first_bad}
    if first_bad < len(tasks):
        exc = tasks[first_bad].exception()
        assert exc is not None
        if isinstance(exc, InvalidMediaError):
            raise exc.at_index(first_bad)
        raise exc
    return [task.result() for task in tasks]


def materialize(future: Future) -> None:
    """Done-callback (executor thread): turn a shipped file into a mapping now, so that no file outlives it."""
    if future.cancelled() or future.exception() is not None:
        return
    try:
        future.result().materialize()
    except OSError:
        logger.exception("decode pool: could not map a worker's result")  # to_image() raises it to the request
