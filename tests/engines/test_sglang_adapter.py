"""mmproc.engines.sglang against SGLang 0.5.23's contract for Kimi precomputed embeddings (the source facts are
cited in the module; SGLang has no CPU build to run here): shapes, grids, token counts and placeholder runs."""

from __future__ import annotations

import re

import pytest
import torch

from mmproc.client import EncoderClient
from mmproc.engines.sglang import expand_prompt, precomputed_item, tokens_from_grid
from mmproc.prompt import FRAMINGS, framing
from tests.support.media_samples import make_image_bytes

IMAGES = [make_image_bytes(100, 80, fmt="PNG", seed=1), make_image_bytes(640, 200, fmt="JPEG", seed=2)]


@pytest.fixture(scope="module")
def results(tiny_server):
    with EncoderClient(tiny_server.grpc_target) as client:
        return client.encode(IMAGES), client.encode_images(IMAGES), client.server_info()


def test_item_is_one_precomputed_embedding_with_rows_back_to_back(results) -> None:
    encoded, plain, _ = results
    item = precomputed_item(encoded)
    assert set(item) == {"format", "feature", "image_grid_thw"}  # no caller identity keys (Kimi refuses them)
    assert item["format"] == "precomputed_embedding"
    assert torch.equal(item["feature"], torch.cat(plain))
    assert item["image_grid_thw"].dtype == torch.int64 and item["image_grid_thw"].shape == (2, 3)
    assert item["image_grid_thw"][:, 0].tolist() == [1, 1]


def test_sglang_token_count_from_the_grid_equals_mmproc_rows(results) -> None:
    encoded, _, info = results
    merge = (info.preprocess.merge_h, info.preprocess.merge_w)
    for result, grid in zip(encoded, precomputed_item(encoded)["image_grid_thw"].tolist()):
        assert tokens_from_grid(grid, merge) == result.num_tokens == result.tensor.shape[0]


def test_prompt_holds_each_image_framed_and_expanded(results) -> None:
    encoded, _, info = results
    frame = framing(info.family)
    prompt = expand_prompt(["Compare ", " with ", "."], encoded, frame)
    runs = [
        len(m.group(0)) // len(frame.placeholder) for m in re.finditer(f"(?:{re.escape(frame.placeholder)})+", prompt)
    ]
    assert runs == [r.num_tokens for r in encoded]
    assert prompt.startswith("Compare " + frame.header(100, 80)) and prompt.endswith(frame.image_footer + ".")
    assert prompt.count(frame.image_header) == 2
    with pytest.raises(ValueError, match="text parts"):
        expand_prompt(["only one"], encoded, frame)


def test_headers_only_results_are_refused(tiny_server) -> None:
    with EncoderClient(tiny_server.grpc_target) as client:
        kept = client.keep(IMAGES[:1], ["sglang-headers"])
    with pytest.raises(ValueError, match="no tensor"):
        precomputed_item(kept)


def test_a_size_template_header_carries_the_original_size() -> None:
    from mmproc.prompt import PromptFraming

    frame = PromptFraming("<|media_begin|>image {width}x{height}<|media_content|>", "<|media_pad|>", "<|media_end|>")
    assert frame.image_text(2, 640, 480) == (
        "<|media_begin|>image 640x480<|media_content|><|media_pad|><|media_pad|><|media_end|>"
    )
    assert set(FRAMINGS) >= {"kimi_vl", "kimi_k25"}
