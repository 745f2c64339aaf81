"""The Qwen3-VL video rule without transformers: frame sampling, sizes, slices of two frames, timestamps, settings.
Against transformers itself: tests/acceptance/test_transformers_qwen3_vl_video.py."""

from __future__ import annotations

import json

import pytest
import torch

from mmproc.errors import ConfigError, InvalidMediaError
from mmproc.preprocess.qwen3_vl_video import (
    QwenVideoRules,
    frame_prompt,
    frame_timestamps,
    preprocess_video,
    sample_indices,
    video_size,
)

RULES = QwenVideoRules()


def test_sampling_at_2_fps_within_the_frame_limits():
    assert sample_indices(37, 6.0, RULES) == [0, 3, 7, 10, 13, 16, 20, 23, 26, 29, 33, 36]  # 12 of 37
    assert sample_indices(10, 30.0, RULES) == [0, 3, 6, 9]  # under min_frames: 4
    assert sample_indices(3, 30.0, RULES) == [0, 1, 2]  # never more than there are
    assert len(sample_indices(100_000, 1.0, RULES)) == 768  # max_frames
    assert sample_indices(100, 25.0, RULES, num_frames=5) == [0, 25, 50, 74, 99]


def test_timestamps_average_each_slices_frames():
    assert frame_timestamps([0, 3, 7], 6.0) == [0.25, (7 / 6 + 7 / 6) / 2]  # odd count: the last index repeated
    text = frame_prompt([0.25, 1.1666], 2)
    assert text == "<0.2 seconds><|vision_start|><|video_pad|><|video_pad|><|vision_end|>" + (
        "<1.2 seconds><|vision_start|><|video_pad|><|video_pad|><|vision_end|>"
    )


def test_sizes_share_the_budget_over_frames():
    assert video_size(12, 90, 160, RULES) == (96, 160)  # 12 * 96 * 160 within 131,072 .. 786,432
    h, w = video_size(100, 1080, 1920, RULES)
    assert 100 * h * w <= 768 * 32 * 32 and h % 32 == 0 and w % 32 == 0
    with pytest.raises(InvalidMediaError):
        video_size(1, 64, 64, RULES)  # a single frame is not a video


def test_slices_hold_two_frames_per_patch_row_major():
    frames = torch.zeros(3, 64, 64, 3, dtype=torch.uint8)
    frames[1] = 255  # frame 1 white: slice 0 has frames 0 and 1; slice 1 has frame 2 twice (padding)
    frames[2, :16, 16:32] = 255  # patch (0, 1) of frame 2
    small = QwenVideoRules(min_pixels=4096)  # 64 x 64 kept as is: 4 x 4 patches
    slices = preprocess_video(frames, small)
    assert [s.grid_hw for s in slices] == [(4, 4), (4, 4)] and slices[0].patches.shape == (16, 3, 2, 16, 16)
    first, second = slices
    assert torch.all(first.patches[:, :, 0] == -1) and torch.all(first.patches[:, :, 1] == 1)
    assert torch.all(second.patches[1] == 1) and torch.all(second.patches[0] == -1)  # row-major, both frames
    assert first.num_tokens == 4


def test_settings_file(tmp_path):
    assert QwenVideoRules.load(tmp_path) == RULES  # no file: the class defaults (Qwen3's values)
    data = {"size": {"shortest_edge": 4096, "longest_edge": 25_165_824}, "fps": 1, "max_frames": 64}
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(data))
    rules = QwenVideoRules.load(tmp_path)
    assert (rules.min_pixels, rules.max_pixels, rules.fps, rules.max_frames) == (4096, 25_165_824, 1, 64)
    with pytest.raises(ConfigError, match="patch_size"):
        QwenVideoRules.from_dict({"patch_size": 0})
