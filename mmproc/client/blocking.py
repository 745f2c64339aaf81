"""`EncoderClient`: the blocking client; its reader (IPC or serialized) is chosen once here."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence

import grpc
import torch

from mmproc.client.call_headers import call_headers, headers_channel
from mmproc.client.ipc import IpcClient
from mmproc.client.readers import IpcReader, Reader, Received, choose_reader
from mmproc.client.results import ImageEmbedding, from_header
from mmproc.client.retry import RetryPolicy
from mmproc.client.rpc import channel_options, check_images, check_keys, client_device, make_request
from mmproc.client.shared_embeddings import SharedEmbeddings
from mmproc.client.targets import Targets
from mmproc.client.video import VideoEmbedding, VideoInput
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from mmproc.wire.transports import Table


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


class EncoderClient:
    """Blocking client. Thread-safe (one channel, shared)."""

    _cache_bypass = False  # set per client by `cache=False`

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        device: str | torch.device = "cpu",
        transport: str = "auto",
        timeout: float = 60.0,
        max_message_bytes: int = 64 << 20,
        handle_cache: bool = True,
        retry: RetryPolicy | None = None,
        token: str | None = None,
        cache: bool = True,
        priority: str = "interactive",
        transports: Table | None = None,
    ) -> None:
        """transport: "auto" (CUDA IPC on a shared node, PID namespace and CUDA, else serialized), "ipc" (the
        same, warning on fallback), "serialized", or another name in `transports`.
        handle_cache=False reopens the server's pool per request (A/B benchmarks only).
        token: the server's `auth_token`, sent as a bearer token. cache=False: the server encodes afresh.
        priority="batch": offline work, shed first under overload (docs/reliability.md)."""
        self.device = client_device(device)
        self.transport = transport
        self.timeout = timeout
        self._cache_bypass = not cache
        # read streamed replies on the calling thread, not a per-call gRPC thread
        options = [*channel_options(max_message_bytes), (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
        headers = call_headers(token, priority)
        channel = lambda t: headers_channel(grpc.insecure_channel(t, options=options), headers)  # noqa: E731
        self._targets = Targets(target, channel, retry)
        self._stub = self._targets.stubs[0]  # the IPC session talks to the first target (IPC is same-node)
        self._reader: Reader = choose_reader(
            transport, self._targets, self.device, cache_bypass=self._cache_bypass, handle_cache=handle_cache,
            table=transports,
        )  # fmt: skip

    @property
    def _ipc(self) -> IpcClient | None:
        """This client's IPC session (None when its reader is the serialized one)."""
        return self._reader.ipc if isinstance(self._reader, IpcReader) else None

    @property
    def ipc_stats(self) -> dict[str, int] | None:
        """Handle-cache and fallback counters (None without IPC)."""
        return None if self._ipc is None else self._ipc.counters()

    @property
    def ipc_pool_id(self) -> str | None:
        """The server's IPC pool this client has open (None before the first IPC reply, or without IPC)."""
        identity = None if self._ipc is None else self._ipc.identity
        return None if identity is None else identity.pool_id

    def encode_images(
        self, images: Sequence[bytes], *, request_id: str | None = None, timeout: float | None = None
    ) -> list[torch.Tensor]:
        """One (tokens_i, hidden) tensor per image, on this client's device, in the server's dtype."""
        with self._read(check_images(images), (), request_id, timeout) as got:
            return got.owned()  # pool views: a stream-ordered copy, the ack follows it

    def encode(
        self,
        images: Sequence[bytes],
        *,
        keys: Sequence[str] | None = None,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> list[ImageEmbedding]:
        """`encode_images` with each image's grid, token count and original size (`ImageEmbedding`).

        keys: one per image; the server keeps each result under its key for a later `fetch` (ServerInfo.key_store
        bounds it); such a reply is serialized."""
        with self._read(check_images(images), check_keys(keys or ()), request_id, timeout) as got:
            return got.embeddings()

    def keep(
        self,
        images: Sequence[bytes],
        keys: Sequence[str],
        *,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> list[ImageEmbedding]:
        """Encode and keep each result under its key, replying headers only (tensor None) (docs/engines.md)."""
        images, keys = check_images(images), check_keys(keys)
        return self._headers_only(
            make_request(
                images, request_id, "serialized", cache_bypass=self._cache_bypass, keys=keys, headers_only=True
            ),
            timeout,
        )

    def lookup(
        self, keys: Sequence[str], *, request_id: str | None = None, timeout: float | None = None
    ) -> list[ImageEmbedding]:
        """Headers (token counts, grids) of results kept under `keys`; UnknownKeyError (NOT_FOUND) if one is not."""
        request = make_request(
            [], request_id, "serialized", cache_bypass=self._cache_bypass, keys=check_keys(keys), headers_only=True
        )
        return self._headers_only(request, timeout)

    def fetch(
        self, keys: Sequence[str], *, request_id: str | None = None, timeout: float | None = None
    ) -> list[ImageEmbedding]:
        """The results kept under `keys`, on this client's device; UnknownKeyError for a key not kept."""
        with self._read([], check_keys(keys), request_id, timeout) as got:
            return got.embeddings()

    def _headers_only(self, request: pb.EncodeImagesRequest, timeout: float | None) -> list[ImageEmbedding]:
        def attempt(stub: pb_grpc.EncoderStub, seconds: float) -> pb.EncodeImagesResponse:
            return stub.EncodeImages(request, timeout=seconds)

        reply = self._targets.call(attempt, timeout or self.timeout)
        return [from_header(emb, None) for emb in reply.embeddings]

    def _read(
        self, images: list[bytes], keys: Sequence[str], request_id: str | None, timeout: float | None
    ) -> contextlib.AbstractContextManager[Received]:
        return self._reader.read(images, keys, request_id or new_request_id(), timeout or self.timeout)

    def encode_images_into(
        self,
        images: Sequence[bytes],
        outputs: Sequence[torch.Tensor],
        *,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Copy each embedding into the caller's buffer (same shape and dtype, on this client's device)."""
        images = check_images(images)
        if len(outputs) != len(images):
            raise ValueError(f"{len(images)} images but {len(outputs)} output buffers")
        with self.encode_images_view(images, request_id=request_id, timeout=timeout) as views:
            for out, view in zip(outputs, views):
                if out.shape != view.shape or out.dtype != view.dtype:
                    raise ValueError(
                        f"output buffer {tuple(out.shape)} {out.dtype} != {tuple(view.shape)} {view.dtype}"
                    )
                out.copy_(view)

    @contextlib.contextmanager
    def encode_images_view(
        self, images: Sequence[bytes], *, request_id: str | None = None, timeout: float | None = None
    ) -> Iterator[list[torch.Tensor]]:
        """Zero-copy views into the server's IPC pool, valid inside the `with` block (plain tensors without IPC).

        On exit the ack is enqueued on the current stream, after your reads of the views."""
        with self._read(check_images(images), (), request_id, timeout) as got:
            yield got.tensors

    def encode_images_shared(
        self,
        images: Sequence[bytes],
        *,
        readers: int,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> SharedEmbeddings:
        """Encode once for the `readers` ranks of a tensor-parallel group; call it on rank 0 only.

        Broadcast `shared.to_bytes()` to the other ranks; every rank, rank 0 included, then calls
        `read_shared(shared, rank)` (the lease is freed after all `readers` acks). readers outside 1..8:
        InvalidMediaError."""
        images = check_images(images)
        return self._reader.shared(images, readers, request_id or new_request_id(), timeout or self.timeout)

    @contextlib.contextmanager
    def read_shared(
        self, shared: SharedEmbeddings, rank: int, *, timeout: float | None = None
    ) -> Iterator[list[torch.Tensor]]:
        """This rank's (tokens_i, hidden) embeddings of `shared`, on this client's device, inside the block.

        Over IPC, zero-copy pool views (copy what you keep); the ack is enqueued on the current stream on exit.
        Each rank reads once; rank 0 through the client that called `encode_images_shared`."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < shared.readers:
            raise ValueError(f"rank must be in 0..{shared.readers - 1}, got {rank!r}")
        with self._reader.read_shared(shared, rank, timeout or self.timeout) as views:
            yield views

    def encode_videos(
        self,
        videos: Sequence[bytes | VideoInput],
        *,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> list[VideoEmbedding]:
        """One `VideoEmbedding` per video (container bytes, or `VideoInput` with fps / num_frames overrides):
        per chunk its (tokens, hidden) tensor on this client's device, grid and timestamp."""
        return self._reader.videos(videos, request_id or new_request_id(), timeout or self.timeout)

    def server_info(self, timeout: float | None = None) -> pb.ServerInfo:
        request = pb.GetServerInfoRequest()
        timeout = timeout or self.timeout
        return self._targets.call(lambda stub, seconds: stub.GetServerInfo(request, timeout=seconds), timeout)

    def close(self) -> None:
        self._reader.close()
        for channel in self._targets.channels:
            channel.close()

    def __enter__(self) -> EncoderClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
