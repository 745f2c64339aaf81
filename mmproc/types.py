"""Dataclasses handed between stages, here so that no stage imports a later one."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from PIL import Image


@dataclass(frozen=True)
class DecodedImage:
    """One validated image: RGB (or RGBA if alpha was kept), EXIF-oriented; `source_format` from magic bytes,
    `source_size` (width, height) before orientation."""

    image: Image.Image
    source_format: str
    source_size: tuple[int, int]


@dataclass(frozen=True)
class PreprocessedImage:
    """One image as the vision tower eats it.

    patches: (L, 3, P, P) float32 CPU, row-major, L == frames * grid_h * grid_w (frame-major); uint8 when `lut` is set.
    grid_hw: (grid_h, grid_w) in patches, Python ints. num_tokens: (grid_h // kh) * (grid_w // kw).
    image_size: (width, height) as decoded, before resize. frames: t for a video chunk (tokens of one frame).
    lut: (3, 256) float32 CPU, lut[c, v] = normalized byte v of channel c; None when already normalized.
    """

    patches: torch.Tensor
    grid_hw: tuple[int, int]
    num_tokens: int
    image_size: tuple[int, int] = (0, 0)
    frames: int = 1
    lut: torch.Tensor | None = None

    @property
    def num_patches(self) -> int:
        return self.frames * self.grid_hw[0] * self.grid_hw[1]

    @property
    def grid_thw(self) -> tuple[int, int, int]:
        return (self.frames, *self.grid_hw)

    def normalized(self) -> torch.Tensor:
        """The (L, 3, P, P) float32 patches, normalizing the bytes here when they were left to the device."""
        if self.lut is None:
            return self.patches
        return apply_lut(self.patches, self.lut.to(self.patches.device, non_blocking=True))


@dataclass(frozen=True)
class PreprocessedVideo:
    """One video: its chunks (`frames` <= the temporal patch size) and, for the prompt, the sampled frame
    numbers, each chunk's start in seconds, the decoded (width, height) and the stream's fps."""

    chunks: tuple[PreprocessedImage, ...]
    indices: tuple[int, ...]
    timestamps: tuple[float, ...]
    source_size: tuple[int, int]
    fps: float

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)


def apply_lut(patches: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """(L, 3, P, P) uint8 -> lut[c, byte] in lut's dtype, on the patches' device (lut must be there too)."""
    flat = patches.to(torch.int32) + torch.arange(0, 768, 256, dtype=torch.int32, device=patches.device).view(3, 1, 1)
    return lut.reshape(-1)[flat]


@dataclass(frozen=True)
class PackedBatch:
    """Many images packed into one varlen sequence, all metadata built on the CPU from Python ints.

    pixel_values: (sum L, 3, P, P) float32, the model's bf16/fp16, or uint8 with `lut`; pinned for CUDA.
    cu_seqlens: (N + 1,) int32 CPU prefix sums of patches. max_seqlen: a Python int (no sync for varlen kernels).
    token_counts: per image, after the merger. frames: per item (empty when every item is an image).
    """

    pixel_values: torch.Tensor
    grid_hws: tuple[tuple[int, int], ...]
    cu_seqlens: torch.Tensor
    max_seqlen: int
    token_counts: tuple[int, ...]
    lut: torch.Tensor | None = None
    frames: tuple[int, ...] = ()

    @property
    def num_images(self) -> int:
        return len(self.grid_hws)

    @property
    def num_patches(self) -> int:
        return sum(h * w * t for (h, w), t in zip(self.grid_hws, self.item_frames, strict=True))

    @property
    def item_frames(self) -> tuple[int, ...]:
        return self.frames or (1,) * len(self.grid_hws)

    @property
    def num_tokens(self) -> int:
        return sum(self.token_counts)
