"""The NIXL transport's session messages, as fixed little-endian structs (no pickle): what the consumer asks
(read lease L of generation G into my memory at A) and what the producer answers when it refuses."""

from __future__ import annotations

import struct
from dataclasses import dataclass

_HANDLE = struct.Struct("<QQQQQ")  # epoch, lease id, generation, offset in the pool, nbytes
_ASK = struct.Struct("<QQQQQQQIB")  # tag, epoch, lease id, generation, offset, nbytes, address, device, vram
_REFUSED = struct.Struct("<Q")  # tag, then the reason in UTF-8
_OPENED = struct.Struct("<Q")  # the pool's epoch, then the producer's agent name in UTF-8
MAX_REASON = 512


@dataclass(frozen=True)
class Handle:
    """Where one image lies in the producer's pool: what a reply's Embedding.handle carries."""

    epoch: int
    lease_id: int
    generation: int
    offset: int
    nbytes: int

    def pack(self) -> bytes:
        return _HANDLE.pack(self.epoch, self.lease_id, self.generation, self.offset, self.nbytes)

    @staticmethod
    def unpack(data: bytes) -> Handle:
        if len(data) != _HANDLE.size:
            raise ValueError(f"a nixl handle has {_HANDLE.size} bytes, got {len(data)}")
        return Handle(*_HANDLE.unpack(data))


@dataclass(frozen=True)
class ReadAsk:
    """The consumer asks for [offset, offset + nbytes) of a lease, written at `address` of its registered memory."""

    tag: int
    epoch: int
    lease_id: int
    generation: int
    offset: int
    nbytes: int
    address: int
    device: int
    vram: bool

    def pack(self) -> bytes:
        return b"A" + _ASK.pack(
            self.tag, self.epoch, self.lease_id, self.generation, self.offset, self.nbytes, self.address,
            self.device, self.vram,
        )  # fmt: skip

    @staticmethod
    def unpack(data: bytes) -> ReadAsk:
        if len(data) != 1 + _ASK.size or data[:1] != b"A":
            raise ValueError("not a nixl read request")
        fields = _ASK.unpack(data[1:])
        return ReadAsk(*fields[:8], vram=bool(fields[8]))


def refused(tag: int, reason: str) -> bytes:
    return b"R" + _REFUSED.pack(tag) + reason.encode()[:MAX_REASON]


def refusal(data: bytes) -> tuple[int, str]:
    if len(data) < 1 + _REFUSED.size or data[:1] != b"R":
        raise ValueError("not a nixl refusal")
    (tag,) = _REFUSED.unpack(data[1 : 1 + _REFUSED.size])
    return tag, data[1 + _REFUSED.size :].decode(errors="replace")


def opened(epoch: int, agent: str) -> bytes:
    return _OPENED.pack(epoch) + agent.encode()


def opened_info(data: bytes) -> tuple[int, str]:
    if len(data) < _OPENED.size:
        raise ValueError("not a nixl session opening")
    (epoch,) = _OPENED.unpack(data[: _OPENED.size])
    return epoch, data[_OPENED.size :].decode(errors="replace")
