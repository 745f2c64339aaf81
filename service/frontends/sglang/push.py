"""Where a part's rows go, and the bounded ZMQ push that takes them there.

zmq_to_scheduler: each TP rank of the language side registers `receive_url` ("ip:port") for a part's req_id with
POST /scheduler_receive_url, before or after /encode; `Registrations` keeps them (bounded: count and age) and lets
an /encode wait for `receive_count` of them. zmq_to_tokenizer: /encode itself names `prefill_host:embedding_port`.
Each destination gets its own copy: two frames, the header (header.py) and the raw row-major rows.

A push is bounded: ZMQ_IMMEDIATE queues nothing for a peer that is not connected, a small high-water mark
holds little for a slow one, and `timeout_s` ends the wait; the socket is then closed with linger 0. A dead or
slow receiver costs one timeout and a counted failure (`mmproc_sglang_pushes_total{outcome}`), never a stuck task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

logger = logging.getLogger(__name__)


class PushError(Exception):
    """A destination did not take a part within the timeout (or refused the connection)."""


@dataclass
class _Entry:
    urls: list[str] = field(default_factory=list)
    expected: int = 0  # receive_count, the language side's TP size
    created: float = field(default_factory=time.monotonic)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class Registrations:
    """req_id -> the receive URLs TP ranks registered. At most `max_entries`, each kept `ttl_s`: the oldest go
    first, so a language side that registers and never sends /encode cannot grow it. Event-loop only."""

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _entry(self, req_id: str) -> _Entry:
        self._expire()
        entry = self._entries.get(req_id)
        if entry is None:
            entry = self._entries[req_id] = _Entry()
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return entry

    def _expire(self) -> None:
        now = time.monotonic()
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if now - oldest.created <= self.ttl_s:
                return
            self._entries.popitem(last=False)

    def register(self, req_id: str, url: str, receive_count: int) -> None:
        entry = self._entry(req_id)
        entry.expected = max(entry.expected, receive_count)
        if url not in entry.urls:
            entry.urls.append(url)
        entry.changed.set()

    async def wait(self, req_id: str, timeout_s: float) -> tuple[list[str], int]:
        """(urls, expected) once `expected` ranks registered, or what there is after `timeout_s`."""
        entry = self._entry(req_id)
        deadline = time.monotonic() + timeout_s
        while not (entry.expected and len(entry.urls) >= entry.expected):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            entry.changed.clear()
            try:
                await asyncio.wait_for(entry.changed.wait(), left)
            except asyncio.TimeoutError:
                break
        return list(entry.urls), entry.expected

    def forget(self, req_id: str) -> None:
        self._entries.pop(req_id, None)


def tcp_endpoint(host_port: str) -> str:
    """'ip:port' or '[v6]:port' -> a ZMQ tcp:// endpoint; ValueError for anything else."""
    host, sep, port = host_port.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not HOST:PORT: {host_port!r}")
    return f"tcp://{host}:{port}"


class Pusher:
    """Sends two-frame messages on short-lived PUSH sockets of one asyncio ZMQ context."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._context = zmq.asyncio.Context()

    async def push(self, endpoint: str, frames: list[object]) -> None:
        """Hand `frames` to the receiver at `endpoint` (tcp://...) within timeout_s, else PushError."""
        sock = self._context.socket(zmq.PUSH)
        try:
            sock.setsockopt(zmq.IMMEDIATE, 1)  # no queue for a peer that never connected (a dead receiver)
            sock.setsockopt(zmq.SNDHWM, 4)
            sock.setsockopt(zmq.LINGER, int(self.timeout_s * 1000))  # a slow peer drains, for at most this long
            sock.connect(endpoint)
            await asyncio.wait_for(sock.send_multipart(frames, copy=False), self.timeout_s)
        except asyncio.TimeoutError:
            sock.setsockopt(zmq.LINGER, 0)
            raise PushError(f"{endpoint} took nothing within {self.timeout_s:g} s") from None
        except zmq.ZMQError as exc:
            sock.setsockopt(zmq.LINGER, 0)
            raise PushError(f"{endpoint}: {exc}") from None
        finally:
            sock.close()

    def close(self) -> None:
        self._context.destroy(linger=0)
