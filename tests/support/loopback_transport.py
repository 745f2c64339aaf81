"""A third transport, in-process and for tests only: the server hands each request's rows out on a shelf that the
client in the same process reads and clears. It is added through the transports' table alone (LOOPBACK below, put
in a test's Table): no other file knows it, which is what tests/transport/test_transport_seam.py proves."""

from __future__ import annotations

import contextlib
import itertools
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from mmproc.client.readers import ReaderContext, Received
from mmproc.client.rpc import embedding_from_bytes
from mmproc.transport.producer import StartContext
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.transports import Transport

NAME = "loopback"
_HANDLE = struct.Struct("<QQQ")  # shelf key, first row, rows


class Shelf:
    """What the producer lent and the reader has not cleared yet: bounded in rows, like any pool."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.lent: dict[int, torch.Tensor] = {}
        self.lends = 0  # every lend so far: a test sees which requests took this transport
        self._keys = itertools.count(1)
        self._lock = threading.Lock()

    def lend(self, rows: torch.Tensor) -> int | None:
        with self._lock:
            if sum(t.shape[0] for t in self.lent.values()) + rows.shape[0] > self.max_rows:
                return None
            key = next(self._keys)
            self.lent[key] = rows
            self.lends += 1
            return key

    def give_back(self, key: int) -> None:
        with self._lock:
            self.lent.pop(key, None)


SHELF = Shelf(max_rows=1 << 16)


@dataclass(frozen=True)
class ShelfRows:
    key: int
    first: int
    rows: int
    transport: str = NAME


class LoopbackDestination:
    def __init__(self, rows: torch.Tensor, key: int) -> None:
        self._rows, self._key = rows, key

    def output(self) -> Callable[[int], torch.Tensor]:
        return lambda rows: self._rows[:rows]

    def on_written(self) -> None:
        return None

    async def written(self) -> None:
        return None

    def abandon(self) -> None:
        SHELF.give_back(self._key)

    def deliver(self, rows: list[int]) -> list[ShelfRows]:
        firsts = itertools.accumulate(rows, initial=0)
        return [ShelfRows(self._key, first, n) for first, n in zip(firsts, rows)]


class LoopbackProducer:
    transport = NAME
    status = "loopback active: rows on an in-process shelf (tests only)"

    def __init__(self, context: StartContext) -> None:
        self._context = context

    async def destination(self, session: str, rows: int, deadline: float | None, readers: int):  # noqa: ANN201
        c = self._context
        buffer = torch.empty(rows, c.hidden, dtype=c.dtype, device=c.device)
        key = SHELF.lend(buffer)
        return None if key is None else LoopbackDestination(buffer, key)

    def close(self) -> None:
        pass


def describe(header: pb.Embedding, handle: ShelfRows) -> None:
    header.handle = _HANDLE.pack(handle.key, handle.first, handle.rows)


class LoopbackReader:
    """Asks for the loopback transport by name and reads the shelf; everything else goes serialized."""

    def __init__(self, context: ReaderContext) -> None:
        self.fallback, self.device = context.fallback, context.device
        self._stub = context.targets.stubs[0]

    @contextlib.contextmanager
    def read(self, images: list[bytes], keys: Sequence[str], request_id: str, timeout: float) -> Iterator[Received]:
        request = pb.EncodeImagesRequest(
            images=images, request_id=request_id, keys=list(keys), transport_name=NAME,
            consumer=pb.ConsumerInfo(session_id="in-process"),
        )  # fmt: skip
        reply = self._stub.EncodeImages(request, timeout=timeout)
        if reply.transport_name != NAME:  # the server lent nothing: bytes in the reply
            yield Received(reply.embeddings, [embedding_from_bytes(e, self.device) for e in reply.embeddings])
            return
        handles = [_HANDLE.unpack(e.handle) for e in reply.embeddings]
        try:
            tensors = [SHELF.lent[key][first : first + rows].to(self.device) for key, first, rows in handles]
            yield Received(reply.embeddings, tensors)
        finally:
            for key in {key for key, _, _ in handles}:
                SHELF.give_back(key)  # the reader's ack: the producer may lend the rows again

    def shared(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        return self.fallback.shared(*args, **kwargs)

    def read_shared(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        return self.fallback.read_shared(*args, **kwargs)

    def videos(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        return self.fallback.videos(*args, **kwargs)

    def close(self) -> None:
        pass


LOOPBACK = Transport(
    NAME, pb.TRANSPORT_AUTO, LoopbackProducer, describe, "tests.support.loopback_transport:LoopbackReader"
)
