"""How late the server's event loop runs a timer that is due: every request's handler, refusal and reply waits that
long before it runs. A blocking call on the loop shows here first (docs/deploy.md, "Metrics")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

INTERVAL_S = 0.1  # ten samples a second: a stall of a few tens of ms is caught, the cost is nil


async def watch_loop_lag(observe: Callable[[float], None], interval_s: float = INTERVAL_S) -> None:
    """Sleep `interval_s`, then `observe` how much later than asked the loop woke us; until cancelled."""
    while True:
        asked = time.monotonic() + interval_s
        await asyncio.sleep(interval_s)
        observe(max(0.0, time.monotonic() - asked))
