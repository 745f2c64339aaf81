"""Vision towers + patch merger + projector for every served family (registry.py), their config and loader."""

from mmproc.models.config import VisionConfig
from mmproc.models.loader import load_encoder
from mmproc.models.registry import FAMILIES, PRESETS, family_of, parse_config
from mmproc.models.vision_encoder import VisionEncoder

__all__ = ["FAMILIES", "PRESETS", "VisionConfig", "VisionEncoder", "family_of", "load_encoder", "parse_config"]
