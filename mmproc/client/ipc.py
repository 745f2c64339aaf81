"""The client half of the CUDA IPC transport (sync client): the session stream and stream-ordered reads and acks
(docs/ipc.md)."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import grpc
import torch

from mmproc.client.shared_embeddings import SharedEmbeddings
from mmproc.errors import InternalError, StaleSessionError, UnavailableError
from mmproc.transport.cuda_ipc.node import node_identity
from mmproc.transport.cuda_ipc.pool import PoolIdentity, SliceDescriptor
from mmproc.transport.cuda_ipc.runtime import device_uuid
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from mmproc.wire.cuda_ipc import descriptor_from_pb, identity_from_pb
from mmproc.wire.dtypes import PB_TO_DTYPE

if TYPE_CHECKING:
    from mmproc.transport.cuda_ipc.consumer import OpenedPool

logger = logging.getLogger(__name__)

_MAX_OWNED = 4096  # shared leases this client requested and has not read yet (rank 0 that never reads: TTL)


def request_leases(embeddings: Sequence[pb.Embedding]) -> tuple[list[SliceDescriptor], list[int]]:
    """One descriptor per distinct lease of a reply (cache hits have their own, docs/cache.md) and the ids to
    release; every lease is waited on and acked."""
    leases: dict[int, SliceDescriptor] = {}
    for emb in embeddings:
        if emb.ipc.lease_id not in leases:
            leases[emb.ipc.lease_id] = descriptor_from_pb(emb.ipc)
    return list(leases.values()), sorted(leases)


def wait_all(pool: OpenedPool, leases: Sequence[SliceDescriptor], stream: torch.cuda.Stream, timeout: float) -> None:
    for lease in leases:
        pool.wait_ready(lease, stream, timeout)


def ack_all(pool: OpenedPool, leases: Sequence[SliceDescriptor], stream: torch.cuda.Stream, reader: int = 0) -> None:
    for lease in leases:
        pool.ack(lease, stream, reader=reader)


def pool_views(pool: OpenedPool, embeddings: Sequence[pb.Embedding]) -> list[torch.Tensor]:
    """Zero-copy (tokens_i, hidden) views of a reply's embeddings in the opened pool."""
    return [
        pool.view(emb.ipc.offset_bytes, emb.ipc.nbytes, PB_TO_DTYPE[emb.dtype], tuple(emb.shape)) for emb in embeddings
    ]


def clone_views(views: list[torch.Tensor]) -> list[torch.Tensor]:
    """Fresh tensors with the views' values (stream-ordered): one copy of the span when they lie back to back."""
    first = views[0]
    storage = first.untyped_storage().data_ptr()
    same_rows = all(
        v.dtype == first.dtype and v.shape[1:] == first.shape[1:] and v.is_contiguous()
        and v.untyped_storage().data_ptr() == storage  # one pool mapping
        for v in views
    )  # fmt: skip
    adjacent = all(b.data_ptr() == a.data_ptr() + a.nbytes for a, b in zip(views, views[1:]))
    if first.dim() == 0 or not (same_rows and adjacent):
        return [v.clone() for v in views]
    rows = sum(v.shape[0] for v in views)
    span = first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset()).clone()
    return list(span.split([v.shape[0] for v in views]))


class IpcClient:
    """This process's IPC session with one server: a bidirectional stream whose end reclaims its leases."""

    def __init__(self, stub: pb_grpc.EncoderStub, device: torch.device, handle_cache: bool) -> None:
        from mmproc.transport.cuda_ipc.consumer import HandleCache

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
        self._owned: dict[int, str] = {}  # shared lease id -> the session that owns it (releases it after reading)

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
            # notice the server going away at once, not on the next request
            threading.Thread(target=self._watch, args=(call,), name="mmproc-ipc-session", daemon=True).start()
            self.identity = identity_from_pb(info)
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
            self._owned.clear()  # the old session's leases were reclaimed with it

    def request(
        self,
        images: list[bytes],
        request_id: str,
        timeout: float,
        *,
        readers: int | None = None,
        keys: Sequence[str] = (),
        cache_bypass: bool = False,
    ) -> pb.EncodeImagesResponse | None:
        """One EncodeImages call over IPC; None without a session. With `readers`, rank 0 owns the lease."""
        session = self._session()
        if session is None:
            return None
        request = pb.EncodeImagesRequest(
            images=images,
            request_id=request_id,
            transport=pb.TRANSPORT_IPC,
            consumer=pb.ConsumerInfo(session_id=session, device_uuid=self._uuid),
            keys=list(keys),
            cache_bypass=cache_bypass,
        )
        if readers is not None:
            request.readers = readers
        reply = self._stub.EncodeImages(request, timeout=timeout)
        if reply.transport != pb.TRANSPORT_IPC:
            self.fallbacks += 1
        elif readers is not None:
            with self._lock:
                for emb in reply.embeddings:
                    self._owned[emb.ipc.lease_id] = session
                while len(self._owned) > _MAX_OWNED:
                    self._owned.pop(next(iter(self._owned)))
        return reply

    @contextlib.contextmanager
    def read(self, reply: pb.EncodeImagesResponse, timeout: float) -> Iterator[list[torch.Tensor] | None]:
        """Views ordered after the producer's writes; ack + release on exit. None if the pool cannot be opened."""
        assert self.identity is not None
        leases, lease_ids = request_leases(reply.embeddings)
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
            wait_all(pool, leases, stream, timeout)
            yield pool_views(pool, reply.embeddings)
        finally:
            ack_all(pool, leases, stream)
            self._send(pb.LeaseRelease(lease_ids=lease_ids))
            self._cache.release(pool)

    @contextlib.contextmanager
    def read_shared(self, shared: SharedEmbeddings, rank: int, timeout: float) -> Iterator[list[torch.Tensor]]:
        """Rank `rank`'s views of a shared IPC batch on this process's device; its ack is enqueued on exit.

        Rank 0 must be the requesting client (it releases the lease). UnavailableError when the pool cannot be
        mapped (the lease waits for the TTL), StaleSessionError when the server restarted since the encode."""
        if self._session() is None:
            raise UnavailableError(f"this process cannot use CUDA IPC with the server: {self.refused}")
        identity, pool_named = self.identity, shared.pool
        assert identity is not None and pool_named is not None
        if (pool_named.pool_id, pool_named.epoch) != (identity.pool_id, identity.epoch):
            raise StaleSessionError(
                f"shared embeddings point into pool {pool_named.pool_id} but the server now serves pool "
                f"{identity.pool_id} (it restarted after rank 0 encoded): encode again"
            )
        leases, lease_ids = request_leases(shared.reply.embeddings)
        owner = rank == 0
        if owner:
            with self._lock:
                if any(self._owned.get(i) != self.session_id for i in lease_ids):
                    raise ValueError(
                        "rank 0 reads shared embeddings once, through the client that called encode_images_shared "
                        "(its session owns the lease; a session lost since then took the lease with it)"
                    )
                for i in lease_ids:
                    del self._owned[i]
        try:
            pool = self._cache.acquire(identity, self._device)
        except Exception as exc:
            if owner:  # the server frees a shared lease only through the TTL then: the peers may be reading it
                self._send(pb.LeaseRelease(lease_ids=lease_ids, unread=True))
            raise UnavailableError(f"cannot open the server's IPC pool on {self._device}: {exc}") from exc
        stream = torch.cuda.current_stream(self._device)
        try:
            wait_all(pool, leases, stream, timeout)
            yield pool_views(pool, shared.reply.embeddings)
        finally:
            ack_all(pool, leases, stream, reader=rank)
            if owner:
                self._send(pb.LeaseRelease(lease_ids=lease_ids))
            self._cache.release(pool)

    def give_back(self, reply: pb.EncodeImagesResponse) -> None:
        """Give back a reply's lease unread; the server frees it at once."""
        lease_ids = sorted({emb.ipc.lease_id for emb in reply.embeddings if emb.HasField("ipc")})
        with self._lock:
            for lease_id in lease_ids:
                self._owned.pop(lease_id, None)
        if lease_ids:
            self._send(pb.LeaseRelease(lease_ids=lease_ids, unread=True))

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
