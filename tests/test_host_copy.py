"""Host copies into the bytes handed to gRPC (mmproc.transport.host_copy): uninitialized bytes, filled exactly,
large copies split over the bounded pool, small ones inline."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mmproc.transport import host_copy
from mmproc.transport.host_copy import HostCopies, concat_bytes, copy_into, new_bytes, split_plan

MiB = 1 << 20
# Small pieces so that tiny inputs take every path: inline below 16 bytes, else pieces of >= 64 bytes.
SMALL = {"threads": 4, "min_piece": 64, "inline_bytes": 16}


def pattern(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


class SubmitSpy:
    """Counts what reaches the shared pool (and still runs it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        submit = host_copy._POOL.submit

        def spy(run):
            self.sizes.append(run.__self__.nbytes)  # run: a piece's bound `run`
            return submit(run)

        monkeypatch.setattr(host_copy._POOL, "submit", spy)


def test_new_bytes_are_fresh_bytes_of_the_asked_length() -> None:
    assert new_bytes(0) == b"" and type(new_bytes(0)) is bytes
    one, other = new_bytes(1), new_bytes(1)
    assert type(one) is bytes and len(one) == 1 and one is not other  # not a shared 1-byte singleton
    data = new_bytes(1000)
    copy_into(data, 0, pattern(1000))
    assert data == pattern(1000) and hash(data) == hash(pattern(1000))  # an ordinary bytes object once written
    with pytest.raises(ValueError, match="negative"):
        new_bytes(-1)


@pytest.mark.parametrize("size", [0, 1, 15, 16, 63, 64, 65, 255, 256, 257, 1001])
@pytest.mark.parametrize("offset", [0, 3])
def test_copy_into_fills_exactly_its_range(size: int, offset: int) -> None:
    src = pattern(size, seed=size)
    dst = bytearray(b"\xaa" * (offset + size + 5))
    with HostCopies(**SMALL) as copies:
        copies.copy_into(dst, offset, src)
    assert dst[:offset] == b"\xaa" * offset and dst[offset + size :] == b"\xaa" * 5  # nothing around it touched
    assert dst[offset : offset + size] == src


@pytest.mark.parametrize("size", [0, 1, 15, 64, 257, 1001])
def test_messages_are_prefix_plus_payload_from_any_source(size: int) -> None:
    payload = pattern(size, seed=1)
    tensor = torch.tensor(list(payload), dtype=torch.uint8)
    sources = [payload, memoryview(payload), np.frombuffer(payload, dtype=np.uint8), tensor]
    if size % 2 == 0:
        sources.append(tensor.view(torch.bfloat16).reshape(-1, 1))  # any dtype, any shape: its raw bytes
    with HostCopies(**SMALL) as copies:
        messages = [copies.message(b"head", source) for source in sources]
    assert all(type(m) is bytes and m == b"head" + payload for m in messages)


def test_large_copies_use_the_pool_in_planned_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    spy = SubmitSpy(monkeypatch)
    payload = pattern(5 * MiB + 3)  # odd size, over several pieces with the default settings
    assert concat_bytes(b"\x08\x01", payload) == b"\x08\x01" + payload
    plan = split_plan(len(payload))
    assert spy.sizes == [stop - start for start, stop in plan]
    assert len(plan) == min(host_copy.COPY_THREADS, 5)
    spy.sizes.clear()
    assert concat_bytes(b"x", payload[: host_copy.INLINE_BYTES - 1]) == b"x" + payload[: host_copy.INLINE_BYTES - 1]
    assert spy.sizes == []  # tiny: copied on the calling thread


@given(nbytes=st.integers(0, 10**9), threads=st.integers(1, 16), min_piece=st.integers(1, 1 << 24))
def test_split_plan_covers_the_copy_in_balanced_pieces(nbytes: int, threads: int, min_piece: int) -> None:
    plan = split_plan(nbytes, threads, min_piece)
    assert plan[0][0] == 0 and plan[-1][1] == nbytes
    assert all(a[1] == b[0] for a, b in zip(plan, plan[1:]))  # contiguous, in order
    assert len(plan) == max(1, min(threads, nbytes // min_piece))
    sizes = [stop - start for start, stop in plan]
    assert max(sizes) - min(sizes) <= 1
    if nbytes >= min_piece:
        assert min(sizes) >= min_piece


def test_concurrent_callers_share_the_pool() -> None:
    payloads = [pattern(2 * MiB + k, seed=k) for k in range(8)]
    with ThreadPoolExecutor(8) as callers:  # like concurrent replies, each from its own executor thread
        got = list(callers.map(lambda p: concat_bytes(p[:5], p[5:]), payloads))
    assert got == payloads


def test_errors_are_raised_to_the_caller() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        copy_into(bytearray(10), 5, b"123456")
    with pytest.raises(ValueError, match="CPU tensor"):
        concat_bytes(b"", torch.empty(4, device="meta"))
    read_only = memoryview(bytes(1000))
    with pytest.raises(ValueError, match="read-only"):  # inline: at once
        copy_into(read_only, 0, b"x")
    copies = HostCopies(**SMALL)
    copies.copy_into(read_only, 0, pattern(500))  # on the pool: at the wait
    with pytest.raises(ValueError, match="read-only"):
        copies.wait()


def test_the_caller_copies_what_the_pool_has_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_copy._POOL, "submit", lambda run: None)  # a pool busy with other replies forever
    payload = pattern(3 * MiB + 1)
    assert concat_bytes(b"h", payload) == b"h" + payload  # the waiting caller copied every piece itself


def test_an_error_while_building_cancels_the_pieces_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_copy._POOL, "submit", lambda run: None)
    dst = bytearray(2 * MiB)
    with pytest.raises(RuntimeError, match="later step"), HostCopies() as copies:
        copies.copy_into(dst, 0, b"\x01" * (2 * MiB))
        raise RuntimeError("a later step failed")
    assert dst == bytearray(2 * MiB)  # nothing writes into it after the block has left


def test_copies_from_a_pool_thread_do_not_deadlock() -> None:
    payload = pattern(2 * MiB + 7)
    jobs = [host_copy._POOL.submit(concat_bytes, b"", payload) for _ in range(2 * host_copy.COPY_THREADS)]
    assert all(job.result(timeout=60) == payload for job in jobs)  # every pool thread may be a caller at once
