"""`DeviceInputs`: one packed batch as a forward reads it on the device. Made by `VisionEncoder.prepare` (host work:
indices built on the CPU, two non_blocking copies) and read by `VisionEncoder.run` (device work only), so a
captured CUDA graph (mmproc/models/cuda_graphs.py) can replay `run` over the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from mmproc.layers.attention import VarlenMeta


@dataclass(frozen=True)
class DeviceInputs:
    """pixels (L, 3, P, P) model dtype; cos, sin (L, dh/2) float32; merge_index (T*kk,) int64; attn: segments
    (CPU ints + device cu_seqlens); grid_hws: per item (h, w) Python ints. Video chunks
    (mmproc/layers/temporal.py): frames per item (empty: all images) and time_index (L,) int64."""

    pixels: Tensor
    cos: Tensor
    sin: Tensor
    merge_index: Tensor
    attn: VarlenMeta
    grid_hws: tuple[tuple[int, int], ...]
    frames: tuple[int, ...] = ()
    time_index: Tensor | None = None
