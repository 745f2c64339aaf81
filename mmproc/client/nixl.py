"""The client half of the NIXL transport (sync client): the session stream, the agent with its registered receive
arena, and reads. A read asks the server, over the session, to write a lease into the arena; the NIXL notification
that follows the bytes says they landed, a refusal on the stream says they never will. Protocol: docs/nixl.md."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import torch

from mmproc.errors import DeadlineExceededError, UnavailableError
from mmproc.transport.cuda_ipc.consumer import TypedViews
from mmproc.transport.cuda_ipc.node import node_identity
from mmproc.transport.leases.allocator import Slice, SliceAllocator
from mmproc.transport.nixl import engine, messages
from mmproc.transport.nixl.config import NAME
from mmproc.transport.nixl.messages import Handle, ReadAsk
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from mmproc.wire.dtypes import PB_TO_DTYPE

logger = logging.getLogger(__name__)

ARENA_BYTES = 256 << 20  # the consumer's registered receive memory: a reply larger than this goes serialized


class ReadRefusedError(UnavailableError):
    """The server would not (or could no longer) write a lease: freed, reused, another session's, or of a pool
    that restarted. Nothing was read; encode again."""


@dataclass
class _Read:
    handles: list[Handle]
    span: Slice  # its range of the arena
    tag: int


class NixlSession:
    """This process's NIXL session with one server: the stream (its end reclaims every lease), the agent and the
    arena, registered once, on the client's device (GPU memory where it has one)."""

    def __init__(self, stub: pb_grpc.EncoderStub, device: torch.device, arena_bytes: int = ARENA_BYTES) -> None:
        self._stub, self.device = stub, device
        self.arena = torch.empty(arena_bytes, dtype=torch.uint8, device=device)
        self.agent = engine.make_agent("consumer")  # UCX_* of this process's environment choose its interfaces
        self._registered = engine.register(self.agent, self.arena)
        self._space = SliceAllocator(arena_bytes, alignment=4096, max_slices=1024)
        self._views = TypedViews(self.arena)
        self._lock = threading.Lock()  # the agent, the arena's allocator, the arrivals
        self._tags = itertools.count(1)
        self._arrived: set[int] = set()
        self._refused: dict[int, str] = {}
        self._late: dict[int, Slice] = {}  # tag -> arena range of a read given up on: freed once it ends
        self._outbox: queue.Queue[pb.SessionRequest | None] | None = None
        self._call = None
        self.session_id: str | None = None
        self.epoch = 0
        self.refused: str | None = None

    def open(self) -> str | None:
        """The session (opened, or reopened after the server restarted); None when the server refuses NIXL."""
        with self._lock:
            if self.session_id is not None and self._call is not None and self._call.is_active():
                return self.session_id
            if self.refused is not None:
                return None
            hostname, boot_id, pid_ns = node_identity()
            hello = pb.SessionHello(pid=os.getpid(), hostname=hostname, boot_id=boot_id, pid_namespace=pid_ns,
                                    transport=NAME, transport_info=self.agent.get_agent_metadata())  # fmt: skip
            outbox: queue.Queue[pb.SessionRequest | None] = queue.Queue()
            outbox.put(pb.SessionRequest(hello=hello))
            call = self._stub.Session(iter(outbox.get, None))
            first = next(call)
            if first.WhichOneof("kind") == "refused":
                self.refused = first.refused.reason
                logger.warning("server refused NIXL (%s): using the serialized transport", self.refused)
                outbox.put(None)
                return None
            self.epoch, _ = messages.opened_info(first.opened.transport_info)
            self._outbox, self._call, self.session_id = outbox, call, first.opened.session_id
            self._refused.clear()
            for span in self._late.values():  # the old session's writes ended with it
                self._space.free(span)
            self._late.clear()
            threading.Thread(target=self._watch, args=(call,), name="mmproc-nixl-session", daemon=True).start()
            return self.session_id

    def reset(self) -> None:
        """Forget the session (the server no longer holds it); the next `open` makes a new one."""
        with self._lock:
            if self._outbox is not None:
                self._outbox.put(None)
            if self._call is not None:
                self._call.cancel()
            self._outbox = self._call = self.session_id = None

    def _watch(self, call) -> None:  # noqa: ANN001
        with contextlib.suppress(grpc.RpcError):
            for event in call:
                if event.WhichOneof("kind") == "transport_message":
                    tag, reason = messages.refusal(event.transport_message)
                    with self._lock:
                        self._refused[tag] = reason
        with self._lock:
            if self._call is call:
                self._call = None

    def send(self, ask: ReadAsk) -> None:
        """One read request up the stream (tests send hostile ones through it too)."""
        if self._outbox is None:
            raise UnavailableError("no NIXL session")
        self._outbox.put(pb.SessionRequest(transport_message=ask.pack()))

    def give_back(self, lease_ids: list[int]) -> None:
        if self._outbox is not None and lease_ids:
            self._outbox.put(pb.SessionRequest(release=pb.LeaseRelease(lease_ids=lease_ids, unread=True)))

    @contextlib.contextmanager
    def read(self, reply: pb.EncodeImagesResponse, timeout: float) -> Iterator[list[torch.Tensor] | None]:
        """(tokens_i, hidden) views of the reply's embeddings in the arena, valid inside the `with`; None when the
        arena has no room (the leases are given back unread). Raises ReadRefusedError, DeadlineExceededError."""
        handles = [Handle.unpack(e.handle) for e in reply.embeddings]
        by_lease: dict[int, list[Handle]] = {}
        for h in handles:
            by_lease.setdefault(h.lease_id, []).append(h)
        reads = self._start(list(by_lease.values()))
        if reads is None:
            self.give_back(sorted(by_lease))
            yield None
            return
        try:
            self._wait([r.tag for r in reads], time.monotonic() + timeout)
            where = {h: (r.span.offset + h.offset - r.handles[0].offset) for r in reads for h in r.handles}
            yield [
                self._views.view(where[h], h.nbytes, PB_TO_DTYPE[e.dtype], tuple(e.shape))
                for h, e in zip(handles, reply.embeddings, strict=True)
            ]
        finally:
            self._finish(reads)

    def _start(self, leases: list[list[Handle]]) -> list[_Read] | None:
        reads: list[_Read] = []
        with self._lock:
            for group in leases:
                group.sort(key=lambda h: h.offset)
                nbytes = group[-1].offset + group[-1].nbytes - group[0].offset
                span = self._space.allocate(max(nbytes, 1))
                if span is None:
                    for r in reads:
                        self._space.free(r.span)
                    return None
                reads.append(_Read(group, span, next(self._tags)))
        vram, device = self.arena.is_cuda, engine.device_id(self.arena)
        for r in reads:
            first, last = r.handles[0], r.handles[-1]
            nbytes = last.offset + last.nbytes - first.offset
            address = self.arena.data_ptr() + r.span.offset
            self.send(ReadAsk(r.tag, first.epoch, first.lease_id, first.generation, first.offset, nbytes, address,
                              device, vram))  # fmt: skip
        return reads

    def _wait(self, tags: list[int], deadline: float) -> None:
        """Until every tag's bytes landed; progresses the agent (NIXL's progress thread is off) meanwhile."""
        waiting, pause, spin_until = set(tags), 20e-6, time.monotonic() + 1.0
        while True:
            with self._lock:
                self._collect()
                refused = [self._refused[t] for t in waiting if t in self._refused]
                waiting -= self._arrived
                dead = self._call is None
            if refused:
                raise ReadRefusedError(f"the server refused the read: {refused[0]}")
            if not waiting:
                return
            if dead:
                raise ReadRefusedError("the NIXL session ended before the read completed")
            if time.monotonic() > deadline:
                raise DeadlineExceededError(f"{len(waiting)} NIXL reads did not complete in time")
            # Over TCP the bytes move only while this agent progresses: poll at once for the first second (a read
            # of 20 MB takes milliseconds), then back off so that a stuck one costs little CPU.
            time.sleep(0 if time.monotonic() < spin_until else pause)
            pause = min(pause * 2, 1e-3) if time.monotonic() >= spin_until else pause

    def _collect(self) -> None:
        """Take the agent's notifications (lock held): each is a landed read's tag."""
        for notes in self.agent.get_new_notifs().values():
            for note in notes:
                tag = int.from_bytes(note[:8], "little")
                late = self._late.pop(tag, None)
                if late is not None:
                    self._space.free(late)
                else:
                    self._arrived.add(tag)
        for tag in [t for t in self._late if t in self._refused]:
            self._space.free(self._late.pop(tag))
            del self._refused[tag]

    def _finish(self, reads: list[_Read]) -> None:
        """Free each read's arena range, unless its write may still land there (then once it ends)."""
        with self._lock:
            for r in reads:
                if r.tag in self._arrived or r.tag in self._refused:
                    self._arrived.discard(r.tag)
                    self._refused.pop(r.tag, None)
                    self._space.free(r.span)
                elif self._call is None:
                    self._space.free(r.span)  # the session is gone: the server writes nothing more
                else:
                    self._late[r.tag] = r.span

    def close(self) -> None:
        if self._outbox is not None:
            self._outbox.put(None)
        if self._call is not None:
            self._call.cancel()
        with contextlib.suppress(Exception):
            self.agent.deregister_memory(self._registered)
