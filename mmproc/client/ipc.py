"""The client half of the CUDA IPC transport (sync client): the session stream, reading leased slices with
stream-ordered waits and acks, and the process-wide handle cache."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Iterator

import grpc
import torch

from mmproc.client.wire import PB_DTYPES
from mmproc.errors import InternalError
from mmproc.transport.cuda_ipc import device_uuid
from mmproc.transport.ipc_pool import PoolIdentity, SliceDescriptor
from mmproc.transport.node import node_identity
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)


class IpcClient:
    """This process's IPC session with one server, plus the handle cache (sync client).

    The session is a long-lived bidirectional stream: its first reply names the pool; releases go up it;
    when this process dies the stream ends and the server reclaims every lease it held.
    """

    def __init__(self, stub: pb_grpc.EncoderStub, device: torch.device, handle_cache: bool) -> None:
        from mmproc.transport.ipc_consumer import HandleCache

        self._stub = stub
        self._device = device
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._uuid = device_uuid(self._index)
        self._cache = HandleCache.process_wide() if handle_cache else HandleCache(enabled=False)
        self._lock = threading.Lock()
        self._outbox: queue.Queue[pb.SessionRequest | None] | None = None
        self._call = None
        self.session_id: str | None = None
        self.identity: PoolIdentity | None = None
        self.refused: str | None = None
        self.fallbacks = 0

    def counters(self) -> dict[str, int]:
        stats = self._cache.stats
        return {"opens": stats.opens, "closes": stats.closes, "open_failures": stats.open_failures,
                "fallbacks": self.fallbacks}  # fmt: skip

    def _session(self) -> str | None:
        """Open (or reopen after the server restarted) the session; None when IPC is refused."""
        with self._lock:
            if self.session_id is not None and self._call is not None and self._call.is_active():
                return self.session_id
            if self.refused is not None:
                return None
            hostname, boot_id, pid_ns = node_identity()
            hello = pb.SessionHello(
                pid=os.getpid(), hostname=hostname, boot_id=boot_id, pid_namespace=pid_ns, device_uuid=self._uuid
            )
            outbox: queue.Queue[pb.SessionRequest | None] = queue.Queue()
            outbox.put(pb.SessionRequest(hello=hello))
            call = self._stub.Session(iter(outbox.get, None))
            first = next(call)
            if first.WhichOneof("kind") == "refused":
                self.refused = first.refused.reason
                logger.warning("server refused CUDA IPC (%s): using the serialized transport", self.refused)
                outbox.put(None)
                return None
            opened = first.opened
            info = opened.pool
            self._outbox, self._call, self.session_id = outbox, call, opened.session_id
            # The stream only ends when the server goes away; notice it at once rather than on the next request.
            threading.Thread(target=self._watch, args=(call,), name="mmproc-ipc-session", daemon=True).start()
            self.identity = PoolIdentity(
                pool_id=info.pool_id,
                epoch=info.epoch,
                device_uuid=info.device_uuid,
                ipc_handle=info.ipc_handle,
                pool_bytes=info.pool_bytes,
                num_word_slots=info.num_word_slots,
                data_offset=0,
            )
            return self.session_id

    def _watch(self, call) -> None:
        with contextlib.suppress(grpc.RpcError):
            for _ in call:
                pass
        with self._lock:
            if self._call is call:
                self._call = None

    def reset(self) -> None:
        """Forget the session (the server no longer holds it); the next request opens a new one."""
        with self._lock:
            if self._outbox is not None:
                self._outbox.put(None)
            if self._call is not None:
                self._call.cancel()
            self._outbox = self._call = self.session_id = None

    def request(self, images: list[bytes], request_id: str, timeout: float) -> pb.EncodeImagesResponse | None:
        session = self._session()
        if session is None:
            return None
        request = pb.EncodeImagesRequest(
            images=images,
            request_id=request_id,
            transport=pb.TRANSPORT_IPC,
            consumer=pb.ConsumerInfo(session_id=session, device_uuid=self._uuid),
        )
        reply = self._stub.EncodeImages(request, timeout=timeout)
        if reply.transport != pb.TRANSPORT_IPC:
            self.fallbacks += 1
        return reply

    @contextlib.contextmanager
    def read(self, reply: pb.EncodeImagesResponse, timeout: float) -> Iterator[list[torch.Tensor] | None]:
        """Views of the reply's slices, ordered after the producer's writes; ack + release on exit.
        None when the pool cannot be opened (the lease is given back unread)."""
        assert self.identity is not None
        descs = [_descriptor(emb.ipc) for emb in reply.embeddings]
        lease_ids = sorted({d.lease_id for d in descs})
        if any(emb.ipc.pool_id != self.identity.pool_id for emb in reply.embeddings):
            raise InternalError("reply names a pool other than this session's")
        try:
            pool = self._cache.acquire(self.identity, self._device)  # opens on a miss, retrying once
        except Exception as exc:
            logger.warning("cannot open the server's IPC pool (%s): this request goes serialized", exc)
            self.fallbacks += 1
            self._send(pb.LeaseRelease(lease_ids=lease_ids, unread=True))
            yield None
            return
        stream = torch.cuda.current_stream(self._device)
        try:
            pool.wait_ready(descs[0], stream, timeout)  # one lease (slot, generation) for the whole request
            yield [
                pool.view(d, getattr(torch, PB_DTYPES[emb.dtype]), tuple(emb.shape))
                for d, emb in zip(descs, reply.embeddings)
            ]
        finally:
            pool.ack(descs[0], stream)
            self._send(pb.LeaseRelease(lease_ids=lease_ids))
            self._cache.release(pool)

    def _send(self, release: pb.LeaseRelease) -> None:
        if self._outbox is not None:
            self._outbox.put(pb.SessionRequest(release=release))

    def close(self) -> None:
        if self._outbox is not None:
            self._outbox.put(None)
        if self._call is not None:
            self._call.cancel()
        if not self._cache.enabled:
            self._cache.close_all()  # the process-wide cache lives as long as the process


def _descriptor(ipc: pb.IpcDescriptor) -> SliceDescriptor:
    return SliceDescriptor(
        lease_id=ipc.lease_id,
        generation=ipc.generation,
        offset=ipc.offset_bytes,
        nbytes=ipc.nbytes,
        ready_offset=ipc.ready_offset_bytes,
        ack_offset=ipc.ack_offset_bytes,
    )
