"""Small helpers several test files share."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import torch


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative error in float64 on the CPU: ||got - want|| / ||want||."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return float((got - want).norm() / want.norm())


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0, interval: float = 0.05) -> bool:
    """Poll `predicate` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def free_port() -> int:
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
