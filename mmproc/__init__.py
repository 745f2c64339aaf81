"""mmproc: an encoder sidecar for vision-language LLM serving (MoonViT for Kimi-VL / Kimi K2.5)."""

__version__ = "0.1.0"
