"""Video chunks through the K2.5 tower (the `tiny-k2.5` preset) and the prompt text: batched with images, each
item gets the embedding it gets alone; chunking, token counts and framing follow the reference's rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmproc.batching import pack_images, split_by_image
from mmproc.layers.temporal import time_embedding_table
from mmproc.models import load_encoder
from mmproc.preprocess import PreprocessConfig, preprocess_image
from mmproc.preprocess.video import preprocess_video, video_num_tokens
from mmproc.preprocess.video_config import VideoRules, load_video_rules
from mmproc.prompt import timestamp_text, video_prompt
from tests.support.media_samples import random_image

RULES = VideoRules(max_patches=48, max_side=8)


def _frames(count: int, height: int = 60, width: int = 90, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (count, height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def encoder():
    return load_encoder(None, preset="tiny-k2.5")


def test_chunks_of_four_frames_the_last_one_short() -> None:
    video = preprocess_video(_frames(9), tuple(range(0, 27, 3)), 6.0, RULES)
    assert [chunk.frames for chunk in video.chunks] == [4, 4, 1]
    assert {chunk.grid_hw for chunk in video.chunks} == {(6, 8)}  # 90x60 scaled into 48 patches, padded to 2x2
    assert [chunk.patches.shape for chunk in video.chunks] == [(4 * 48, 3, 14, 14)] * 2 + [(48, 3, 14, 14)]
    assert video.timestamps == (0.0, 2.0, 4.0)  # each chunk's first frame (0, 12, 24) / 6 fps
    assert video.num_tokens == 3 * 12 == video_num_tokens(9, 90, 60, RULES)


def test_frames_are_cut_into_patches_frame_major() -> None:
    frames = _frames(2, 28, 56)  # no resize, no padding: 2 x 4 patches per frame
    (chunk,) = preprocess_video(frames, (0, 1), 2.0, VideoRules()).chunks
    x = (frames.astype(np.float32) - 127.5) / 127.5  # mean 0.5, std 0.5 on bytes
    want = x.reshape(2, 2, 14, 4, 14, 3).transpose(0, 1, 3, 5, 2, 4).reshape(16, 3, 14, 14)
    assert np.allclose(chunk.patches.numpy(), want, atol=1e-6)


@torch.inference_mode()
def test_videos_and_images_batched_together_match_alone(encoder) -> None:
    video = preprocess_video(_frames(7, seed=1), tuple(range(7)), 2.0, RULES)
    image = preprocess_image(random_image(70, 50, seed=2), PreprocessConfig.kimi_k25())
    items = [image, *video.chunks, image]
    together = split_by_image(encoder(pack_images(items)), [item.num_tokens for item in items])
    for item, got in zip(items, together, strict=True):
        alone = encoder(pack_images([item]))
        assert torch.allclose(got, alone, atol=1e-5)


@torch.inference_mode()
def test_time_embedding_tells_frames_apart(encoder) -> None:
    """Reversing a chunk's frames changes its embedding only through the time embedding (the pool and attention
    are order-free); a one-frame chunk adds nothing, so it equals the same pixels as an image."""
    (chunk,) = preprocess_video(_frames(4, seed=3), (0, 1, 2, 3), 2.0, RULES).chunks
    reversed_patches = chunk.patches.view(4, -1, 3, 14, 14).flip(0).reshape_as(chunk.patches)
    flipped = type(chunk)(reversed_patches, chunk.grid_hw, chunk.num_tokens, chunk.image_size, chunk.frames)
    assert not torch.allclose(encoder(pack_images([chunk])), encoder(pack_images([flipped])), atol=1e-4)
    (single,) = preprocess_video(_frames(1, seed=4), (0,), 2.0, RULES).chunks
    as_image = type(single)(single.patches, single.grid_hw, single.num_tokens)
    assert torch.equal(encoder(pack_images([single])), encoder(pack_images([as_image])))
    table = time_embedding_table(4, 8)
    assert table.shape == (5, 8) and not table[0].any() and table[1].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_prompt_text_per_chunk() -> None:
    assert timestamp_text(0.0) == "00:00:00.000" and timestamp_text(3723.4567) == "01:02:03.456"
    text = video_prompt("kimi_k25", (0.0, 2.5), (2, 1))
    pad = "<|kimi_k25_video_placeholder|>"
    assert text == (
        f"00:00:00.000<|media_begin|>video<|media_content|>{pad * 2}<|media_end|>"
        f"00:00:02.500<|media_begin|>video<|media_content|>{pad}<|media_end|>"
    )
    with pytest.raises(KeyError):
        video_prompt("kimi_vl", (0.0,), (1,))


def test_video_rules_from_each_layout(tmp_path) -> None:
    assert load_video_rules(None) == VideoRules()  # 2 fps, 4 frames, 4096 patches, 512 a side
    (tmp_path / "preprocessor_config.json").write_text(
        '{"media_proc_cfg": {"sample_fps": 1.0, "temporal_merge_kernel_size": 2, "in_patch_limit_each_frame": 900,'
        ' "patch_limit_on_one_side": 64, "merge_kernel_size": 2}}'
    )
    assert load_video_rules(tmp_path) == VideoRules(fps=1.0, temporal_patch_size=2, max_patches=900, max_side=64)
    (tmp_path / "video_preprocessor_config.json").write_text('{"fps": 3, "size": {"max_height": 40, "max_width": 40}}')
    assert load_video_rules(tmp_path) == VideoRules(fps=3, max_side=40)
