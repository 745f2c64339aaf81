"""Sampled video frames -> chunks of patches, as transformers 5.23's `Kimi_K25VideoProcessor._preprocess`.

Per chunk of `temporal_patch_size` consecutive sampled frames (the last one may be shorter): the navit size
rule of K2.5 images with the video budget (`max_patches` per frame), torchvision's bicubic resize of uint8
frames with antialiasing (`tvF.resize`: on the CPU torch's native uint8 kernel, elsewhere float32 then clamp
and round), zero bytes padded right/bottom to a multiple of patch x merge, then `(x - mean / r) / (std / r)`
in float32 (r = rescale_factor: the fused rescale + normalize), patchified frame-major to (t*h*w, 3, p, p).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mmproc.errors import InvalidMediaError, Reason
from mmproc.preprocess.config import PreprocessConfig
from mmproc.preprocess.kimi_k25 import plan_kimi_k25
from mmproc.preprocess.patchify import normalize_pad_patchify
from mmproc.preprocess.video_config import VideoRules
from mmproc.types import PreprocessedImage, PreprocessedVideo


def video_lut(rules: VideoRules) -> np.ndarray:
    """(3, 256) float32: the normalized value of each byte per channel, with the reference's float32 ops."""
    mean = torch.tensor(rules.image_mean) * (1.0 / rules.rescale_factor)
    std = torch.tensor(rules.image_std) * (1.0 / rules.rescale_factor)
    x = torch.arange(256, dtype=torch.float32).expand(3, 256)
    return ((x - mean[:, None]) / std[:, None]).numpy()


def _navit(rules: VideoRules) -> PreprocessConfig:
    # The image rule's arithmetic with the video budget: Kimi_K25VideoProcessor's navit_resize is the same rule.
    return PreprocessConfig(
        family="kimi_k25",
        patch_size=rules.patch_size,
        merge_kernel_size=(rules.merge_size, rules.merge_size),
        image_mean=rules.image_mean,
        image_std=rules.image_std,
        in_patch_limit=rules.max_patches,
        patch_limit_on_one_side=rules.max_side,
    )


def frame_grid(width: int, height: int, rules: VideoRules) -> tuple[int, int]:
    """(grid_h, grid_w) in patches of every chunk of a width x height video; no pixels touched."""
    if width < 1 or height < 1:
        raise InvalidMediaError(f"video frames are {width}x{height}", reason=Reason.TOO_SMALL)
    return plan_kimi_k25(width, height, _navit(rules)).grid_hw


def video_num_tokens(num_frames: int, width: int, height: int, rules: VideoRules) -> int:
    """ceil(frames / temporal_patch_size) chunks x one frame's merged tokens."""
    gh, gw = frame_grid(width, height, rules)
    chunks = -(-num_frames // rules.temporal_patch_size)
    return chunks * (gh // rules.merge_size) * (gw // rules.merge_size)


def resize_frames(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(T, 3, H, W) uint8 -> (T, 3, h, w) uint8, torchvision v2's bicubic antialiased resize of uint8 images."""
    if tuple(frames.shape[-2:]) == size:
        return frames
    if frames.device.type == "cpu":
        return F.interpolate(frames, size=size, mode="bicubic", align_corners=False, antialias=True)
    out = F.interpolate(frames.float(), size=size, mode="bicubic", align_corners=False, antialias=True)
    return out.clamp_(0, 255).round_().to(torch.uint8)


class FramePatcher:
    """One sampled frame at a time -> its patches: `preprocess_video`'s arithmetic (the resize of a chunk is
    per frame), so that a decode keeps patches, never a video's frames. Sized by the first frame."""

    def __init__(self, width: int, height: int, rules: VideoRules) -> None:
        self.plan = plan_kimi_k25(width, height, _navit(rules))
        self.size = (width, height)
        new_w, new_h = self.plan.resize_to or (width, height)
        self._resize_to = (new_h, new_w)
        self._lut = video_lut(rules)
        self._patch = rules.patch_size

    @property
    def patches_per_frame(self) -> int:
        gh, gw = self.plan.grid_hw
        return gh * gw

    def __call__(self, frame: np.ndarray) -> torch.Tensor:
        """(H, W, 3) uint8 RGB -> (gh * gw, 3, p, p) float32."""
        tensor = torch.from_numpy(frame).permute(2, 0, 1)[None].contiguous()  # (1, 3, H, W)
        rgb = resize_frames(tensor, self._resize_to)[0].permute(1, 2, 0).numpy()  # (h, w, 3) uint8
        return normalize_pad_patchify(rgb, self._lut, self.plan.pad_wh, self._patch)[0]


def preprocess_video(frames: np.ndarray, indices: tuple[int, ...], fps: float, rules: VideoRules) -> PreprocessedVideo:
    """frames (T, H, W, 3) uint8 RGB, the sampled frames numbered `indices` of a `fps` stream -> chunks."""
    count, height, width, _ = frames.shape
    plan = plan_kimi_k25(width, height, _navit(rules))
    new_w, new_h = plan.resize_to or (width, height)
    lut = video_lut(rules)
    tensor = torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()  # (T, 3, H, W), as the reference holds it
    step, merge = rules.temporal_patch_size, rules.merge_size
    gh, gw = plan.grid_hw
    chunks, stamps = [], []
    for start in range(0, count, step):
        chunk = resize_frames(tensor[start : start + step], (new_h, new_w))
        rgb = chunk.permute(0, 2, 3, 1).numpy()  # (t, h, w, 3) uint8
        patches = torch.cat([normalize_pad_patchify(frame, lut, plan.pad_wh, rules.patch_size)[0] for frame in rgb])
        chunks.append(
            PreprocessedImage(
                patches=patches,
                grid_hw=(gh, gw),
                num_tokens=(gh // merge) * (gw // merge),
                image_size=(width, height),
                frames=len(rgb),
            )
        )
        stamps.append(indices[start] / fps)
    return PreprocessedVideo(
        chunks=tuple(chunks), indices=tuple(indices), timestamps=tuple(stamps), source_size=(width, height), fps=fps
    )
