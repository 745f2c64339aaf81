"""Several servers behind one client: a channel per target, rotation, and retries per `RetryPolicy`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from mmproc.client.retry import RetryPolicy, Rotation, acall_with_retry, call_with_retry
from mmproc.client.rpc import encoder_stub, error_from_rpc
from mmproc.errors import MmprocError, UnavailableError
from mmproc.v1 import encoder_pb2_grpc as pb_grpc

T = TypeVar("T")


class Targets:
    """One channel per target; each call goes to the next target, retried per `RetryPolicy`."""

    def __init__(self, target: str | Sequence[str], make_channel: Callable, retry: RetryPolicy | None) -> None:
        targets = [target] if isinstance(target, str) else list(target)
        if not targets:
            raise ValueError("no target given")
        self.channels = [make_channel(t) for t in targets]
        self.stubs = [encoder_stub(channel) for channel in self.channels]  # EncodeImagesStream yields StreamChunk
        self._rotation = Rotation(self.stubs)
        self.retry = retry or RetryPolicy()

    def _failed(self, index: int, err: grpc.RpcError) -> MmprocError:
        error = error_from_rpc(err)
        if isinstance(error, UnavailableError):
            self._rotation.failed(index)
        return error

    def call(self, fn: Callable[[pb_grpc.EncoderStub, float], T], timeout: float) -> T:
        def attempt(seconds: float) -> T:
            index, stub = self._rotation.pick()
            try:
                return fn(stub, seconds)
            except grpc.RpcError as err:
                raise self._failed(index, err) from None

        return call_with_retry(attempt, self.retry, timeout)

    async def acall(self, fn: Callable[[pb_grpc.EncoderStub, float], Awaitable[T]], timeout: float) -> T:
        async def attempt(seconds: float) -> T:
            index, stub = self._rotation.pick()
            try:
                return await fn(stub, seconds)
            except grpc.RpcError as err:
                raise self._failed(index, err) from None

        return await acall_with_retry(attempt, self.retry, timeout)
