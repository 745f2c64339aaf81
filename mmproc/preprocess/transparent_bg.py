"""Kimi K3's `transparent_bg_config`: the background transparent pixels are composited onto after the resize."""

from __future__ import annotations

from dataclasses import dataclass

from mmproc.errors import ConfigError


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"preprocess config: {name} must be a positive integer, got {value!r}")
    return value


_BG_PATTERNS = {"black": 0.0, "white": 255.0, "gray": 128.0, "chessboard": None}


@dataclass(frozen=True)
class TransparentBackground:
    """K3 `media_proc_cfg.transparent_bg_config`: what transparent pixels are composited onto after the resize.

    pattern: "chessboard" (squares of `square_size` resized pixels from the top-left corner; with
    `square_on_top_left` the squares of odd parity (y // size + x // size) are `gray_value` and the top-left one
    `white_value`, without it the reverse: SGLang's reading of the key), or "black" / "white" / "gray"
    (0 / 255 / 128).
    Defaults: those of SGLang 0.5.23's `fill_transparent_bg` for keys the file leaves out.
    """

    pattern: str = "black"
    square_size: int = 16
    white_value: float = 255.0
    gray_value: float = 200.0
    square_on_top_left: bool = True

    def __post_init__(self) -> None:
        if self.pattern not in _BG_PATTERNS:
            raise ConfigError(f"preprocess config: transparent_bg_config.pattern must be one of {sorted(_BG_PATTERNS)}")
        _positive_int("transparent_bg_config.chessboard_square_size", self.square_size)
        for name in ("white_value", "gray_value"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 255:
                raise ConfigError(f"preprocess config: transparent_bg_config.chessboard_{name} must be in 0..255")
        if not isinstance(self.square_on_top_left, bool):
            raise ConfigError("preprocess config: transparent_bg_config.chessboard_square_on_top_left must be a bool")

    @property
    def fill_value(self) -> float:
        value = _BG_PATTERNS[self.pattern]
        assert value is not None, "a chessboard has no single fill value"
        return value

    @classmethod
    def from_dict(cls, data: object) -> TransparentBackground:
        if not isinstance(data, dict):
            raise ConfigError("preprocess config: transparent_bg_config must be an object")
        stage = data.get("transparent_bg_fill_stage", "after_resize")
        if stage != "after_resize":
            raise ConfigError(f"preprocess config: transparent_bg_fill_stage {stage!r} is not supported")
        return cls(
            pattern=data.get("pattern", "black"),
            square_size=data.get("chessboard_square_size", 16),
            white_value=data.get("chessboard_white_value", 255.0),
            gray_value=data.get("chessboard_gray_value", 200.0),
            square_on_top_left=data.get("chessboard_square_on_top_left", True),
        )
