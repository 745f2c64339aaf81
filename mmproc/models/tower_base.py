"""What every vision tower shares, whatever its family: the per-batch inputs it reads (`TowerInputs`), the kernel
selection per (device, dtype), and the contract `VisionEncoder` and the CUDA-graph cache rely on (`RopeTower`).

A tower owns its RoPE layout: `rope_index` builds, on the CPU, the rows of its cos/sin tables every patch reads,
and `rope_factors` gathers them on the device. MoonViT keeps one (h, w) table (mmproc/models/tower.py); the Qwen
tower, whose grids reach thousands of patches on a side, one table per axis (mmproc/models/qwen3_vl_tower.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from mmproc.layers.attention import VarlenMeta
from mmproc.layers.kernels import KernelOptions, Kernels, select_kernels
from mmproc.models.config import VisionConfig

logger = logging.getLogger(__name__)

__all__ = ["KernelOptions", "RopeTower", "TowerInputs", "TowerOutput"]


@dataclass(frozen=True)
class TowerInputs:
    """Per-batch inputs of the tower, all on the compute device except the Python-int metadata.

    grid_hws: per frame (h, w) (an image is one frame). cos, sin: (L, dh/2) float32 RoPE factors per patch.
    attn: segment metadata (a video chunk is one segment). kernels: the functions chosen for this device and
    dtype. time_index: (L,) int64 row of the time table per patch, None when every item is one frame.
    item_grids / frames: per item (h, w) and frame count, only for video chunks (empty: all images).
    """

    grid_hws: tuple[tuple[int, int], ...]
    cos: Tensor
    sin: Tensor
    attn: VarlenMeta
    kernels: Kernels
    time_index: Tensor | None = None
    item_grids: tuple[tuple[int, int], ...] = ()
    frames: tuple[int, ...] = ()


@dataclass(frozen=True)
class TowerOutput:
    """hidden: (L', D) what the main merger reads. taps: (L', D) hidden states of the DeepStack levels, in order
    (empty for towers without DeepStack); each is its own tensor (not a view the next block updates in place)."""

    hidden: Tensor
    taps: tuple[Tensor, ...] = ()


class RopeTower(nn.Module):
    """Base of every tower: kernel options and their per-(device, dtype) selection, and the abstract steps a packed
    forward takes. Subclasses set `self.config` and implement `forward`, `rope_index`, `rope_factors`, `pos_tables`."""

    def __init__(self, config: VisionConfig, options: KernelOptions | None = None) -> None:
        super().__init__()
        self.config = config
        self.options = options or KernelOptions()
        self._kernels: tuple[tuple[torch.device, torch.dtype], Kernels] | None = None

    def set_options(self, **changes: object) -> KernelOptions:
        """Switch fast paths (benchmarks, tests); the kernels are selected again on the next forward."""
        self.options = replace(self.options, **changes)
        self._kernels = None
        return self.options

    def kernels(self, device: torch.device, dtype: torch.dtype) -> Kernels:
        """Attention, RoPE and fc0+GELU implementations for this device/dtype, selected once and then reused."""
        key = (device, dtype)
        if self._kernels is None or self._kernels[0] != key:
            cfg = self.config
            kernels = select_kernels(
                device,
                dtype,
                num_heads=cfg.num_heads,
                head_dim=cfg.head_dim,
                width=cfg.hidden_size,
                norm=cfg.norm,
                options=self.options,
            )
            logger.info(
                "kernels on %s/%s: attention %s, RoPE %s, fc0+GELU %s, add+norm %s", device, dtype, *kernels.names
            )
            self._kernels = (key, kernels)
        return self._kernels[1]

    def rope_index(self, device: torch.device, grid_hws: tuple[tuple[int, int], ...]) -> Tensor:
        """CPU int64 rows of this tower's RoPE tables for every patch (grows the tables on `device` if needed)."""
        raise NotImplementedError

    def rope_factors(self, device: torch.device, index: Tensor) -> tuple[Tensor, Tensor]:
        """`rope_index`'s rows, now on `device` -> cos, sin (L, dh/2) float32 in the interleaved layout of
        mmproc/layers/rope.py (what the fused kernel reads)."""
        raise NotImplementedError

    def pos_tables(self, grid_hws: tuple[tuple[int, int], ...]) -> list[Tensor]:
        """The position tables a forward over these grids reads (a captured graph holds on to them)."""
        raise NotImplementedError

    def forward(self, pixels: Tensor, inputs: TowerInputs) -> TowerOutput:
        raise NotImplementedError
