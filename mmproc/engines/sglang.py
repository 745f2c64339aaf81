"""SGLang 0.5.23 takes mmproc's embeddings as one `precomputed_embedding` image item (docs/engines.md).

    results = client.encode(images)
    prompt = expand_prompt(["Describe ", " and ", "."], results, framing(client.server_info().family))
    engine.generate(prompt=prompt, image_data=[precomputed_item(results)])

One item per modality, every image's rows back to back with one (t, h, w) each, no caller-supplied identity
(Kimi refuses it): SGLang 0.5.23's srt/multimodal/processors/, kimi_common.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mmproc.client import ImageEmbedding
from mmproc.prompt import PromptFraming

FORMAT = "precomputed_embedding"


def precomputed_item(results: Sequence[ImageEmbedding]) -> dict[str, Any]:
    """The single image_data item: {"format", "feature": (sum tokens_i, hidden), "image_grid_thw": (n, 3) int64}.

    Rows of image i follow those of image i - 1, in request order; all tensors must be on one device."""
    if not results:
        raise ValueError("no images")
    tensors = []
    for i, result in enumerate(results):
        if result.tensor is None:
            raise ValueError(f"image {i} has no tensor (a headers-only reply); use EncoderClient.encode")
        if result.tensor.shape[0] != result.num_tokens:
            raise ValueError(f"image {i}: {result.tensor.shape[0]} rows for {result.num_tokens} tokens")
        tensors.append(result.tensor)
    grids = torch.tensor([list(r.grid_thw) for r in results], dtype=torch.int64)
    return {"format": FORMAT, "feature": torch.cat(tensors), "image_grid_thw": grids}


def tokens_from_grid(grid_thw: Sequence[int], merge_kernel_size: tuple[int, int] = (2, 2)) -> int:
    """SGLang's count for one Kimi image: (h * w) // (merge_h * merge_w); equals mmproc's `num_tokens`."""
    _, h, w = grid_thw
    return (h * w) // (merge_kernel_size[0] * merge_kernel_size[1])


def expand_prompt(text_parts: Sequence[str], results: Sequence[ImageEmbedding], frame: PromptFraming) -> str:
    """text_parts[0] + image 0's framed placeholder run + text_parts[1] + ... : len(text_parts) == images + 1.

    Each run is the family's header (with the image's original width and height), exactly `num_tokens`
    placeholders, and the footer: the layout SGLang expects when the embeddings are precomputed."""
    if len(text_parts) != len(results) + 1:
        raise ValueError(f"{len(results)} images need {len(results) + 1} text parts, got {len(text_parts)}")
    pieces = [text_parts[0]]
    for result, text in zip(results, text_parts[1:]):
        width, height = result.image_size
        pieces += [frame.image_text(result.num_tokens, width, height), text]
    return "".join(pieces)
