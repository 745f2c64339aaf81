"""Which queued images the next batch takes: FIFO, or adaptive LIFO under overload ("Fail at Scale"; why FIFO is
the default: docs/benchmarks/overload.md). Both keep a request's images together and take at least one."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol, TypeVar

DISCIPLINES = ("fifo", "adaptive_lifo")


class QueuedImage(Protocol):
    job: object
    position: int

    @property
    def patches(self) -> int: ...


T = TypeVar("T", bound=QueuedImage)


def take_batch(queue: deque[T], fits: Callable[[int, int], bool], newest_first: bool) -> list[T]:
    """Remove and return the next batch (oldest at the left); fits(images, patches) says whether one more fits.
    newest_first: whole requests from the right instead of a prefix."""
    taken: list[T] = []
    patches = 0
    if not newest_first:
        while queue and (not taken or fits(len(taken), patches + queue[0].patches)):
            item = queue.popleft()
            taken.append(item)
            patches += item.patches
        return taken
    while queue:
        job = queue[-1].job
        first = len(queue) - 1
        while first > 0 and queue[first - 1].job is job:  # a request's images sit together, in order
            first -= 1
        run = [queue[i] for i in range(first, len(queue))]
        count = 0
        for item in run:
            if (taken or count) and not fits(len(taken) + count, patches + item.patches):
                break
            patches += item.patches
            count += 1
        if count == 0:
            break
        for _ in range(len(run)):
            queue.pop()
        queue.extend(run[count:])  # the rest of a request too large for this batch stays at the right
        taken.extend(run[:count])
        if count < len(run):
            break
    return taken
