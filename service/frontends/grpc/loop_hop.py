"""Work run on another thread's event loop and awaited here: how the gRPC front end, on a loop of its own
(service/app/grpc_loop.py), uses the pipeline and the reply budget, which are bound to the main loop.

`asyncio.run_coroutine_threadsafe` is not enough for a server: when the caller is cancelled (a client's deadline,
a cancelled call) just as the work finishes, the work's outcome is dropped unseen. An exception then reaches the
log as "Task exception was never retrieved", and a value that holds something (a reply-budget hold) is never given
back. Here every outcome reaches either the caller or `dispose`.
"""

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
    """`coro` as a task on `home`, its outcome returned (or raised) here. Cancelling the caller cancels the task. A
    value that finishes after the caller has gone is handed to `dispose` on `home`; a late exception is dropped.
    The task runs in a copy of the caller's context (contextvars: the access line's notes reach the caller's).
    `home` None or this loop: `coro` is awaited here."""
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
