"""The NIXL transport on the wire: its start-up on the server, a range's handle in the reply, and its consumer
session (the Session RPC's hello names it and carries the consumer's agent metadata; SessionOpened the pool's
epoch; later messages are read requests up and refusals down). Protocol: docs/nixl.md."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from mmproc.transport.nixl import engine, messages
from mmproc.transport.nixl.config import NAME, NixlConfig
from mmproc.transport.nixl.destination import NixlProducer, PoolRange
from mmproc.transport.producer import StartContext
from mmproc.v1 import encoder_pb2 as pb

__all__ = ["NAME", "describe", "session", "start_producer"]
logger = logging.getLogger(__name__)


def describe(header: pb.Embedding, handle: PoolRange) -> None:
    header.handle = handle.handle.pack()


def start_producer(context: StartContext) -> NixlProducer | str:
    """The registered pool on the encoder's device (GPU memory on a GPU server, host memory on a CPU one); or why
    NIXL does not serve here."""
    config = context.configs.get(NAME)
    if not isinstance(config, NixlConfig) or not config.enabled:
        return "not enabled (--nixl)"
    reason = engine.unavailable_reason()
    if reason is not None:
        return reason
    from mmproc.transport.nixl.pool import NixlPool  # noqa: PLC0415 - torch allocations only when it starts

    try:
        registered = NixlPool(context.device, config)
    except Exception as exc:  # UCX found no usable device, registration failed, ...
        return f"the NIXL agent could not start: {type(exc).__name__}: {exc}"
    return NixlProducer(registered, context.hidden, context.dtype)


def _refused(reason: str) -> pb.SessionEvent:
    return pb.SessionEvent(refused=pb.SessionRefused(reason=reason))


async def session(
    producer: NixlProducer | None, hello: pb.SessionHello, requests: AsyncIterator[pb.SessionRequest], context: object
) -> AsyncIterator[pb.SessionEvent]:
    """One consumer's session: its agent loaded, its leases read on request, all of them reclaimed (and the agent
    dropped) when the stream ends."""
    if producer is None:
        yield _refused("this server does not serve NIXL")
        return
    registered = producer.registered
    try:
        peer = await asyncio.wrap_future(registered.add_peer(hello.transport_info))
    except Exception as exc:
        yield _refused(f"the consumer's NIXL metadata could not be loaded: {exc}")
        return
    session_id = registered.leases.open_session(f"nixl pid {hello.pid}@{hello.hostname} agent {peer}")
    loop = asyncio.get_running_loop()
    answers: asyncio.Queue[pb.SessionEvent | None] = asyncio.Queue()

    def refuse(tag: int, reason: str) -> None:  # any thread
        event = pb.SessionEvent(transport_message=messages.refused(tag, reason))
        loop.call_soon_threadsafe(answers.put_nowait, event)

    async def listen() -> None:
        try:
            async for message in requests:
                kind = message.WhichOneof("kind")
                if kind == "transport_message":
                    try:
                        ask = messages.ReadAsk.unpack(message.transport_message)
                    except ValueError as exc:
                        logger.warning("NIXL session %s: bad message: %s", session_id, exc)
                        continue
                    registered.ask(session_id, peer, ask, refuse)
                elif kind == "release" and message.release.unread:  # the consumer will not read these
                    mine = [lease for lease in registered.leases.live_leases() if lease.session_id == session_id]
                    unread = [lease for lease in mine if lease.lease_id in message.release.lease_ids]
                    registered.forget([lease for lease in unread if registered.leases.abandon(lease)])
        finally:
            answers.put_nowait(None)

    listener = asyncio.create_task(listen())
    logger.info("NIXL session %s opened for pid %d@%s (agent %s)", session_id, hello.pid, hello.hostname, peer)
    try:
        info = messages.opened(registered.epoch, registered.agent.name)
        yield pb.SessionEvent(opened=pb.SessionOpened(session_id=session_id, transport_info=info))
        while (event := await answers.get()) is not None:
            yield event
    finally:
        listener.cancel()
        reclaimed = registered.leases.close_session(session_id)
        registered.forget(reclaimed)
        registered.remove_peer(peer)
        logger.info("NIXL session %s closed; %d leases reclaimed", session_id, len(reclaimed))
