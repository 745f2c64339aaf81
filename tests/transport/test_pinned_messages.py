"""Page-locked reply messages (mmproc/transport/serialized/pinned_messages.py): reused only once nobody else holds them, bounded
in bytes, and the pool steps aside (the reply is copied) when it has no room. Page-locking itself needs CUDA: here a
recorder stands in for cudaHostRegister; tests/wire/test_serialized_staging.py runs the real one on a GPU."""

from __future__ import annotations

import ctypes
import logging

import pytest

from mmproc.transport.serialized.pinned_messages import LAYOUT_OK, MIN_MESSAGE, PinnedMessages, data_address, size_class
from mmproc.units import MiB

pytestmark = pytest.mark.skipif(not LAYOUT_OK, reason="not CPython's bytes layout: the pool stays off")


class Registry:
    def __init__(self) -> None:
        self.registered: dict[int, int] = {}
        self.calls = 0

    def register(self, address: int, nbytes: int) -> None:
        self.calls += 1
        self.registered[address] = nbytes

    def unregister(self, address: int) -> None:
        del self.registered[address]


def pool_of(max_bytes: int) -> tuple[PinnedMessages, Registry]:
    registry = Registry()
    return PinnedMessages(max_bytes, registry.register, registry.unregister), registry


def fill(message: bytes, byte: int) -> None:
    ctypes.memset(data_address(message), byte, len(message))


def test_messages_have_the_asked_lengths_and_hold_what_is_written() -> None:
    pool, registry = pool_of(16 * MiB)
    a, b = pool.take([MiB + 5, 3 * MiB])
    assert (len(a), len(b)) == (MiB + 5, 3 * MiB)
    fill(a, 0x61)
    assert a == b"a" * (MiB + 5) and hash(a) == hash(b"a" * (MiB + 5))
    assert sorted(registry.registered.values()) == [2 * MiB, 4 * MiB]  # powers of two
    assert pool.registered_bytes == 6 * MiB


def test_a_message_comes_back_only_once_nobody_holds_it() -> None:
    pool, registry = pool_of(16 * MiB)
    (first,) = pool.take([MiB])
    first_id = id(first)
    (second,) = pool.take([MiB])  # `first` is still held (by gRPC, say): a message of its own
    assert second is not first and registry.calls == 2
    del first
    (third,) = pool.take([MiB // 2])  # the idle one, shorter this time
    assert id(third) == first_id and len(third) == MiB // 2 and registry.calls == 2
    fill(third, 0x62)
    assert third == b"b" * (MiB // 2)


def test_a_full_pool_steps_aside_and_counts_a_miss() -> None:
    pool, registry = pool_of(4 * MiB)
    (held,) = pool.take([3 * MiB])  # a 4 MiB message: the whole pool
    assert pool.take([MiB]) == [None] and pool.misses == 1  # the caller copies this reply instead
    assert pool.take([MiB, 3 * MiB]) == [None, None] and pool.misses == 2  # all of a reply's messages or none
    del held
    (small,) = pool.take([MiB])  # the idle 4 MiB message makes room for a 1 MiB one
    assert len(small) == MiB and list(registry.registered.values()) == [MiB] and pool.registered_bytes == MiB


def test_one_reply_never_gets_the_same_message_twice() -> None:
    pool, _ = pool_of(16 * MiB)
    a, b, c = pool.take([MiB, MiB, MiB])
    assert len({id(a), id(b), id(c)}) == 3


def test_small_messages_are_left_to_the_copy_and_not_counted_as_misses() -> None:
    pool, registry = pool_of(16 * MiB)
    small, large = pool.take([MIN_MESSAGE - 1, 2 * MiB])
    assert small is None and len(large) == 2 * MiB  # a short copy; the rest of the reply still lands in place
    assert pool.take([100]) == [None] and pool.take([]) == []
    assert pool.misses == 0 and registry.calls == 1


def test_a_refused_registration_turns_the_pool_off(caplog: pytest.LogCaptureFixture) -> None:
    def refuse(address: int, nbytes: int) -> None:
        raise RuntimeError("cudaHostRegister of 1048576 bytes failed: CUDA error 2")

    pool = PinnedMessages(16 * MiB, refuse, lambda address: None)
    with caplog.at_level(logging.WARNING):
        assert pool.take([MiB]) == [None]
    assert not pool.enabled and pool.take([MiB]) == [None]
    assert "page-locked reply messages off" in caplog.text


def test_size_classes() -> None:
    assert [size_class(n) for n in (1, MiB, MiB + 1, 5 * 10**6, 16 * MiB)] == [MiB, MiB, 2 * MiB, 8 * MiB, 16 * MiB]


def test_closing_or_dropping_the_pool_unlocks_every_message_even_one_still_held() -> None:
    pool, registry = pool_of(16 * MiB)
    held, _ = pool.take([MiB, 2 * MiB])
    pool.close()
    assert registry.registered == {} and pool.registered_bytes == 0  # freed memory must not stay registered
    assert pool.take([MiB]) == [None] and len(held) == MiB  # still a valid bytes object
    pool, registry = pool_of(16 * MiB)
    pool.take([MiB])
    del pool  # never closed: the last reference unlocks it
    assert registry.registered == {}
