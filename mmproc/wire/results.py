"""One result, as the pipeline hands it to the front ends, and the reply header every transport shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from mmproc.transport.serialized.staging import DTYPE_NAMES
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.dtypes import NAME_TO_PB

SERIALIZED = "serialized"  # its bytes go in the reply


class Handle(Protocol):
    """Where a transport put one result: opaque to everything but that transport."""

    @property
    def transport(self) -> str: ...


@dataclass(frozen=True)
class EncodedImage:
    """`embedding`: (num_tokens, hidden) on the encoder's device; a view of the transport's memory with `handle`."""

    index: int
    grid_hw: tuple[int, int]
    num_tokens: int
    embedding: torch.Tensor
    image_size: tuple[int, int] = (0, 0)  # (width, height) as decoded, after EXIF orientation
    key: str = ""  # the request's key for this image (EncodeImagesRequest.keys), if any
    cache: str = ""  # hit | miss | coalesced | bypass, or "" without a cache
    mm_hash: str = ""  # the raw bytes' hash: sent back, a client may ask by it later
    handle: Handle | None = None

    @property
    def transport(self) -> str:
        return SERIALIZED if self.handle is None else self.handle.transport


CACHE_TO_PB = {
    "": pb.CACHE_STATUS_UNSPECIFIED,
    "miss": pb.CACHE_MISS,
    "hit": pb.CACHE_HIT,
    "coalesced": pb.CACHE_COALESCED,
    "bypass": pb.CACHE_BYPASS,
}


def embedding_header(result: EncodedImage) -> pb.Embedding:
    emb = result.embedding
    return pb.Embedding(
        index=result.index,
        num_tokens=result.num_tokens,
        grid_t=1,
        grid_h=result.grid_hw[0],
        grid_w=result.grid_hw[1],
        image_width=result.image_size[0],
        image_height=result.image_size[1],
        key=result.key,
        cache=CACHE_TO_PB[result.cache],
        mm_hash=result.mm_hash,
        dtype=NAME_TO_PB[DTYPE_NAMES[emb.dtype]],
        shape=list(emb.shape),
    )


def headers_reply(request_id: str, results: list[EncodedImage]) -> pb.EncodeImagesResponse:
    """Headers only (EncodeImagesRequest.headers_only): grids, token counts, shapes, keys; no payload."""
    reply = pb.EncodeImagesResponse(request_id=request_id, transport=pb.TRANSPORT_SERIALIZED, transport_name=SERIALIZED)
    reply.embeddings.extend(embedding_header(r) for r in results)
    return reply


def payload_bytes(results: list[EncodedImage]) -> int:
    """The raw bytes a serialized reply carries (its share of the reply byte budget)."""
    return sum(r.embedding.nbytes for r in results)
