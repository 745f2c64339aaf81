"""`bench serve --clients N`: N spawned client processes that run each command together and pool their results.

Every process prepares, then calls `start()`; all begin at one instant of the monotonic clock, one time axis."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

START_MARGIN_S = 0.5  # every process has the start instant before it comes
READY_S = 300.0  # spawning: a fresh interpreter imports torch and opens its clients
READY = "ready"
T = TypeVar("T")


class Handler(Protocol):
    """A process's side: `handler(*command, start=start)` prepares, calls `start()` (it returns at the common
    instant), runs the timed part and returns what the parent gets; `close()` when the processes stop."""

    def __call__(self, *command: object, start: Callable[[], None]) -> object: ...

    def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class Failure:
    """What a client process raised, as text (an exception need not pickle)."""

    process: int
    text: str
    cancelled: bool = False  # it did not start because another process had failed


class Cancelled(Exception):
    """Another process failed while preparing: this one's command does not start."""


def deal(items: Sequence[T], n: int) -> list[list[T]]:
    """The share of each of `n` processes: process i gets items i, i + n, i + 2n, ..."""
    return [list(items[i::n]) for i in range(n)]


class ClientProcesses:
    """`n` spawned processes (spawn: safe beside CUDA), each with the handler `make(index)`; a context manager."""

    def __init__(self, n: int, make: Callable[[int], Handler]) -> None:
        self.n = n
        self._make = make
        self._pipes: list = []
        self._procs: list = []

    def __enter__(self) -> ClientProcesses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> ClientProcesses:
        """Spawn the processes; returns once each has built its handler."""
        context = multiprocessing.get_context("spawn")
        try:
            for index in range(self.n):
                mine, theirs = context.Pipe()
                proc = context.Process(target=_child, args=(theirs, self._make, index), daemon=True,
                                       name=f"bench-client-{index}")  # fmt: skip
                proc.start()
                theirs.close()  # the child holds it now: its exit reads as EOF here
                self._pipes.append(mine)
                self._procs.append(proc)
            _raise_failure(self._gather(time.perf_counter() + READY_S))
        except BaseException:
            self.close()
            raise
        return self

    def run(self, commands: Sequence[tuple], timeout_s: float) -> list:
        """Process i runs `commands[i]`; all start together. Their replies, in process order; raises RuntimeError
        with the first failure, TimeoutError when a process has not answered within `timeout_s`."""
        assert len(commands) == self.n
        deadline = time.perf_counter() + timeout_s
        for pipe, command in zip(self._pipes, commands):
            pipe.send(command)
        ready = self._gather(deadline)
        failed = [r for r in ready if isinstance(r, Failure)]
        at = None if failed else time.perf_counter() + START_MARGIN_S
        for pipe in self._pipes:
            pipe.send(at)
        replies = self._gather(deadline)
        _raise_failure(failed + replies)
        return replies

    def close(self) -> None:
        for pipe in self._pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for proc in self._procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for pipe in self._pipes:
            pipe.close()
        self._pipes, self._procs = [], []

    def _gather(self, deadline: float) -> list:
        replies = []
        for index, pipe in enumerate(self._pipes):
            if not pipe.poll(max(0.0, deadline - time.perf_counter())):
                raise TimeoutError(f"client process {index} did not answer in time")
            try:
                replies.append(pipe.recv())
            except EOFError:
                self._procs[index].join(5)
                raise RuntimeError(f"client process {index} exited (code {self._procs[index].exitcode})") from None
        return replies


def _raise_failure(replies: Sequence[object]) -> None:
    failures = [r for r in replies if isinstance(r, Failure)]
    if failures:
        first = min(failures, key=lambda f: f.cancelled)
        raise RuntimeError(f"client process {first.process} failed: {first.text}")


class _Start:
    """A handler's `start()`: says ready, then sleeps until the instant the parent names (None: cancelled)."""

    def __init__(self, pipe) -> None:  # noqa: ANN001 (a multiprocessing Connection)
        self._pipe = pipe
        self.asked = False

    def __call__(self) -> None:
        assert not self.asked, "start() once per command"
        self.asked = True
        self._pipe.send(READY)
        at = self._pipe.recv()
        if at is None:
            raise Cancelled("another client process failed before the start")
        time.sleep(max(0.0, at - time.perf_counter()))


def _child(pipe, make: Callable[[int], Handler], index: int) -> None:  # noqa: ANN001 (spawned)
    try:
        handler = make(index)
    except BaseException as exc:  # reported to the parent, which raises it
        pipe.send(Failure(index, f"{type(exc).__name__}: {exc}"))
        return
    pipe.send(READY)
    try:
        while (command := pipe.recv()) is not None:
            start = _Start(pipe)
            try:
                reply = handler(*command, start=start)
            except BaseException as exc:  # reported to the parent, which raises it
                reply = Failure(index, f"{type(exc).__name__}: {exc}", isinstance(exc, Cancelled))
            if not start.asked:  # done (or failed) before its start: keep step with the others
                pipe.send(reply if isinstance(reply, Failure) else READY)
                pipe.recv()
            pipe.send(reply)
    finally:
        handler.close()
