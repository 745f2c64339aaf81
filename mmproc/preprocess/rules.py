"""One preprocessing rule per model family, under the family's name (mmproc/models/registry.py lists the
families): the size arithmetic (`plan`) and the pixel work (`run`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from PIL import Image
from torch import Tensor

from mmproc.preprocess.config import PreprocessConfig
from mmproc.preprocess.kimi_k3 import plan_kimi_k3, preprocess_kimi_k3
from mmproc.preprocess.kimi_k25 import kimi_k25_lut, plan_kimi_k25, preprocess_kimi_k25
from mmproc.preprocess.kimi_vl import kimi_vl_lut, plan_kimi_vl, preprocess_kimi_vl
from mmproc.preprocess.patchify import ResizePlan
from mmproc.preprocess.qwen3_vl import bicubic_antialias, plan_qwen3_vl, preprocess_qwen3_vl, qwen3_vl_lut
from mmproc.preprocess.resize import pillow_bicubic
from mmproc.types import PreprocessedImage


@dataclass(frozen=True)
class Rule:
    """plan(width, height, cfg): the resize/pad/grid from the size alone. run(image, cfg, normalize): the patches
    (float32, or with normalize=False the uint8 bytes and the table to normalize them with).
    lut(cfg): (3, 256) float32, the normalized value of each byte per channel (the same for an opaque image on
    any device: mmproc/preprocess/device.py). keeps_alpha: the rule composites transparent images itself, so the
    decoder should keep their alpha. resize_tensor(rgb (H, W, 3) uint8, (w, h)): the same resize on any device
    (mmproc/preprocess/device.py)."""

    plan: Callable[[int, int, PreprocessConfig], ResizePlan]
    run: Callable[[Image.Image, PreprocessConfig, bool], PreprocessedImage]
    lut: Callable[[PreprocessConfig], np.ndarray]
    keeps_alpha: bool = False
    resize_tensor: Callable[[Tensor, tuple[int, int]], Tensor] = pillow_bicubic


RULES: Mapping[str, Rule] = MappingProxyType(
    {
        "kimi_vl": Rule(plan_kimi_vl, preprocess_kimi_vl, kimi_vl_lut),
        "kimi_k25": Rule(plan_kimi_k25, preprocess_kimi_k25, kimi_k25_lut),
        "kimi_k3": Rule(plan_kimi_k3, preprocess_kimi_k3, kimi_k25_lut, keeps_alpha=True),
        "qwen3_vl": Rule(plan_qwen3_vl, preprocess_qwen3_vl, qwen3_vl_lut, True, bicubic_antialias),  # alpha: white
    }
)
