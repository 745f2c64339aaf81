"""vLLM consumes mmproc's embeddings through its encoder-cache ("EC") transfer layer: this is the front end's half.

It imports no vLLM, so an API process without vLLM can prepare requests: keep each image in mmproc under a key
(`keep_images`), then pass the keys as the request's `multi_modal_uuids` (`vllm_inputs`; for `vllm serve`, the
OpenAI proxy `mmproc.engines.vllm_proxy`). The connector that vLLM loads lives in `mmproc.engines.vllm_connector`
(it imports vLLM); `ec_connector_module_path: mmproc.engines.vllm` still finds `MmprocECConnector` here, imported
on first use. The flow: docs/engines.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mmproc.client import EncoderClient, ImageEmbedding

# The multimodal data key each family's vLLM model takes images under (K2.5 wraps them as "vision_chunk"s).
MODALITIES = {"kimi_vl": "image", "kimi_k25": "vision_chunk"}
_CONNECTOR_NAMES = {"MmprocECConnector", "MmprocLoadMetadata", "MmprocWorkerMetadata"}


def content_key(data: bytes) -> str:
    """A key from the image bytes: the same image gets the same key (and vLLM's cache entry)."""
    return "mmproc-" + hashlib.sha256(data).hexdigest()[:40]


def keep_images(
    client: EncoderClient, images: Sequence[bytes], keys: Sequence[str] | None = None, *, timeout: float | None = None
) -> list[ImageEmbedding]:
    """Front end, step 1: mmproc encodes the images and keeps each result under its key (default: `content_key`);
    returns headers only (token count, grid, original size, key). Pass the keys as the request's uuids.
    An image mmproc refuses raises InvalidMediaError here, before vLLM sees the request."""
    keys = list(keys) if keys is not None else [content_key(data) for data in images]
    return client.keep(images, keys, timeout=timeout)


def vllm_inputs(family: str, images: Sequence[Any], kept: Sequence[ImageEmbedding]) -> dict[str, Any]:
    """Front end, step 2: `multi_modal_data` and `multi_modal_uuids` for a vLLM prompt of `family`.

    images: what vLLM takes for the family (PIL images); kept: `keep_images`'s answer for them, in order."""
    if family not in MODALITIES:
        raise ValueError(f"no vLLM route for family {family!r}: one of {sorted(MODALITIES)}")
    if len(images) != len(kept):
        raise ValueError(f"{len(images)} images but {len(kept)} kept results")
    modality = MODALITIES[family]
    keys = [k.key for k in kept]
    if modality == "vision_chunk":
        items: list[Any] = [{"type": "image", "image": im, "uuid": key} for im, key in zip(images, keys)]
    else:
        items = list(images)
    return {"multi_modal_data": {modality: items}, "multi_modal_uuids": {modality: keys}}


def __getattr__(name: str) -> Any:
    """The connector classes, imported (with vLLM) only when vLLM's connector factory asks for them."""
    if name in _CONNECTOR_NAMES:
        from mmproc.engines import vllm_connector

        return getattr(vllm_connector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
