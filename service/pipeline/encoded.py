"""What the pipeline hands the front ends: one image's (or video chunk's) result."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmproc.transport.cuda_ipc.pool import SliceDescriptor
from mmproc.transport.leases.records import Lease


@dataclass(frozen=True)
class EncodedImage:
    """One image's result. `embedding` is (num_tokens, hidden) on the encoder's device, in its dtype;
    `descriptor` is set when it lies in the IPC pool (then `embedding` is a view of the pool)."""

    index: int
    grid_hw: tuple[int, int]
    num_tokens: int
    embedding: torch.Tensor
    descriptor: SliceDescriptor | None = None
    image_size: tuple[int, int] = (0, 0)  # (width, height) as decoded, after EXIF orientation
    key: str = ""  # the request's key for this image (EncodeImagesRequest.keys), if any
    cache: str = ""  # hit | miss | coalesced | bypass, or "" without a cache (service/pipeline/cache/cached_encode.py)
    mm_hash: str = ""  # the raw bytes' hash (service/pipeline/cache/keys.py): sent back, a client may ask by it later
    lease: Lease | None = None  # the pool lease `descriptor` lies in (IPC)
