"""MoonViT vision tower + patch merger + projector (Kimi-VL / Kimi K2.5), its config and its loader."""

from mmproc.model.config import PRESETS, VisionConfig
from mmproc.model.encoder import VisionEncoder
from mmproc.model.loader import load_encoder

__all__ = ["PRESETS", "VisionConfig", "VisionEncoder", "load_encoder"]
