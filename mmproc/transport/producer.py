"""What a transport that hands out memory provides on the server: a producer, a destination per request."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class Destination(Protocol):
    """Where the runner writes one request's rows, and the handles the reply describes."""

    def output(self) -> Callable[[int], torch.Tensor] | None: ...  # rows -> (rows, hidden) on the device
    def on_written(self) -> Callable[[], None] | None: ...  # runner thread, after the last forward was enqueued
    async def written(self) -> None: ...  # the rows are in place
    def abandon(self) -> None: ...  # the request failed: give back what it held
    def deliver(self, rows: list[int]) -> Sequence[Any]: ...  # one handle per image of rows[i] rows


class Producer(Protocol):
    """A started transport on the server: destinations for the requests that ask for it."""

    transport: str
    status: str  # what it serves, in words (the start-up log, GetServerInfo.ipc_status)

    async def destination(self, session: str, rows: int, deadline: float | None, readers: int) -> Destination | None:
        """None when it has no room in time (the request then falls back to serialized, or is refused)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class StartContext:
    """What a transport's start-up is handed: the encoder's output, and each transport's config by name."""

    device: torch.device
    hidden: int
    dtype: torch.dtype
    configs: Mapping[str, object]
