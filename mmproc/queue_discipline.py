"""Which queued images the runner's next batch takes: FIFO, or adaptive LIFO under overload.

fifo           oldest first (the default): with admission bounding the queue by time (service/pipeline/overload.py) no
               image waits longer than that bound, and none is ever starved.
adaptive_lifo  oldest first until the oldest live image has waited `lifo_after_s`; then newest request first
               (Facebook's Wangle / "Fail at Scale"): the fresh requests, whose clients still wait, are served,
               and the old ones run out their deadline in the queue and are dropped unrun.
docs/benchmarks/overload.md has the measurement that picked the default.

Both keep a request's images together and in order within a batch (the runner writes each request's rows as one
contiguous run) and take at least one image, whatever the budget.
"""

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
    """Remove and return the next batch from `queue` (live images only, oldest at the left).

    fits(images taken, patches taken + the next image's) says whether one more image fits the budget.
    newest_first: take whole requests from the right (their images in position order) instead of a prefix.
    """
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
