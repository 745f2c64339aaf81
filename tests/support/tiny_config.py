"""The `VisionConfig` of the tiny checkpoints (tests/support/checkpoints.py), built from the same sizes."""

from __future__ import annotations

from mmproc.models import VisionConfig
from tests.support.checkpoints import TINY_VISION


def config_for(layout: str) -> VisionConfig:
    v = TINY_VISION
    return VisionConfig(
        hidden_size=v["hidden_size"],
        num_layers=v["num_layers"],
        num_heads=v["num_heads"],
        intermediate_size=v["intermediate_size"],
        text_hidden_size=256,
        family=layout,
    )
