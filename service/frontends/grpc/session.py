"""The consumer-session stream (gRPC `Session`): its hello names a transport of the table, whose session serves it
(`serve_session`). CUDA IPC's (`ipc_session`): hello -> pool identity, releases, and reclaim of every lease of the
session when its stream ends (the consumer exited or was killed).
Who owns, acks and releases a tensor-parallel group's shared leases: docs/ipc.md."""

from __future__ import annotations

import importlib
import logging
from collections.abc import AsyncIterator, Mapping

import grpc

from mmproc.transport.cuda_ipc.node import node_identity
from mmproc.transport.cuda_ipc.pool import IpcPool
from mmproc.transport.leases.records import LeaseNotOwnedError, UnknownLeaseError
from mmproc.transport.producer import Producer
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.cuda_ipc import pool_info_pb
from mmproc.wire.transports import Table

logger = logging.getLogger(__name__)


def refusal(hello: pb.SessionHello) -> str | None:
    """Why this consumer cannot use CUDA IPC with us, or None. Legacy CUDA IPC handles need the same node
    and, under containers, a shared PID namespace (Kubernetes: shareProcessNamespace: true)."""
    hostname, boot_id, pid_ns = node_identity()
    if hello.boot_id and boot_id and hello.boot_id != boot_id:
        return f"consumer runs on another node ({hello.hostname}), not {hostname}"
    if hello.pid_namespace and pid_ns and hello.pid_namespace != pid_ns:
        return "consumer is in a different PID namespace; share it (shareProcessNamespace: true) or use serialized"
    return None


async def serve_session(
    table: Table,
    producers: Mapping[str, Producer],
    requests: AsyncIterator[pb.SessionRequest],
    context: grpc.aio.ServicerContext,
) -> AsyncIterator[pb.SessionEvent]:
    """A consumer session of the transport its hello names (empty: the first of the table with sessions, IPC)."""
    first = await anext(requests, None)
    if first is None or first.WhichOneof("kind") != "hello":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first Session message must be a hello")
        return
    hello = first.hello
    with_sessions = [t for t in table.ordered if t.session is not None]
    chosen = table.by_name.get(hello.transport) if hello.transport else (with_sessions or [None])[0]
    if chosen is None or chosen.session is None:
        yield pb.SessionEvent(refused=pb.SessionRefused(reason=f"no sessions of transport {hello.transport!r}"))
        return
    module, _, name = chosen.session.partition(":")
    serve = getattr(importlib.import_module(module), name)
    async for event in serve(producers.get(chosen.name), hello, requests, context):
        yield event


async def run_session(
    pool: IpcPool | None, requests: AsyncIterator[pb.SessionRequest], context: grpc.aio.ServicerContext
) -> AsyncIterator[pb.SessionEvent]:
    """CUDA IPC's session on `pool`, hello included (what tests drive directly)."""
    first = await anext(requests, None)
    if first is None or first.WhichOneof("kind") != "hello":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first Session message must be a hello")
        return
    async for event in _ipc(pool, first.hello, requests):
        yield event


async def ipc_session(
    producer: Producer | None, hello: pb.SessionHello, requests: AsyncIterator[pb.SessionRequest], context: object
) -> AsyncIterator[pb.SessionEvent]:
    """The table's session of CUDA IPC: its producer's pool."""
    async for event in _ipc(getattr(producer, "pool", None), hello, requests):
        yield event


async def _ipc(
    pool: IpcPool | None, hello: pb.SessionHello, requests: AsyncIterator[pb.SessionRequest]
) -> AsyncIterator[pb.SessionEvent]:
    reason = "this server has no IPC pool" if pool is None else refusal(hello)
    if reason is not None:
        logger.info("IPC session from pid %d@%s refused: %s", hello.pid, hello.hostname, reason)
        yield pb.SessionEvent(refused=pb.SessionRefused(reason=reason))
        return
    assert pool is not None
    session_id = pool.leases.open_session(f"pid {hello.pid}@{hello.hostname} on {hello.device_uuid}")
    logger.info("IPC session %s opened for pid %d@%s (%s)", session_id, hello.pid, hello.hostname, hello.device_uuid)
    try:
        yield pb.SessionEvent(opened=pb.SessionOpened(session_id=session_id, pool=pool_info_pb(pool.identity)))
        async for message in requests:
            if message.WhichOneof("kind") != "release":
                continue
            for lease_id in message.release.lease_ids:
                try:
                    if message.release.unread:
                        _abandon_unread(pool, session_id, lease_id)
                    else:
                        pool.leases.release(session_id, lease_id)
                except (UnknownLeaseError, LeaseNotOwnedError) as exc:
                    logger.warning("IPC session %s: bad release of lease %d: %s", session_id, lease_id, exc)
            pool.notify_released()
    finally:
        reclaimed = pool.leases.close_session(session_id)
        logger.info("IPC session %s closed; %d leases reclaimed", session_id, len(reclaimed))


def _abandon_unread(pool: IpcPool, session_id: str, lease_id: int) -> None:
    """The consumer never mapped the pool: free at once. A lease with several readers is released instead (other
    ranks may be reading); the TTL frees it."""
    for lease in pool.leases.live_leases():
        if lease.lease_id == lease_id and lease.session_id == session_id:
            if lease.readers == 1:
                pool.leases.abandon(lease)
            else:
                logger.warning(
                    "IPC session %s could not read lease %d shared by %d readers: held until the TTL (%.0f s)",
                    session_id,
                    lease_id,
                    lease.readers,
                    pool.leases.ttl_s,
                )
                pool.leases.release(session_id, lease_id)
            return
    raise UnknownLeaseError(lease_id)
