"""Every model family mmproc serves, and how a checkpoint's `config.json` picks one: by `model_type` (top level,
else `vision_config.model_type`), never by which keys happen to be present.

Adding a family: a module with its `ModelFamily` (config parser, tower and head, checkpoint layouts, presets), one
entry below, and its preprocessing rule under the same name in mmproc/preprocess/rules.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from mmproc.errors import ConfigError
from mmproc.models.config import VisionConfig
from mmproc.models.family import ModelFamily
from mmproc.models.moonvit import KIMI_K25, KIMI_VL
from mmproc.models.moonvit3d import KIMI_K3
from mmproc.models.qwen3_vl import QWEN3_VL

FAMILIES: tuple[ModelFamily, ...] = (KIMI_VL, KIMI_K25, KIMI_K3, QWEN3_VL)
BY_NAME: Mapping[str, ModelFamily] = MappingProxyType({f.name: f for f in FAMILIES})
PRESETS: Mapping[str, VisionConfig] = MappingProxyType({k: v for f in FAMILIES for k, v in f.presets.items()})


def family_of(config: Mapping[str, Any]) -> ModelFamily:
    """The family a `config.json` object names. ConfigError naming model_type and the known values otherwise."""
    if not isinstance(config, Mapping):
        raise ConfigError("config.json must hold a JSON object")
    vision = config.get("vision_config")
    candidates = [("model_type", config.get("model_type"))]
    if isinstance(vision, Mapping):
        candidates.append(("vision_config.model_type", vision.get("model_type")))
    found = [(key, value, f) for key, value in candidates for f in FAMILIES if value in f.model_types]
    if found:
        (key, value, family), *others = found
        for other_key, other_value, other in others:
            if other is not family:
                raise ConfigError(
                    f"config.json: {key} {value!r} ({family.name}) contradicts {other_key} {other_value!r} ({other.name})"
                )
        return family
    known = sorted(t for f in FAMILIES for t in f.model_types)
    seen = ", ".join(f"{key}={value!r}" for key, value in candidates)
    raise ConfigError(f"config.json: unknown model family ({seen}); model_type must be one of {known}")


def parse_config(config: Mapping[str, Any], *, name: str | None = None) -> VisionConfig:
    """`config.json` object -> VisionConfig of its family."""
    family = family_of(config)
    return family.parse(config, name or family.name.replace("_", "-"))
