"""`PreprocessConfig`: the image-processor settings of a checkpoint, parsed once from preprocessor_config.json.

Three layouts: Kimi-VL (top-level keys; missing ones take `KimiVLImageProcessor.__init__`'s defaults, as
transformers would), K2.5 (`media_proc_cfg`; missing ones take K2.5's own file; video keys ignored) and Qwen3-VL
(`Qwen2VLImageProcessor` keys; mmproc/preprocess/qwen3_vl_config.py). Qwen files may live only in
processor_config.json, nested under "image_processor".
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from mmproc.errors import ConfigError
from mmproc.preprocess.bounds import max_patches_bound
from mmproc.preprocess.qwen3_vl_config import (
    QWEN3_VL_VALUES,
    check_qwen3_vl,
    qwen3_vl_fields,
    qwen3_vl_max_grid_side,
    qwen3_vl_max_patches,
)
from mmproc.preprocess.transparent_bg import TransparentBackground

Family = Literal["kimi_vl", "kimi_k25", "kimi_k3", "qwen3_vl"]
FAMILIES: tuple[Family, ...] = ("kimi_vl", "kimi_k25", "kimi_k3", "qwen3_vl")
NAVIT_FAMILIES = ("kimi_k25", "kimi_k3")  # K2.5's media_proc_cfg rules (K3 adds the transparent background)

# MoonViT's 2D RoPE table covers 512 x 512 patches; KimiVLImageProcessor.rescale raises "Exceed pos emb" when a
# grid side reaches it. K2.5 enforces the same limit through `patch_limit_on_one_side`.
KIMI_VL_MAX_GRID_SIDE = 511

# KimiVLImageProcessor.__init__ defaults (OPENAI_DATASET_MEAN / OPENAI_DATASET_STD), used for keys a Kimi-VL
# preprocessor_config.json leaves out.
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# Kimi K2.5's media_proc_cfg (image keys only).
_K25_DEFAULTS: dict[str, Any] = {
    "patch_size": 14,
    "merge_kernel_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "in_patch_limit": 16384,
    "patch_limit_on_one_side": 512,
    "fixed_output_tokens": None,
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(name: str, value: object) -> int:
    if not _is_int(value) or value < 1:  # type: ignore[operator]
        raise ConfigError(f"preprocess config: {name} must be a positive integer, got {value!r}")
    return value  # type: ignore[return-value]


def _triple(name: str, value: object, *, positive: bool) -> tuple[float, float, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ConfigError(f"preprocess config: {name} must be a list of 3 numbers (R, G, B), got {value!r}")
    out = []
    for i, x in enumerate(value):
        if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
            raise ConfigError(f"preprocess config: {name}[{i}] must be a finite number, got {x!r}")
        if positive and x <= 0:
            raise ConfigError(f"preprocess config: {name}[{i}] must be > 0, got {x!r}")
        out.append(float(x))
    return (out[0], out[1], out[2])


@dataclass(frozen=True)
class PreprocessConfig:
    """Image-processor rules of one checkpoint. Build with `kimi_vl()`, `kimi_k25()`, `from_dict()` or
    `load_preprocess_config()`; fields are validated here (ConfigError naming the field).

    Family-specific fields are None for the other family: `in_token_limit` and `pad_input` belong to
    Kimi-VL (KimiVLImageProcessor), `in_patch_limit` and `patch_limit_on_one_side` to K2.5 (media_proc_cfg).
    """

    family: Family
    patch_size: int
    merge_kernel_size: tuple[int, int]  # (kh, kw)
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    in_token_limit: int | None = None  # Kimi-VL: limit on (w // p) * (h // p) before padding
    pad_input: bool | None = None  # Kimi-VL: pad to the merge kernel (True) or resize down to it (False)
    in_patch_limit: int | None = None  # K2.5: limit on (w // p) * (h // p)
    patch_limit_on_one_side: int | None = None  # K2.5: limit on each side, in patches
    transparent_bg: TransparentBackground | None = None  # K3: composite transparent images onto this
    min_pixels: int | None = None  # Qwen3-VL: smart_resize's pixel budget (size.shortest_edge / longest_edge)
    max_pixels: int | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError(f"preprocess config: family must be one of {FAMILIES}, got {self.family!r}")
        if self.transparent_bg is not None and self.family != "kimi_k3":
            raise ConfigError("preprocess config: transparent_bg_config is a Kimi K3 setting")
        _positive_int("patch_size", self.patch_size)
        kernel = self.merge_kernel_size
        if not isinstance(kernel, (list, tuple)) or len(kernel) != 2:
            raise ConfigError(f"preprocess config: merge_kernel_size must be [kh, kw], got {kernel!r}")
        kernel = (_positive_int("merge_kernel_size[0]", kernel[0]), _positive_int("merge_kernel_size[1]", kernel[1]))
        # Frozen dataclass: normalize lists from JSON to tuples once, here.
        object.__setattr__(self, "merge_kernel_size", kernel)
        object.__setattr__(self, "image_mean", _triple("image_mean", self.image_mean, positive=False))
        object.__setattr__(self, "image_std", _triple("image_std", self.image_std, positive=True))
        if self.family == "qwen3_vl":
            check_qwen3_vl(self)
        elif self.family == "kimi_vl":
            self._check_kimi_vl()
        else:
            self._check_kimi_k25()

    def _check_kimi_vl(self) -> None:
        _positive_int("in_token_limit", self.in_token_limit)
        if not isinstance(self.pad_input, bool):
            raise ConfigError(f"preprocess config: pad_input must be true or false, got {self.pad_input!r}")
        if self.in_patch_limit is not None or self.patch_limit_on_one_side is not None:
            raise ConfigError("preprocess config: in_patch_limit / patch_limit_on_one_side are Kimi K2.5 settings")
        for i, k in enumerate(self.merge_kernel_size):
            if k > KIMI_VL_MAX_GRID_SIDE:
                raise ConfigError(f"preprocess config: merge_kernel_size[{i}] must be <= {KIMI_VL_MAX_GRID_SIDE}")

    def _check_kimi_k25(self) -> None:
        kh, kw = self.merge_kernel_size
        if kh != kw:
            raise ConfigError(f"preprocess config: merge_kernel_size must be square for Kimi K2.5, got {(kh, kw)}")
        _positive_int("in_patch_limit", self.in_patch_limit)
        side = _positive_int("patch_limit_on_one_side", self.patch_limit_on_one_side)
        # media_utils.navit_resize_image asserts token_side * merge <= patch_limit_on_one_side; that holds for
        # every image only when the side limit is a multiple of the kernel, so refuse other values up front.
        if side % kh:
            raise ConfigError(
                f"preprocess config: patch_limit_on_one_side ({side}) must be a multiple of merge_kernel_size ({kh})"
            )
        if self.in_token_limit is not None or self.pad_input is not None:
            raise ConfigError("preprocess config: in_token_limit / pad_input are Kimi-VL settings")

    # -- presets -------------------------------------------------------------------------------------------

    @classmethod
    def kimi_vl(cls) -> PreprocessConfig:
        """Kimi-VL-A3B (Instruct/Thinking) preprocessor_config.json."""
        return cls(
            family="kimi_vl",
            patch_size=14,
            merge_kernel_size=(2, 2),
            image_mean=(0.5, 0.5, 0.5),
            image_std=(0.5, 0.5, 0.5),
            in_token_limit=4096,
            pad_input=True,
        )

    @classmethod
    def kimi_k25(cls) -> PreprocessConfig:
        """Kimi K2.5 preprocessor_config.json `media_proc_cfg` (image keys)."""
        return cls._from_media_proc_cfg({})

    @classmethod
    def kimi_k3(cls) -> PreprocessConfig:
        """Kimi K3: K2.5's media_proc_cfg values, transparent pixels onto SGLang's default chessboard."""
        return cls._from_media_proc_cfg({"transparent_bg_config": {"pattern": "chessboard"}}, family="kimi_k3")

    @classmethod
    def qwen3_vl(cls) -> PreprocessConfig:
        """Qwen3-VL / Qwen3.5 / Qwen3.6 preprocessor_config.json (not transformers' Qwen2-VL class defaults)."""
        return cls(family="qwen3_vl", **QWEN3_VL_VALUES)

    @classmethod
    def default_for(cls, family: str) -> PreprocessConfig:
        """The rules a preset of `family` runs with (no checkpoint directory)."""
        if family not in FAMILIES:
            raise ConfigError(f"preprocess config: no rules for family {family!r}")
        return getattr(cls, family)()

    # -- parsing -------------------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: object, family: str | None = None) -> PreprocessConfig:
        """Parse a preprocessor_config.json object. `family`: the model's (K2.5 and K3 files share a layout);
        None detects Kimi-VL vs K2.5 from the layout."""
        if not isinstance(data, dict):
            raise ConfigError(f"preprocess config: expected a JSON object, got {type(data).__name__}")
        if family == "qwen3_vl":  # a Qwen2VLImageProcessor file alone could be Qwen2-VL's (not served): the model says
            return cls(family="qwen3_vl", **qwen3_vl_fields(data))
        if "media_proc_cfg" in data:
            media = data["media_proc_cfg"]
            if not isinstance(media, dict):
                raise ConfigError("preprocess config: media_proc_cfg must be an object")
            return cls._from_media_proc_cfg(media, family="kimi_k3" if family == "kimi_k3" else "kimi_k25")
        if str(data.get("image_processor_type", "")).endswith("Kimi_K25ImageProcessor"):
            return cls._from_media_proc_cfg(_transformers_k25_to_media_proc_cfg(data))
        if _is_kimi_vl(data):
            return cls._from_kimi_vl(data)
        raise ConfigError(
            "preprocess config: unknown layout: expected image_processor_type 'KimiVLImageProcessor' (Kimi-VL), "
            "'Kimi_K25ImageProcessor' (K2.5 written by transformers) or a 'media_proc_cfg' object (Kimi K2.5 / K3); "
            "got image_processor_type="
            f"{data.get('image_processor_type')!r}, keys {sorted(data)}"
        )

    @classmethod
    def _from_kimi_vl(cls, data: dict[str, Any]) -> PreprocessConfig:
        kernel = data.get("merge_kernel_size", [2, 2])
        if not isinstance(kernel, (list, tuple)):
            raise ConfigError(f"preprocess config: merge_kernel_size must be [kh, kw], got {kernel!r}")
        return cls(
            family="kimi_vl",
            patch_size=data.get("patch_size", 14),
            merge_kernel_size=tuple(kernel),  # type: ignore[arg-type]  # length checked in __post_init__
            image_mean=data.get("image_mean", _CLIP_MEAN),
            image_std=data.get("image_std", _CLIP_STD),
            in_token_limit=data.get("in_token_limit", 4096),
            pad_input=data.get("pad_input", False),
        )

    @classmethod
    def _from_media_proc_cfg(cls, media: dict[str, Any], family: Family = "kimi_k25") -> PreprocessConfig:
        merged = {**_K25_DEFAULTS, **media}
        bg = merged.get("transparent_bg_config") if family == "kimi_k3" else None
        if merged["fixed_output_tokens"] is not None:
            raise ConfigError(
                "preprocess config: media_proc_cfg.fixed_output_tokens is set "
                f"({merged['fixed_output_tokens']!r}); it is not supported (images are served at native resolution)"
            )
        kernel = merged["merge_kernel_size"]
        # K2.5 stores one int; tolerate [m, m] as some converted checkpoints do.
        kernel_hw = tuple(kernel) if isinstance(kernel, (list, tuple)) else (kernel, kernel)
        return cls(
            family=family,
            patch_size=merged["patch_size"],
            merge_kernel_size=kernel_hw,  # type: ignore[arg-type]  # checked in __post_init__
            image_mean=merged["image_mean"],
            image_std=merged["image_std"],
            in_patch_limit=merged["in_patch_limit"],
            patch_limit_on_one_side=merged["patch_limit_on_one_side"],
            transparent_bg=None if bg is None else TransparentBackground.from_dict(bg),
        )

    # -- derived limits --------------------------------------------------------------------------------------

    @property
    def max_grid_side(self) -> tuple[int, int]:
        """Largest grid (h, w) side an accepted image can have, in patches (a multiple of the kernel)."""
        kh, kw = self.merge_kernel_size
        if self.family == "qwen3_vl":
            return qwen3_vl_max_grid_side(self)
        if self.family == "kimi_vl":
            return (KIMI_VL_MAX_GRID_SIDE // kh * kh, KIMI_VL_MAX_GRID_SIDE // kw * kw)
        side = self.patch_limit_on_one_side
        assert side is not None
        return (side, side)

    @cached_property
    def max_patches_per_image(self) -> int:
        """Upper bound of `grid_h * grid_w` over every image `preprocess_image` accepts (see `bounds.py`)."""
        if self.family == "qwen3_vl":
            return qwen3_vl_max_patches(self)
        limit = self.in_token_limit if self.family == "kimi_vl" else self.in_patch_limit
        assert limit is not None
        return max_patches_bound(limit, self.merge_kernel_size, self.max_grid_side)

    @property
    def max_tokens_per_image(self) -> int:
        """Upper bound of the embeddings one image yields (grids are multiples of the kernel)."""
        kh, kw = self.merge_kernel_size
        return self.max_patches_per_image // (kh * kw)

    def to_public_dict(self) -> dict[str, Any]:
        """The rules and limits as plain JSON-able values, for GetServerInfo."""
        out: dict[str, Any] = {
            "family": self.family,
            "patch_size": self.patch_size,
            "merge_kernel_size": list(self.merge_kernel_size),
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
        }
        if self.family == "qwen3_vl":
            out |= {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels}
        elif self.family == "kimi_vl":
            out |= {"in_token_limit": self.in_token_limit, "pad_input": self.pad_input}
        else:
            out |= {"in_patch_limit": self.in_patch_limit, "patch_limit_on_one_side": self.patch_limit_on_one_side}
        if self.transparent_bg is not None:
            out["transparent_bg"] = dataclasses.asdict(self.transparent_bg)
        out |= {
            "max_grid_side": list(self.max_grid_side),
            "max_patches_per_image": self.max_patches_per_image,
            "max_tokens_per_image": self.max_tokens_per_image,
        }
        return out


def _transformers_k25_to_media_proc_cfg(data: dict[str, Any]) -> dict[str, Any]:
    """transformers' Kimi_K25ImageProcessor keys -> Moonshot's media_proc_cfg names (same navit rule):
    max_patches = in_patch_limit, size.max_height = size.max_width = patch_limit_on_one_side (in patches),
    merge_size = merge_kernel_size."""
    out = {k: data[k] for k in ("patch_size", "image_mean", "image_std") if k in data}
    renames = (("max_patches", "in_patch_limit"), ("merge_size", "merge_kernel_size"))
    out |= {ours: data[theirs] for theirs, ours in renames if theirs in data}
    size = data.get("size")
    if size is not None:
        if not isinstance(size, dict) or size.get("max_height") != size.get("max_width"):
            raise ConfigError(f"preprocess config: size must hold equal max_height and max_width, got {size!r}")
        out["patch_limit_on_one_side"] = size["max_height"]
    return out


def _is_kimi_vl(data: dict[str, Any]) -> bool:
    if str(data.get("image_processor_type", "")).endswith("KimiVLImageProcessor"):
        return True
    auto_map = data.get("auto_map")
    return isinstance(auto_map, dict) and str(auto_map.get("AutoImageProcessor", "")).endswith("KimiVLImageProcessor")


def load_preprocess_config(model_dir: Path | str, family: str | None = None) -> PreprocessConfig:
    """Read `<model_dir>/preprocessor_config.json` for a model of `family`. ConfigError naming the file and the
    problem; a file of another family's layout is refused."""
    path = Path(model_dir) / "preprocessor_config.json"
    nested = Path(model_dir) / "processor_config.json"  # transformers 5 may write only this, the settings nested
    if not path.is_file() and nested.is_file():
        path, data = nested, _read_json(nested).get("image_processor")
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: no 'image_processor' object (and no preprocessor_config.json beside it)")
    elif not path.is_file():
        raise ConfigError(f"{path}: not found (a checkpoint directory must contain preprocessor_config.json)")
    else:
        data = _read_json(path)
    try:
        cfg = PreprocessConfig.from_dict(data, family)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    if family is not None and cfg.family != family:
        raise ConfigError(f"{path}: holds {cfg.family} preprocessing rules, the model is {family}")
    return cfg


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: cannot read JSON: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
