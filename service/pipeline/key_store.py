"""Results kept under a caller's key, for an engine to fetch later (docs/engines.md). Bounded by bytes, keys and a
TTL, oldest dropped first; on the encoder's device; event loop only."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from mmproc.errors import InvalidRequestError, Reason, UnknownKeyError

if TYPE_CHECKING:  # service.pipeline.requests owns a KeyStore
    from mmproc.wire.results import EncodedImage


@dataclass(frozen=True)
class KeyStoreConfig:
    max_bytes: int = 256 << 20  # 0 turns keys off (requests with keys are refused)
    ttl_s: float = 120.0
    max_keys: int = 4096
    max_key_chars: int = 256


def check_keys(keys: list[str], images: int, config: KeyStoreConfig) -> None:
    """Keys of a request, validated before any work: one per image when images come with them, bounded length."""
    if config.max_bytes == 0:
        raise InvalidRequestError("this server keeps no results by key (key_store_mb = 0)", reason=Reason.BAD_REQUEST)
    if images and len(keys) != images:
        raise InvalidRequestError(f"{len(keys)} keys for {images} images", reason=Reason.BAD_REQUEST)
    for i, key in enumerate(keys):
        if not key or len(key) > config.max_key_chars:
            message = f"key must have 1..{config.max_key_chars} characters, got {len(key)}"
            raise InvalidRequestError(message, reason=Reason.BAD_REQUEST, index=i)
    if len(set(keys)) != len(keys):
        raise InvalidRequestError("keys of one request must differ", reason=Reason.BAD_REQUEST)


class KeyStore:
    def __init__(self, config: KeyStoreConfig) -> None:
        self.config = config
        self._entries: OrderedDict[str, tuple[float, EncodedImage]] = OrderedDict()  # oldest first
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: str, result: EncodedImage, now: float | None = None) -> None:
        """Keep `result` (a plain device tensor, never a pool view) under `key`, replacing an older entry."""
        assert result.handle is None, "a transport's memory is reused after the ack: keep a plain tensor"
        now = time.monotonic() if now is None else now
        self._drop(key)
        size = _nbytes(result)
        if size > self.config.max_bytes:
            return  # larger than the whole store: a later fetch gets NOT_FOUND, as after an eviction
        if result.embedding.untyped_storage().nbytes() != size:  # a view of the request's buffer: own the rows,
            result = replace(result, embedding=result.embedding.clone())  # so that the byte bound is the memory held
        self.expire(now)
        while self._entries and (self._bytes + size > self.config.max_bytes or len(self) >= self.config.max_keys):
            self._drop(next(iter(self._entries)))
        self._entries[key] = (now + self.config.ttl_s, replace(result, index=0))
        self._bytes += size

    def get(self, keys: list[str], now: float | None = None) -> list[EncodedImage]:
        """The results kept under `keys`, indexed by their position here; UnknownKeyError for the first missing."""
        self.expire(time.monotonic() if now is None else now)
        out = []
        for i, key in enumerate(keys):
            entry = self._entries.get(key)
            if entry is None:
                raise UnknownKeyError(f"no result kept under key {key!r} (never sent, expired or evicted)", index=i)
            out.append(replace(entry[1], index=i))
        return out

    def expire(self, now: float) -> None:
        while self._entries:
            key, (expires, _) = next(iter(self._entries.items()))
            if expires > now:
                break  # insertion order is expiry order: one TTL for all
            self._drop(key)

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= _nbytes(entry[1])


def _nbytes(result: EncodedImage) -> int:
    return result.embedding.numel() * result.embedding.element_size()
