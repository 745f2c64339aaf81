"""`AsyncEncoderClient`: the asyncio client (grpc.aio)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import torch

from mmproc.client.blocking import EncoderClient, new_request_id
from mmproc.client.call_headers import aio_headers, call_headers
from mmproc.client.readers import AsyncSerializedReader, SerializedReader, ThreadedReader
from mmproc.client.results import ImageEmbedding, from_header
from mmproc.client.retry import RetryPolicy
from mmproc.client.rpc import channel_options, check_images, check_keys, client_device, make_request
from mmproc.client.targets import Targets
from mmproc.client.video import VideoEmbedding, VideoInput
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from mmproc.wire.transports import Table


class AsyncEncoderClient:
    """asyncio client; use from one event loop. Over CUDA IPC, reads run in a worker thread on the caller's
    stream; zero-copy views are offered by the blocking client only."""

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
        names = ("auto", *(transports or Table()).by_name)
        if transport not in names:
            raise ValueError(f"transport must be one of {sorted(names)}, got {transport!r}")
        self.device = client_device(device)
        self.transport = transport
        self.timeout = timeout
        self._cache_bypass = not cache
        options = channel_options(max_message_bytes)
        interceptors = aio_headers(call_headers(token, priority))
        channel = lambda t: grpc.aio.insecure_channel(t, options=options, interceptors=interceptors)  # noqa: E731
        self._targets = Targets(target, channel, retry)
        serialized = AsyncSerializedReader(self._targets, self.device, self._cache_bypass)
        self._reader: ThreadedReader | AsyncSerializedReader = serialized
        self._ipc: EncoderClient | None = None  # owns the transport's session and its (blocking) channels
        if transport != "serialized":
            blocking = EncoderClient(
                target, device=self.device, transport=transport, timeout=timeout,
                max_message_bytes=max_message_bytes, handle_cache=handle_cache, retry=retry, token=token, cache=cache,
                priority=priority, transports=transports,
            )  # fmt: skip
            if isinstance(blocking._reader, SerializedReader):  # nothing but bytes here: grpc.aio reads those
                blocking.close()
            else:
                self._ipc, self._reader = blocking, ThreadedReader(blocking._reader, serialized)

    @property
    def ipc_stats(self) -> dict[str, int] | None:
        """Handle-cache and fallback counters (None without IPC)."""
        return None if self._ipc is None else self._ipc.ipc_stats

    async def encode_images(
        self, images: Sequence[bytes], *, request_id: str | None = None, timeout: float | None = None
    ) -> list[torch.Tensor]:
        """One (tokens_i, hidden) tensor per image, on this client's device, in the server's dtype."""
        delivery = await self._reader.read(
            check_images(images), (), request_id or new_request_id(), timeout or self.timeout
        )
        return delivery.tensors

    async def keep(
        self,
        images: Sequence[bytes],
        keys: Sequence[str],
        *,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> list[ImageEmbedding]:
        """`EncoderClient.keep` for asyncio front ends: encode, keep each result under its key, headers only."""
        request = make_request(
            check_images(images),
            request_id,
            "serialized",
            cache_bypass=self._cache_bypass,
            keys=check_keys(keys),
            headers_only=True,
        )
        return await self._headers_only(request, timeout)

    async def lookup(
        self, keys: Sequence[str], *, request_id: str | None = None, timeout: float | None = None
    ) -> list[ImageEmbedding]:
        """`EncoderClient.lookup`: headers of results kept under `keys`; UnknownKeyError if one is not."""
        request = make_request(
            [], request_id, "serialized", cache_bypass=self._cache_bypass, keys=check_keys(keys), headers_only=True
        )
        return await self._headers_only(request, timeout)

    async def _headers_only(self, request: pb.EncodeImagesRequest, timeout: float | None) -> list[ImageEmbedding]:
        async def attempt(stub: pb_grpc.EncoderStub, seconds: float) -> pb.EncodeImagesResponse:
            return await stub.EncodeImages(request, timeout=seconds)

        reply = await self._targets.acall(attempt, timeout or self.timeout)
        return [from_header(emb, None) for emb in reply.embeddings]

    async def encode_videos(
        self,
        videos: Sequence[bytes | VideoInput],
        *,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> list[VideoEmbedding]:
        """`EncoderClient.encode_videos`, serialized (one unary reply, at most max_message_bytes)."""
        return await self._reader.videos(videos, request_id or new_request_id(), timeout or self.timeout)

    async def server_info(self, timeout: float | None = None) -> pb.ServerInfo:
        request = pb.GetServerInfoRequest()

        async def attempt(stub: pb_grpc.EncoderStub, seconds: float) -> pb.ServerInfo:
            return await stub.GetServerInfo(request, timeout=seconds)

        return await self._targets.acall(attempt, timeout or self.timeout)

    async def close(self) -> None:
        if self._ipc is not None:
            self._ipc.close()
        for channel in self._targets.channels:
            await channel.close()

    async def __aenter__(self) -> AsyncEncoderClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
