"""The runner's batch choice: FIFO prefix, or newest request first with its images together and in order."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from mmproc.queue_discipline import take_batch


@dataclass
class Item:
    job: str
    position: int
    patches: int = 10


def queue(*jobs: tuple[str, int]) -> deque[Item]:
    return deque(Item(job, i) for job, count in jobs for i in range(count))


def budget(images: int, patches: int) -> bool:
    return images < 4 and patches <= 40


def names(items: list[Item]) -> list[tuple[str, int]]:
    return [(item.job, item.position) for item in items]


def test_fifo_takes_the_oldest_prefix_within_the_budget() -> None:
    q = queue(("a", 2), ("b", 3))
    assert names(take_batch(q, budget, newest_first=False)) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert names(list(q)) == [("b", 2)]


def test_newest_first_serves_the_latest_request_whole_and_in_order() -> None:
    q = queue(("a", 1), ("b", 2), ("c", 1))
    assert names(take_batch(q, budget, newest_first=True)) == [("c", 0), ("b", 0), ("b", 1), ("a", 0)]
    assert not q


def test_newest_first_splits_a_request_too_large_and_keeps_its_rest_queued() -> None:
    q = queue(("a", 1), ("b", 6))
    assert names(take_batch(q, budget, newest_first=True)) == [("b", 0), ("b", 1), ("b", 2), ("b", 3)]
    assert names(list(q)) == [("a", 0), ("b", 4), ("b", 5)]
    assert names(take_batch(q, budget, newest_first=True)) == [("b", 4), ("b", 5), ("a", 0)]


def test_an_image_over_the_budget_still_runs_alone() -> None:
    q = deque([Item("big", 0, patches=100), Item("next", 0)])
    assert names(take_batch(q, budget, newest_first=False)) == [("big", 0)]
    q = deque([Item("old", 0), Item("big", 0, patches=100)])
    assert names(take_batch(q, budget, newest_first=True)) == [("big", 0)]
    assert names(take_batch(q, budget, newest_first=True)) == [("old", 0)]
