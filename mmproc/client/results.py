"""`ImageEmbedding`: one image's embedding with what an engine needs next to it (grid, token count, size, key)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmproc.v1 import encoder_pb2 as pb


@dataclass(frozen=True)
class ImageEmbedding:
    """tensor: (num_tokens, hidden) on the client's device, or None for a headers-only reply (`keep`, `lookup`).
    grid_thw: (frames, height, width) in patches after resize + pad, before the merger (what SGLang and vLLM call
    `image_grid_thw` / `grid_thws`). image_size: (width, height) as decoded, after EXIF orientation."""

    tensor: torch.Tensor | None
    num_tokens: int
    grid_thw: tuple[int, int, int]
    image_size: tuple[int, int]
    key: str = ""
    cache: str = ""  # the server's embedding cache: "hit" | "miss" | "coalesced" | "bypass" ("" without one)
    mm_hash: str = ""  # the raw bytes' hash: send it (EncodeImagesRequest.mm_hashes) to ask without the bytes


def from_header(header: pb.Embedding, tensor: torch.Tensor | None) -> ImageEmbedding:
    return ImageEmbedding(
        tensor=tensor,
        num_tokens=header.num_tokens,
        grid_thw=(header.grid_t or 1, header.grid_h, header.grid_w),
        image_size=(header.image_width, header.image_height),
        key=header.key,
        cache=pb.CacheStatus.Name(header.cache).removeprefix("CACHE_").lower() if header.cache else "",
        mm_hash=header.mm_hash,
    )
