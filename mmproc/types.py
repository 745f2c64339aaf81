"""Dataclasses handed from one stage to the next (media -> preprocess -> batching -> model -> transport), here so
that no stage imports a later one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from PIL import Image


@dataclass(frozen=True)
class DecodedImage:
    """One validated, decoded image.

    `image` is mode "RGB" ("RGBA" for a transparent image when the decoder was asked to keep alpha) with EXIF
    orientation applied; `source_format` is the format found by
    magic bytes ("jpeg", "png", "webp", "gif", "bmp"); `source_size` is (width, height) before orientation.
    """

    image: Image.Image
    source_format: str
    source_size: tuple[int, int]


@dataclass(frozen=True)
class PreprocessedImage:
    """One image as the vision tower eats it.

    patches: (L, 3, P, P) float32 on the CPU, row-major patch order, L == grid_h * grid_w; or the uint8 bytes
        still to be normalized, when `lut` is set (for a CUDA encoder, which normalizes them on the device).
    grid_hw: (grid_h, grid_w) in patches, plain Python ints (never a tensor: metadata stays on the CPU).
    num_tokens: embeddings this image yields after the merger, (grid_h // kh) * (grid_w // kw).
    image_size: (width, height) of the image as decoded (after EXIF orientation), before resize/pad.
    frames: 1 for an image; t for a chunk of t video frames, whose patches are (t * grid_h * grid_w, 3, P, P),
        frame-major, and whose tokens are those of one frame (the frames are averaged after the tower).
    lut: (3, 256) float32 CPU table, lut[c, v] = the normalized value of byte v in channel c; None when
        `patches` are normalized already.
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
    """One video as the tower eats it: its chunks (each a `PreprocessedImage` with `frames` = t <= the temporal
    patch size, the last one possibly shorter) and what the prompt needs.

    indices: the sampled frame numbers; timestamps: each chunk's start in seconds (its first frame / fps);
    source_size: (width, height) of the frames as decoded; fps: the stream's frame rate.
    """

    chunks: tuple[PreprocessedImage, ...]
    indices: tuple[int, ...]
    timestamps: tuple[float, ...]
    source_size: tuple[int, int]
    fps: float

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)


def apply_lut(patches: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """(L, 3, P, P) uint8 bytes -> lut[c, byte] per channel c, in lut's dtype and on the patches' device (pass a
    lut already there). One gather kernel; exactly the values the CPU's table gives."""
    flat = patches.to(torch.int32) + torch.arange(0, 768, 256, dtype=torch.int32, device=patches.device).view(3, 1, 1)
    return lut.reshape(-1)[flat]


@dataclass(frozen=True)
class PackedBatch:
    """Many images packed into one varlen sequence, all metadata built on the CPU from Python ints.

    pixel_values: (sum L, 3, P, P) float32, or the model's bf16/fp16 when packed for a CUDA model (half the H2D
        bytes), or uint8 bytes that the model normalizes through `lut` on its device (a quarter); pinned when
        the batch is meant for a CUDA device.
    grid_hws: per image (grid_h, grid_w) in patches.
    cu_seqlens: (N + 1,) int32 CPU tensor, prefix sums of patches per image (attention segments).
    max_seqlen: longest image in patches, a Python int (varlen kernels want it without a sync).
    token_counts: per image the number of output embeddings after the merger.
    lut: (3, 256) float32 CPU table when pixel_values are uint8 (see PreprocessedImage.lut), else None.
    frames: per item its frames (video chunks, see PreprocessedImage.frames); empty when every item is an image.
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
