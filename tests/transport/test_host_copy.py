"""The one host copy of a serialized payload (mmproc.transport.serialized.host_copy): uninitialized bytes, filled exactly
from any source, safe from concurrent reply threads."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from mmproc.transport.serialized.host_copy import concat_bytes, join_bytes, new_bytes
from mmproc.units import MiB


def pattern(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_new_bytes_are_fresh_bytes_of_the_asked_length() -> None:
    assert new_bytes(0) == b"" and type(new_bytes(0)) is bytes
    one, other = new_bytes(1), new_bytes(1)
    assert type(one) is bytes and len(one) == 1 and one is not other  # not a shared 1-byte singleton
    data = concat_bytes(b"", pattern(1000))
    assert data == pattern(1000) and hash(data) == hash(pattern(1000))  # an ordinary bytes object once written
    with pytest.raises(ValueError, match="negative"):
        new_bytes(-1)


@pytest.mark.parametrize("size", [0, 1, 15, 64, 257, 1001, 3 * MiB + 7])
@pytest.mark.parametrize("prefix", [b"", b"head"])
def test_messages_are_prefix_plus_payload_from_any_source(size: int, prefix: bytes) -> None:
    payload = pattern(size, seed=size)
    tensor = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
    sources = [payload, bytearray(payload), memoryview(payload), tensor]
    if size % 2 == 0:
        sources.append(tensor.view(torch.bfloat16).reshape(-1, 1))  # any dtype, any shape: its raw bytes
    for source in sources:
        got = concat_bytes(prefix, source)
        assert type(got) is bytes and got == prefix + payload


def test_a_non_contiguous_tensor_is_copied_in_row_major_order() -> None:
    base = torch.arange(24, dtype=torch.float32).view(4, 6)
    view = base[:, ::2]
    assert concat_bytes(b"x", view) == b"x" + view.contiguous().numpy().tobytes()


def test_gpu_tensors_are_refused() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    with pytest.raises(ValueError, match="stage it to the host"):
        concat_bytes(b"", torch.zeros(4, device="cuda"))


def test_concurrent_callers_get_their_own_bytes() -> None:
    payloads = [pattern(2 * MiB + k, seed=k) for k in range(8)]
    with ThreadPoolExecutor(8) as callers:  # like concurrent replies, each from its own executor thread
        got = list(callers.map(lambda p: concat_bytes(p[:5], p[5:]), payloads))
    assert got == payloads


def test_filling_bytes_warns_nobody() -> None:
    # torch warns once per process that a tensor over bytes is writable; host_copy has that warning at import,
    # silenced, so no reply ever shows it (if torch starts warning on every call, this fails).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        concat_bytes(b"head", pattern(100))
        concat_bytes(b"", bytes(pattern(3 * MiB)))
    assert not caught


def test_joined_parts_are_copied_in_order_as_they_come() -> None:
    parts = [b"head", pattern(3 * MiB, seed=1), b"", b"tag", torch.arange(10, dtype=torch.int16)]
    want = b"".join(p if isinstance(p, bytes) else p.numpy().tobytes() for p in parts)
    handed: list[int] = []

    def lazily():  # a payload is handed over only once the one before it is written (as after its D2H)
        for i, part in enumerate(parts):
            handed.append(i)
            yield part

    assert join_bytes(len(want), lazily()) == want and handed == list(range(len(parts)))


@pytest.mark.parametrize("announced", [5, 7])
def test_parts_that_do_not_add_up_are_refused(announced: int) -> None:
    with pytest.raises(ValueError, match="announced"):
        join_bytes(announced, [b"abc", b"def"])
