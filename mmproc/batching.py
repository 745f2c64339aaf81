"""Pack preprocessed images into one varlen `PackedBatch` and split the embeddings back per image."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mmproc.types import PackedBatch, PreprocessedImage

PIXEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def pixel_transfer_dtype(device: torch.device, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype to pack in: a bf16/fp16 model's own on CUDA (half the H2D bytes; the CPU cast rounds to nearest
    even, as the device's would), else float32."""
    if device.type == "cuda" and model_dtype in (torch.bfloat16, torch.float16):
        return model_dtype
    return torch.float32


def pack_images(
    images: Sequence[PreprocessedImage],
    merge_kernel_size: tuple[int, int] = (2, 2),
    pin_memory: bool = False,
    dtype: torch.dtype = torch.float32,
) -> PackedBatch:
    """One `torch.cat` of the patches into a (sum L, 3, P, P) buffer, pinned when asked (CUDA consumers only).

    uint8 with the shared `lut` when every image left its bytes to the device; else `dtype`, cast in the same
    copy. cu_seqlens (N + 1,) int32 CPU; max_seqlen and token_counts Python ints."""
    if dtype not in PIXEL_DTYPES:
        raise ValueError(f"pack_images: dtype must be one of {PIXEL_DTYPES}, got {dtype}")
    if not images:
        raise ValueError("pack_images needs at least one image")
    kh, kw = merge_kernel_size
    grids, token_counts, offsets = [], [], [0]
    for i, image in enumerate(images):
        h, w = image.grid_hw
        if image.patches.shape[0] != image.frames * h * w or h % kh or w % kw:
            raise ValueError(
                f"image {i}: {image.patches.shape[0]} patches do not form {image.frames} grid(s) {(h, w)} "
                f"divisible by {(kh, kw)}"
            )
        tokens = (h // kh) * (w // kw)
        if image.num_tokens != tokens:
            raise ValueError(f"image {i}: num_tokens {image.num_tokens} != {tokens} for grid {(h, w)}")
        grids.append((h, w))
        token_counts.append(tokens)
        offsets.append(offsets[-1] + image.frames * h * w)  # a video chunk is one attention segment
    lut = _shared_lut(images)
    patch_shape = images[0].patches.shape[1:]  # (3, P, P)
    if lut is not None:
        dtype, parts = torch.uint8, [image.patches for image in images]
    else:
        parts = [image.normalized() for image in images]
    device = next((part.device for part in parts if part.device.type != "cpu"), None)
    if device is None:
        pixel_values = torch.empty((offsets[-1], *patch_shape), dtype=dtype, pin_memory=pin_memory)
        torch.cat(parts, out=pixel_values)  # casts while copying when dtype differs
    else:
        pixel_values = _pack_on_device(parts, (offsets[-1], *patch_shape), dtype, device)
    frames = tuple(image.frames for image in images)
    return PackedBatch(
        pixel_values=pixel_values,
        grid_hws=tuple(grids),
        cu_seqlens=torch.tensor(offsets, dtype=torch.int32),
        max_seqlen=max(b - a for a, b in zip(offsets, offsets[1:])),
        token_counts=tuple(token_counts),
        lut=lut,
        frames=frames if any(t != 1 for t in frames) else (),
    )


def _pack_on_device(parts: list[Tensor], shape: tuple, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Pack on the device when some patches are there already: CPU parts go up in one pinned copy; device parts
    are `record_stream`ed so the caching allocator waits for this stream's reads."""
    stream = torch.cuda.current_stream(device)
    host = [part for part in parts if part.device.type == "cpu"]
    uploaded = iter(())
    if host:
        staged = torch.empty((sum(p.shape[0] for p in host), *shape[1:]), dtype=dtype, pin_memory=True)
        torch.cat(host, out=staged)
        uploaded = iter(staged.to(device, non_blocking=True).split([p.shape[0] for p in host]))
    out = torch.empty(shape, dtype=dtype, device=device)
    start = 0
    for part in parts:
        if part.device.type == "cpu":
            part = next(uploaded)
        else:
            part.record_stream(stream)
        out[start : start + part.shape[0]].copy_(part)  # casts when dtype differs
        start += part.shape[0]
    return out


def _shared_lut(images: Sequence[PreprocessedImage]) -> Tensor | None:
    """The one table every image's bytes still need, or None (some are normalized, or the tables differ)."""
    first = images[0].lut
    if first is None:
        return None
    for image in images[1:]:
        if image.lut is None or not (image.lut is first or torch.equal(image.lut, first)):
            return None
    return first


def split_by_image(embeddings: Tensor, token_counts: Sequence[int]) -> list[Tensor]:
    """Views of `embeddings` (sum tokens, hidden), one (tokens_i, hidden) per image; no copies."""
    if sum(token_counts) != embeddings.shape[0]:
        raise ValueError(f"token counts sum to {sum(token_counts)}, embeddings have {embeddings.shape[0]} rows")
    return list(torch.split(embeddings, list(token_counts), dim=0))
