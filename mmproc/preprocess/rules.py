"""One preprocessing rule per model family, under the family's name (mmproc/models/registry.py lists the
families): the size arithmetic (`plan`) and the pixel work (`run`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from PIL import Image

from mmproc.preprocess.config import PreprocessConfig
from mmproc.preprocess.kimi_k3 import plan_kimi_k3, preprocess_kimi_k3
from mmproc.preprocess.kimi_k25 import plan_kimi_k25, preprocess_kimi_k25
from mmproc.preprocess.kimi_vl import plan_kimi_vl, preprocess_kimi_vl
from mmproc.preprocess.patchify import ResizePlan
from mmproc.types import PreprocessedImage


@dataclass(frozen=True)
class Rule:
    """plan(width, height, cfg): the resize/pad/grid from the size alone. run(image, cfg): the patches.
    keeps_alpha: the rule composites transparent images itself, so the decoder should keep their alpha."""

    plan: Callable[[int, int, PreprocessConfig], ResizePlan]
    run: Callable[[Image.Image, PreprocessConfig], PreprocessedImage]
    keeps_alpha: bool = False


RULES: Mapping[str, Rule] = MappingProxyType(
    {
        "kimi_vl": Rule(plan_kimi_vl, preprocess_kimi_vl),
        "kimi_k25": Rule(plan_kimi_k25, preprocess_kimi_k25),
        "kimi_k3": Rule(plan_kimi_k3, preprocess_kimi_k3, keeps_alpha=True),
    }
)
