"""What a model family tells the rest of mmproc: how to recognise its `config.json`, how to parse it, which tower
and head (merger(s), projector) to build, which checkpoint tensor names it uses, and its presets. One
`ModelFamily` per module (moonvit.py, moonvit3d.py, qwen3_vl.py); mmproc/models/registry.py lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from mmproc.errors import ConfigError
from mmproc.layers.kernels import KernelOptions
from mmproc.models.config import VisionConfig
from mmproc.models.tower_base import RopeTower


@dataclass(frozen=True)
class CheckpointLayout:
    """One way a family's checkpoints name their tensors.

    keys: (checkpoint prefix, VisionEncoder prefix) pairs; the first matching prefix wins.
    vision_prefixes: every checkpoint key under these must be one the encoder expects (others are the LLM's).
    """

    name: str
    keys: tuple[tuple[str, str], ...]
    vision_prefixes: tuple[str, ...]

    def to_checkpoint_key(self, name: str) -> str:
        """VisionEncoder state-dict name -> checkpoint tensor name."""
        for ckpt, internal in self.keys:
            if name.startswith(internal):
                return ckpt + name[len(internal) :]
        raise KeyError(name)


ConfigParser = Callable[[Mapping[str, Any], str], VisionConfig]
TowerFactory = Callable[[VisionConfig, "KernelOptions | None"], RopeTower]  # state-dict prefix `tower.`
# head(config): forward(hidden (L, D), merge_index (T*kk,), out, taps) -> (T, config.output_dim); prefix `projector.`
HeadFactory = Callable[[VisionConfig], nn.Module]


@dataclass(frozen=True)
class ModelFamily:
    """name: the family id ("kimi_k3"), also `VisionConfig.family`. model_types: `config.json` model_type values
    (top level, or of vision_config) that name this family. parse(config, name): VisionConfig or ConfigError.
    tower / head: build the modules `VisionEncoder` composes. layouts: tensor naming schemes, tried in order.
    presets: name -> config (random weights)."""

    name: str
    model_types: tuple[str, ...]
    parse: ConfigParser
    tower: TowerFactory
    head: HeadFactory
    layouts: tuple[CheckpointLayout, ...]
    presets: Mapping[str, VisionConfig]


# -- helpers the families' parsers share ------------------------------------------------------------------------


def get_field(section: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in section or section[key] is None:
        raise ConfigError(f"config.json: missing field '{where}.{key}'")
    return section[key]


def get_int(section: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = section.get(key, default) if default is not None else get_field(section, key, where)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"config.json: field '{where}.{key}' must be a positive integer, got {value!r}")
    return value


def first_key(section: Mapping[str, Any], keys: tuple[str, ...], where: str) -> str:
    """The first of `keys` present in `section` (one concept, several spellings across layouts)."""
    for key in keys:
        if section.get(key) is not None:
            return key
    raise ConfigError(f"config.json: missing field '{where}.{keys[0]}' (also tried {', '.join(keys[1:])})")


def require(value: Any, supported: Any, key: str) -> None:
    if value != supported:
        raise ConfigError(f"config.json: {key} {value!r} is not supported (want {supported!r})")


def build(name: str, **fields: Any) -> VisionConfig:
    try:
        return VisionConfig(name=name, **fields)
    except ConfigError as exc:
        raise ConfigError(f"config.json (vision_config): {exc}") from None
