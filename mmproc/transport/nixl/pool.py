"""The producer side of the NIXL transport: one pool registered once, lent in leases (mmproc/transport/leases/),
and the mover thread that owns the agent: it writes a lease into the consumer's memory when the consumer asks,
after checking that the lease is that session's, of that generation, and not freed (docs/nixl.md).

The write's completion is the lease's ack: the table frees it then, never before. The producer never waits on a
consumer: writes are posted and polled, each bounded by `transfer_timeout_s`; a lease never asked for is freed by
the TTL or when its session ends."""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from mmproc.transport.leases.allocator import SliceAllocator
from mmproc.transport.leases.records import Lease, LeaseState
from mmproc.transport.leases.table import LeaseTable
from mmproc.transport.nixl import engine
from mmproc.transport.nixl.config import NixlConfig
from mmproc.transport.nixl.messages import ReadAsk

logger = logging.getLogger(__name__)

Refuse = Callable[[int, str], None]  # (tag, reason): the session's answer to an ask it will not serve


@dataclass
class _Write:
    ask: ReadAsk
    lease: Lease
    peer: str
    refuse: Refuse
    handle: Any = None
    deadline: float = 0.0


class NixlPool:
    """The registered pool (pinned host memory, or GPU memory on a GPU server), its lease table and its mover."""

    def __init__(self, device: torch.device, config: NixlConfig) -> None:
        self.config = config
        self.device = device
        pinned = device.type == "cpu" and torch.cuda.is_available()
        self.memory = torch.empty(config.pool_bytes, dtype=torch.uint8, device=device, pin_memory=pinned)
        self.epoch = time.time_ns()
        self.pool_id = uuid.uuid4().hex
        allocator = SliceAllocator(config.pool_bytes, alignment=config.alignment, max_slices=config.max_leases)
        self.leases = LeaseTable(
            allocator, num_word_slots=config.max_leases, ttl_s=config.ttl_s, max_sessions=config.max_sessions
        )
        self._lent: dict[int, Lease] = {}  # lease id -> lease, while the table holds it
        self._writing: dict[int, _Write] = {}  # lease id -> its write in flight (one per lease)
        self._lock = threading.Lock()
        self._commands: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.agent = engine.make_agent("producer", config.net_devices, config.ucx_tls, config.port_range)
        self._registered = engine.register(self.agent, self.memory)  # once: the pool never grows
        self.writes_done = 0
        self.writes_failed = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mmproc-nixl-mover", daemon=True)
        self._thread.start()
        logger.info("NIXL pool %s: %d MiB of %s memory registered, agent %s", self.pool_id,
                    config.pool_bytes >> 20, engine.memory_kind(self.memory), self.agent.name)  # fmt: skip

    # -- the mover's commands (any thread) -----------------------------------------------------------------

    def _call(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except Exception as exc:  # handed to the caller
                future.set_exception(exc)

        self._commands.put(run)
        return future

    def add_peer(self, metadata: bytes) -> Future:
        """A consumer's agent metadata (its hello): the agent's name, once loaded, as a future."""
        return self._call(lambda: self.agent.add_remote_agent(metadata))

    def remove_peer(self, peer: str) -> None:
        def remove() -> None:
            if any(w.peer == peer for w in self._writing.values()):
                self._commands.put(remove)  # after its writes end (each bounded by the transfer timeout)
                return
            try:
                self.agent.remove_remote_agent(peer)
            except Exception as exc:
                logger.warning("NIXL: removing peer %s failed: %s", peer, exc)

        self._commands.put(remove)

    # -- leases (request path) -----------------------------------------------------------------------------

    def lent(self, lease: Lease) -> None:
        with self._lock:
            self._lent[lease.lease_id] = lease

    def region(self, lease: Lease, nbytes: int) -> torch.Tensor:
        """The lease's first `nbytes` bytes, (nbytes,) uint8 in the pool: where the runner writes."""
        return self.memory[lease.offset : lease.offset + nbytes]

    def ask(self, session_id: str, peer: str, ask: ReadAsk, refuse: Refuse) -> None:
        """Serve a consumer's read of its lease: checked here (the generation check), written by the mover."""
        reason, lease = self._check(session_id, ask)
        if reason is not None:
            logger.info("NIXL session %s: read of lease %d refused: %s", session_id, ask.lease_id, reason)
            refuse(ask.tag, reason)
            return
        assert lease is not None
        self._commands.put(lambda: self._post(_Write(ask, lease, peer, refuse)))

    def _check(self, session_id: str, ask: ReadAsk) -> tuple[str | None, Lease | None]:
        if ask.epoch != self.epoch:
            return "the producer restarted: the descriptor is of another pool", None
        with self._lock:
            lease = self._lent.get(ask.lease_id)
            if lease is None or self.leases.state_of(ask.lease_id) is not LeaseState.LEASED:
                return f"lease {ask.lease_id} is freed or unknown", None
            if lease.session_id != session_id:
                return f"lease {ask.lease_id} is not this session's", None
            if lease.generation != ask.generation:
                return f"lease {ask.lease_id} is of generation {lease.generation}, not {ask.generation}", None
            if not (lease.offset <= ask.offset and ask.offset + ask.nbytes <= lease.offset + lease.nbytes):
                return "the range lies outside the lease", None
            if time.monotonic() - lease.created_at > self.config.ttl_s - self.config.transfer_timeout_s:
                return f"lease {ask.lease_id} is too close to its TTL for a write to end before it", None
            if ask.nbytes <= 0 or ask.lease_id in self._writing:
                return f"lease {ask.lease_id} is empty or being read already", None
            self._writing[ask.lease_id] = _Write(ask, lease, "", lambda t, r: None)  # placeholder until posted
        return None, lease

    def forget(self, leases: list[Lease]) -> None:
        with self._lock:
            for lease in leases:
                self._lent.pop(lease.lease_id, None)

    # -- the mover thread ----------------------------------------------------------------------------------

    def _post(self, write: _Write) -> None:
        ask, agent = write.ask, self.agent
        try:
            src = agent.get_xfer_descs([(self.memory.data_ptr() + ask.offset, ask.nbytes, engine.device_id(self.memory))],
                                       engine.memory_kind(self.memory))  # fmt: skip
            dst = agent.get_xfer_descs([(ask.address, ask.nbytes, ask.device)], "VRAM" if ask.vram else "DRAM")
            write.handle = agent.initialize_xfer("WRITE", src, dst, write.peer, ask.tag.to_bytes(8, "little"))
            if agent.transfer(write.handle) == "ERR":
                raise RuntimeError("the transfer was refused by NIXL")
        except Exception as exc:
            self._end(write, f"the write could not start: {exc}")
            return
        write.deadline = time.monotonic() + self.config.transfer_timeout_s
        with self._lock:
            self._writing[ask.lease_id] = write

    def _fresh(self) -> bool:
        """Whether a write in flight was posted in the last 50 ms (mover thread)."""
        now = time.monotonic() + 0.05 - self.config.transfer_timeout_s
        with self._lock:
            return any(w.deadline > now for w in self._writing.values() if w.handle is not None)

    def _poll(self) -> None:
        with self._lock:
            writes = [w for w in self._writing.values() if w.handle is not None]
        for write in writes:
            try:
                state = self.agent.check_xfer_state(write.handle)
            except Exception as exc:
                state = f"ERR ({exc})"
            if state == "DONE":
                self._end(write, None)
            elif state != "PROC":
                self._end(write, f"the write failed: {state}")
            elif time.monotonic() > write.deadline:
                self._end(write, f"the write did not complete within {self.config.transfer_timeout_s:.0f} s")

    def _end(self, write: _Write, failure: str | None) -> None:
        """The write ended: its completion is the lease's ack; a failed one frees the lease too (the consumer
        is told, and the bytes it may have got are never used)."""
        if write.handle is not None:
            try:
                self.agent.release_xfer_handle(write.handle)
            except Exception as exc:  # still active: UCX cancels it when the peer goes
                logger.warning("NIXL: releasing the write of lease %d: %s", write.lease.lease_id, exc)
        lease = write.lease
        with self._lock:
            self._writing.pop(lease.lease_id, None)
            self._lent.pop(lease.lease_id, None)
        if failure is None:
            self.writes_done += 1
        else:
            self.writes_failed += 1
            logger.warning("NIXL: lease %d of session %s: %s", lease.lease_id, lease.session_id, failure)
            write.refuse(write.ask.tag, failure)
        try:
            if self.leases.release(lease.session_id, lease.lease_id):
                self.leases.confirm_acks({slot: lease.generation for slot in lease.slots})
        except KeyError:  # the session ended meanwhile: its leases were reclaimed with it
            pass

    def _run(self) -> None:
        last_expire = time.monotonic()
        while not self._stopping:
            try:  # writes in flight: poll them at once (over TCP they move only while polled), else sleep
                command = self._commands.get_nowait() if self._writing else self._commands.get(timeout=0.5)
            except queue.Empty:
                command = None
                time.sleep(0 if self._fresh() else 1e-3)  # a write stuck past 50 ms is polled each ms, not spun on
            try:
                for _ in range(self._commands.qsize() + 1):  # those queued now: one put back waits a round
                    if command is None:
                        break
                    command()
                    command = self._commands.get_nowait() if not self._commands.empty() else None
                if command is not None:
                    self._commands.put(command)
                if self._writing:
                    self._poll()
                if time.monotonic() - last_expire > 1.0:
                    self.forget(self.leases.expire())
                    last_expire = time.monotonic()
            except Exception:  # the mover must not die: the TTL still bounds what it holds
                logger.exception("NIXL mover failed; going on")

    def close(self) -> None:
        self._stopping = True
        self._commands.put(lambda: None)
        self._thread.join(5)
        try:
            self.agent.deregister_memory(self._registered)
        except Exception as exc:
            logger.warning("NIXL: deregistering the pool: %s", exc)
