"""How an engine's prompt frames one image of each family: header, `num_tokens` placeholders, footer
(the token-count contract: docs/engines.md). A header may use the image's `{width}` and `{height}`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PromptFraming:
    """One family's framing of an image; the placeholder is repeated once per embedding row."""

    image_header: str
    placeholder: str
    image_footer: str

    def header(self, width: int, height: int) -> str:
        return self.image_header.format(width=width, height=height)

    def image_text(self, num_tokens: int, width: int, height: int) -> str:
        return self.header(width, height) + self.placeholder * num_tokens + self.image_footer


# by PreprocessConfig.family; tokens as Kimi-VL's processor and vLLM's KimiK25 `get_placeholder_str` spell them
FRAMINGS: dict[str, PromptFraming] = {
    "kimi_vl": PromptFraming("<|media_start|>image<|media_content|>", "<|media_pad|>", "<|media_end|>"),
    "kimi_k25": PromptFraming("<|media_begin|>image<|media_content|>", "<|media_pad|>", "<|media_end|>"),
    # K3 puts each image's size in its header (SGLang 0.5.23 processors/kimi_k3.py expands one <|media_pad|> so).
    "kimi_k3": PromptFraming(
        "<|media_begin|>image {width}x{height}<|media_content|>", "<|media_pad|>", "<|media_end|>"
    ),
    # Qwen3-VL / Qwen3.5 / Qwen3.6 (vLLM's Qwen3VL `get_placeholder_str`, transformers' Qwen3VLProcessor).
    "qwen3_vl": PromptFraming("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"),
}


@dataclass(frozen=True)
class VideoFraming:
    """Per chunk: its start time, a header, one placeholder per row, a footer."""

    chunk_header: str
    placeholder: str
    chunk_footer: str

    def chunk_text(self, timestamp_s: float, num_tokens: int) -> str:
        return timestamp_text(timestamp_s) + self.chunk_header + self.placeholder * num_tokens + self.chunk_footer

    def video_text(self, timestamps: Sequence[float], token_counts: Sequence[int]) -> str:
        return "".join(self.chunk_text(t, n) for t, n in zip(timestamps, token_counts, strict=True))


def timestamp_text(seconds: float) -> str:
    """HH:MM:SS.mmm, milliseconds truncated (transformers 5.23 Kimi_K25Processor.replace_video_token)."""
    return time.strftime("%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1000):03d}"


# transformers 5.23 Kimi_K25Processor: `<|kimi_k25_video_placeholder|>` is the tokenizer's video token.
VIDEO_FRAMINGS: dict[str, VideoFraming] = {
    "kimi_k25": VideoFraming(
        "<|media_begin|>video<|media_content|>", "<|kimi_k25_video_placeholder|>", "<|media_end|>"
    ),
}


def video_prompt(family: str, timestamps: Sequence[float], token_counts: Sequence[int]) -> str:
    try:
        return VIDEO_FRAMINGS[family].video_text(timestamps, token_counts)
    except KeyError:
        raise KeyError(f"no video framing for family {family!r}; known: {sorted(VIDEO_FRAMINGS)}") from None


def framing(family: str) -> PromptFraming:
    try:
        return FRAMINGS[family]
    except KeyError:
        raise KeyError(f"no prompt framing for family {family!r}; known: {sorted(FRAMINGS)}") from None


def placeholder_token_id(config: dict) -> int | None:
    """The placeholder's token id as a checkpoint's config.json states it, or None."""
    for key in ("media_placeholder_token_id", "image_token_id"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None
