"""`VideoRules`: a K2.5 checkpoint's video preprocessing, read once from its files.

Where from, first found: `video_preprocessor_config.json` (transformers' `Kimi_K25VideoProcessor`, written by
`save_pretrained`), the video keys of `preprocessor_config.json`'s `media_proc_cfg` (Moonshot's release:
sample_fps, temporal_merge_kernel_size, in_patch_limit_each_frame), else `Kimi_K25VideoProcessor`'s defaults,
which are the release's values: 2 fps, chunks of 4 frames, 4096 patches per frame, 512 patches on a side.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmproc.errors import ConfigError

VIDEO_FAMILIES = ("kimi_k25",)  # families whose tower has the time embedding and the temporal pool


@dataclass(frozen=True)
class VideoRules:
    """fps: default sampling rate; temporal_patch_size: frames per chunk; max_patches: per frame before padding
    (navit's budget); max_side: patches per side; mean/std on the 0..1 scale, applied as x / rescale to bytes."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 4
    max_patches: int = 4096
    max_side: int = 512
    fps: float = 2.0
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255

    def __post_init__(self) -> None:
        for name in ("patch_size", "merge_size", "temporal_patch_size", "max_patches", "max_side"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"video preprocess config: {name} must be a positive integer, got {value!r}")
        for name in ("fps", "rescale_factor"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value > 0)
            ):
                raise ConfigError(f"video preprocess config: {name} must be a positive number, got {value!r}")
        for name in ("image_mean", "image_std"):
            value = getattr(self, name)
            if not isinstance(value, list | tuple) or len(value) != 3:
                raise ConfigError(f"video preprocess config: {name} must be 3 numbers, got {value!r}")
            object.__setattr__(self, name, tuple(float(x) for x in value))
        if self.max_side % self.merge_size:
            raise ConfigError(f"video preprocess config: max_side {self.max_side} is not a multiple of merge_size")

    @classmethod
    def from_transformers(cls, data: dict[str, Any]) -> VideoRules:
        """`Kimi_K25VideoProcessor` keys (its class defaults for those left out)."""
        size = data.get("size") or {"max_height": 512, "max_width": 512}
        if not isinstance(size, dict) or size.get("max_height") != size.get("max_width"):
            raise ConfigError(f"video preprocess config: size must hold equal max_height and max_width, got {size!r}")
        pick = {k: data[k] for k in ("patch_size", "merge_size", "temporal_patch_size", "max_patches") if k in data}
        pick |= {k: data[k] for k in ("fps", "image_mean", "image_std", "rescale_factor") if data.get(k) is not None}
        return cls(max_side=size["max_height"], **pick)

    @classmethod
    def from_media_proc_cfg(cls, media: dict[str, Any]) -> VideoRules:
        renames = {
            "patch_size": "patch_size",
            "merge_kernel_size": "merge_size",
            "temporal_merge_kernel_size": "temporal_patch_size",
            "in_patch_limit_each_frame": "max_patches",
            "patch_limit_on_one_side": "max_side",
            "sample_fps": "fps",
            "image_mean": "image_mean",
            "image_std": "image_std",
        }
        fields = {ours: media[theirs] for theirs, ours in renames.items() if media.get(theirs) is not None}
        kernel = fields.get("merge_size")
        if isinstance(kernel, list | tuple):  # [m, m] in some converted checkpoints
            fields["merge_size"] = kernel[0]
        return cls(**fields)

    def to_public_dict(self) -> dict[str, Any]:
        return {
            "fps": self.fps,
            "temporal_patch_size": self.temporal_patch_size,
            "max_patches_per_frame": self.max_patches,
            "max_side": self.max_side,
        }


def load_video_rules(model_dir: Path | str | None) -> VideoRules:
    """The video rules of a checkpoint directory (None: a preset's, the defaults). ConfigError naming the file."""
    if model_dir is None:
        return VideoRules()
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        path = Path(model_dir) / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if name.startswith("video_"):
                return VideoRules.from_transformers(data)
            media = data.get("media_proc_cfg") if isinstance(data, dict) else None
            if isinstance(media, dict) and "temporal_merge_kernel_size" in media:
                return VideoRules.from_media_proc_cfg(media)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ConfigError, TypeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
    return VideoRules()
