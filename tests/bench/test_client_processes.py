"""`ClientProcesses`: commands run in every process from one instant, replies in order, a failure named."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from mmproc.bench.client_processes import START_MARGIN_S, ClientProcesses, deal


class _Clock:
    """Prepares (process 1 fails when told to), starts, answers (its index, perf_counter at its start)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __call__(self, fail: bool, *, start: Callable[[], None]) -> tuple[int, float]:
        if fail and self.index == 1:
            raise ValueError("no images")
        start()
        return self.index, time.perf_counter()

    def close(self) -> None:
        pass


def test_processes_start_together_and_survive_a_failure() -> None:
    with ClientProcesses(3, _Clock) as processes:
        asked = time.perf_counter()
        replies = processes.run([(False,)] * 3, timeout_s=30)
        assert [index for index, _ in replies] == [0, 1, 2]
        starts = [at for _, at in replies]
        assert min(starts) >= asked + START_MARGIN_S * 0.9  # this process's clock: they share it
        assert max(starts) - min(starts) < 0.1  # one instant (each sleeps until it)
        with pytest.raises(RuntimeError, match="client process 1 failed: ValueError: no images"):
            processes.run([(True,)] * 3, timeout_s=30)  # the others never start
        assert len(processes.run([(False,)] * 3, timeout_s=30)) == 3  # still in step


def test_deal_gives_process_i_every_nth_item() -> None:
    assert deal(list(range(7)), 3) == [[0, 3, 6], [1, 4], [2, 5]]
