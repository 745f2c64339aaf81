"""The serialized transport's destination: plain tensors that the runner allocates and the front ends turn into
bytes; the fallback of every other transport."""

from __future__ import annotations

from collections.abc import Callable

import torch


class SerializedDestination:
    """Nothing handed out: each result's bytes travel in the reply."""

    lease = None

    def output(self) -> Callable[[int], torch.Tensor] | None:
        return None

    def on_written(self) -> Callable[[], None] | None:
        return None

    async def written(self) -> None:
        return None

    def abandon(self) -> None:
        return None

    def deliver(self, rows: list[int]) -> list[None]:
        return [None] * len(rows)
