"""The vLLM connector's worker side, without vLLM: fetch one scheduler step's keys from mmproc.

One call for all keys of the step; when mmproc answers that one of them is gone (NOT_FOUND names only the first),
each key is fetched alone, so that a vanished key fails only the requests that use it. An unreachable mmproc
fails the whole step's keys at once (asking key by key would only wait longer).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from mmproc.errors import MmprocError, UnknownKeyError


class FetchClient(Protocol):
    def fetch(self, keys: list[str], *, timeout: float | None = None) -> list[Any]: ...


def fetch_rows(
    client: FetchClient, wanted: dict[str, int], hidden: int, timeout: float
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """wanted: key -> rows vLLM expects. Returns (key -> (rows, hidden) tensor on the client's device, key -> why
    it failed); every key is in exactly one of them."""
    keys = list(wanted)
    got: dict[str, Any] = {}
    failed: dict[str, str] = {}
    try:
        got = dict(zip(keys, client.fetch(keys, timeout=timeout)))
    except UnknownKeyError as exc:
        if len(keys) == 1:
            failed[keys[0]] = str(exc)
        for key in keys if len(keys) > 1 else ():
            try:
                got[key] = client.fetch([key], timeout=timeout)[0]
            except MmprocError as one:
                failed[key] = str(one)
    except MmprocError as exc:
        failed = dict.fromkeys(keys, str(exc))
    tensors: dict[str, torch.Tensor] = {}
    for key, result in got.items():
        tensor = result.tensor
        if tensor is None or tuple(tensor.shape) != (wanted[key], hidden):
            shape = "nothing" if tensor is None else tuple(tensor.shape)
            failed[key] = f"got {shape}, want ({wanted[key]}, {hidden})"
        else:
            tensors[key] = tensor
    return tensors, failed
