"""Deterministic random weights for the presets (no checkpoint): the same bits on every machine.

Each tensor gets its own CPU `torch.Generator` seeded from (seed, name), so a tensor's values do not depend on
which other tensors exist. Values are uniform with the wanted standard deviation: `torch.rand` maps raw
Mersenne-Twister bits to floats exactly, whereas CPU `normal_` has vectorised (AVX2 / scalar) paths whose
transcendental functions may differ in the last bit between machines.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator

import torch
from torch import Tensor

WEIGHT_STD = 0.02  # linear / conv weights and the position table
BIAS_STD = 0.02
NORM_STD = 0.02  # LayerNorm weight = 1 + noise, bias = noise


def uniform_like_std(shape: tuple[int, ...], std: float, seed: int, name: str) -> Tensor:
    """float32 CPU tensor, uniform in [-std*sqrt(3), std*sqrt(3)) (standard deviation `std`), deterministic."""
    gen = torch.Generator(device="cpu").manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 63))
    u = torch.rand(shape, generator=gen, dtype=torch.float32)
    return u.mul_(2.0).sub_(1.0).mul_(std * math.sqrt(3.0))


def random_tensor(name: str, shape: tuple[int, ...], seed: int) -> Tensor:
    """The deterministic initial value of parameter `name` (an internal VisionEncoder name), float32 CPU."""
    is_norm = ".norm" in name or "final_layernorm" in name or "pre_norm" in name or "post_norm" in name
    if is_norm and name.endswith(".weight"):
        return uniform_like_std(shape, NORM_STD, seed, name).add_(1.0)
    if is_norm:
        return uniform_like_std(shape, NORM_STD, seed, name)
    if name.endswith(".bias"):
        return uniform_like_std(shape, BIAS_STD, seed, name)
    return uniform_like_std(shape, WEIGHT_STD, seed, name)


def random_state_dict(shapes: dict[str, torch.Size], seed: int = 0) -> Iterator[tuple[str, Tensor]]:
    """Yield (name, float32 CPU tensor) one at a time, so a caller can cast/move each before the next exists."""
    for name, shape in shapes.items():
        yield name, random_tensor(name, tuple(shape), seed)
