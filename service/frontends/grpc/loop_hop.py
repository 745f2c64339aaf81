"""Work run on the main loop and awaited from the gRPC loop. Unlike `run_coroutine_threadsafe`, every outcome
reaches the caller or `dispose`, even when the caller is cancelled as the work finishes (a budget hold is held)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def run_on(
    home: asyncio.AbstractEventLoop | None, coro: Coroutine[Any, Any, T], dispose: Callable[[T], object] | None = None
) -> T:
    """`coro` as a task on `home` (None: here), in a copy of the caller's context; cancelling the caller cancels
    it. A value that finishes after the caller left goes to `dispose`; a late exception is dropped."""
    here = asyncio.get_running_loop()
    if home is None or home is here:
        return await coro
    outcome: asyncio.Future[T] = here.create_future()
    started: list[asyncio.Task[T]] = []  # touched on `home` only
    gone = False  # the caller was cancelled (touched on `home` only)
    claimed = threading.Lock()  # whoever takes it owns the task's outcome: the caller or `discard`

    def discard(task: asyncio.Task[T]) -> None:  # on home: nobody takes this outcome
        if not task.cancelled() and task.exception() is None and dispose is not None:
            dispose(task.result())

    def deliver(task: asyncio.Task[T]) -> None:  # here
        if outcome.cancelled() or not claimed.acquire(blocking=False):
            return  # `cancel` (on home) discards it
        if task.cancelled():
            outcome.cancel()
        elif (exc := task.exception()) is not None:
            outcome.set_exception(exc)
        else:
            outcome.set_result(task.result())

    def finished(task: asyncio.Task[T]) -> None:  # on home
        if not gone:
            try:
                here.call_soon_threadsafe(deliver, task)
                return
            except RuntimeError:  # the caller's loop is closed
                pass
        if claimed.acquire(blocking=False):
            discard(task)

    def start() -> None:  # on home
        task = home.create_task(coro)
        started.append(task)
        task.add_done_callback(finished)

    def cancel() -> None:  # on home, after start (callbacks run in order)
        nonlocal gone
        gone = True
        task = started[0]
        task.cancel()
        if task.done() and claimed.acquire(blocking=False):  # finished before: its delivery found no caller
            discard(task)

    try:
        home.call_soon_threadsafe(start)
    except RuntimeError:  # `home` is closed
        coro.close()
        raise
    try:
        return await outcome
    except asyncio.CancelledError:
        home.call_soon_threadsafe(cancel)
        # Cancelled after the outcome arrived (the wake-up was already due): the value is ours to give up.
        with contextlib.suppress(asyncio.CancelledError, asyncio.InvalidStateError):
            if outcome.done() and outcome.exception() is None and dispose is not None:
                home.call_soon_threadsafe(dispose, outcome.result())
        raise
    except BaseException:  # the error's traceback holds this frame: nothing here may hold the error (a cycle)
        outcome = None  # type: ignore[assignment]  # delivered: nobody reads it again
        started.clear()  # the task keeps its error too
        raise
