"""Qwen3-VL video rules: transformers 5.23's `Qwen3VLVideoProcessor` (torchvision backend) + the timestamps of
`Qwen3VLProcessor`, reproduced for decoded frames.

- frames: `fps` per second of the video (default 2), clamped to [min_frames, max_frames] and to the frames there
  are, at `linspace(0, total - 1, n).round()`; or exactly `num_frames` of them.
- size: the image `smart_resize` with the pixel budget over all frames (t rounded to a multiple of 2), after
  bringing a side under 32 px up to it; one size for every frame; bicubic with antialias, as for images.
- patches: frames padded to a multiple of 2 by repeating the last; temporal slice g is frames 2g and 2g + 1, each
  patch (3, 2, P, P) as the Conv3d reads it. A video of grid (t, h, w) attends per slice (merge_temporal False in
  transformers), so it is packed as t images of grid (h, w) (mmproc/models/qwen3_vl_tower.py).
- timestamps: per slice, the mean of its two frames' times (`_calculate_timestamps`); the prompt writes each as
  `<%.1f seconds>` before the slice's placeholders (`frame_prompt`).
Video limits and decoding are the media stage's (mmproc/media/video.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mmproc.errors import ConfigError, InvalidMediaError, Reason
from mmproc.preprocess.qwen3_vl_config import MAX_ASPECT_RATIO
from mmproc.types import PreprocessedImage


@dataclass(frozen=True)
class QwenVideoRules:
    """Qwen3VLVideoProcessor's settings; defaults are that class's (Qwen3's own values, unlike the image class)."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 128 * 32 * 32
    max_pixels: int = 768 * 32 * 32
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QwenVideoRules:
        size = data.get("size") or {}
        fields: dict[str, Any] = {k: data[k] for k in ("patch_size", "temporal_patch_size", "merge_size") if k in data}
        fields |= {k: data[k] for k in ("fps", "min_frames", "max_frames") if data.get(k) is not None}
        fields |= {k: tuple(data[k]) for k in ("image_mean", "image_std") if k in data}
        if size.get("shortest_edge") is not None:
            fields["min_pixels"] = size["shortest_edge"]
        if size.get("longest_edge") is not None:
            fields["max_pixels"] = size["longest_edge"]
        if data.get("cap_pixels_per_frame"):
            raise ConfigError("video preprocess config: cap_pixels_per_frame is not supported")
        rules = cls(**fields)
        for name in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels", "min_frames"):
            value = getattr(rules, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"video preprocess config: {name} must be a positive integer, got {value!r}")
        return rules

    @classmethod
    def load(cls, model_dir: Path | str) -> QwenVideoRules:
        """From `video_preprocessor_config.json` (or `processor_config.json`'s "video_processor"), else defaults."""
        path = Path(model_dir) / "video_preprocessor_config.json"
        nested = Path(model_dir) / "processor_config.json"
        try:
            if path.is_file():
                return cls.from_dict(json.loads(path.read_text()))
            if nested.is_file():
                return cls.from_dict(json.loads(nested.read_text()).get("video_processor") or {})
        except (OSError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{path}: cannot read the video settings: {exc}") from None
        return cls()


def sample_indices(
    total_frames: int,
    video_fps: float,
    rules: QwenVideoRules,
    *,
    fps: float | None = None,
    num_frames: int | None = None,
) -> list[int]:
    """Frame indices to decode (`Qwen3VLVideoProcessor.sample_frames`): `num_frames` of them, or `fps` (default
    the rules') per second of video within [min_frames, max_frames] and the frames there are."""
    if num_frames is None:
        num_frames = int(total_frames / video_fps * (fps if fps is not None else rules.fps))
        num_frames = min(max(num_frames, rules.min_frames), rules.max_frames, total_frames)
    return np.linspace(0, total_frames - 1, num_frames).round().astype(int).tolist()


def frame_timestamps(indices: list[int], video_fps: float, temporal_patch_size: int = 2) -> list[float]:
    """Seconds per temporal slice: the mean of its first and last frame's times (padded with the last index)."""
    indices = list(indices) + [indices[-1]] * (-len(indices) % temporal_patch_size)
    times = [i / video_fps for i in indices]
    step = temporal_patch_size
    return [(times[i] + times[i + step - 1]) / 2 for i in range(0, len(times), step)]


def frame_prompt(timestamps: list[float], tokens_per_slice: int) -> str:
    """The expanded prompt of a video (transformers' Qwen3VLProcessor.replace_video_token)."""
    slice_text = "<|vision_start|>" + "<|video_pad|>" * tokens_per_slice + "<|vision_end|>"
    return "".join(f"<{t:.1f} seconds>" + slice_text for t in timestamps)


def video_size(num_frames: int, height: int, width: int, rules: QwenVideoRules) -> tuple[int, int]:
    """(height, width) every frame is resized to (the video `smart_resize`, same expressions)."""
    factor, temporal = rules.patch_size * rules.merge_size, rules.temporal_patch_size
    if num_frames < temporal:
        raise InvalidMediaError(f"{num_frames} frame(s): a video needs {temporal}", reason=Reason.TOO_SMALL)
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise InvalidMediaError(f"video frames of {width}x{height}: aspect ratio over 200", reason=Reason.ASPECT_RATIO)
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(num_frames / temporal) * temporal
    if t_bar * h_bar * w_bar > rules.max_pixels:
        beta = math.sqrt((num_frames * height * width) / rules.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < rules.min_pixels:
        beta = math.sqrt(rules.min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def preprocess_video(frames: torch.Tensor, rules: QwenVideoRules) -> list[PreprocessedImage]:
    """Sampled frames (T, H, W, 3) uint8 on the CPU -> one item per temporal slice: patches (h*w, 3, 2, P, P)
    float32 row-major, grid (h, w), tokens (h/2)(w/2); pack them in order (`pack_images`)."""
    count, height, width, _ = frames.shape
    h, w = video_size(count, height, width, rules)
    video = frames.permute(0, 3, 1, 2).contiguous()  # (T, 3, H, W) uint8
    if (h, w) != (height, width):  # tvF.resize on a CPU: the uint8 kernel, frame by frame as one batch
        video = F.interpolate(video, size=(h, w), mode="bicubic", align_corners=False, antialias=True)
    mean = torch.tensor(rules.image_mean) * 255.0  # the backend folds 1/255 into mean and std (float32)
    std = torch.tensor(rules.image_std) * 255.0
    video = (video.float() - mean[:, None, None]) / std[:, None, None]  # (T, 3, h, w) float32
    t = rules.temporal_patch_size
    if pad := -count % t:
        video = torch.cat((video, video[-1:].expand(pad, -1, -1, -1)))
    p, gh, gw = rules.patch_size, h // rules.patch_size, w // rules.patch_size
    # (G, t, 3, gh, p, gw, p) -> (G, gh, gw, 3, t, p, p): per slice, row-major patches laid out as the Conv3d reads
    patches = video.view(-1, t, 3, gh, p, gw, p).permute(0, 3, 5, 2, 1, 4, 6).contiguous()
    tokens = (gh // rules.merge_size) * (gw // rules.merge_size)
    return [
        PreprocessedImage(piece.view(gh * gw, 3, t, p, p), (gh, gw), tokens, image_size=(width, height))
        for piece in patches
    ]
