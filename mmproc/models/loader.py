"""Build a `VisionEncoder` from a local Hugging Face checkpoint directory, or from a preset with deterministic
random weights.

Only the vision tower and projector tensors are read: shards are opened with `safetensors.safe_open` (header +
mmap) only when they hold a needed tensor, and each needed tensor is read by name. The module is built on the
`meta` device and the tensors are assigned (`load_state_dict(assign=True)`), so start-up allocates once.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from mmproc.errors import ConfigError
from mmproc.models.config import VisionConfig
from mmproc.models.family import CheckpointLayout
from mmproc.models.random_init import random_state_dict
from mmproc.models.registry import BY_NAME, PRESETS, parse_config
from mmproc.models.vision_encoder import VisionEncoder

logger = logging.getLogger(__name__)

_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
# What an FP8 checkpoint stores beside a quantized weight. The FP8 releases (e.g. Qwen3.6-35B-A3B-FP8) leave the
# vision tower in bf16 (`quantization_config.modules_to_not_convert`); a quantized tower is refused, named.
_QUANT_SUFFIXES = (".weight_scale_inv", ".weight_scale", ".input_scale")
_UNQUANTIZED = "mmproc loads the vision tower unquantized, as the FP8 releases keep it (modules_to_not_convert)"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def expected_shapes(config: VisionConfig) -> dict[str, torch.Size]:
    """VisionEncoder state-dict name -> shape, without allocating (built on `meta`)."""
    with torch.device("meta"):
        model = VisionEncoder(config)
    return {name: t.shape for name, t in model.state_dict().items()}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def build_encoder(
    config: VisionConfig,
    tensors: Iterable[tuple[str, Tensor]],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str = torch.float32,
) -> VisionEncoder:
    """Assemble a VisionEncoder from (internal name, tensor) pairs: each is moved, then cast on the device.

    Inference only: parameters do not require grad and the module is in eval mode.
    """
    device, dtype = torch.device(device), resolve_dtype(dtype)
    state = {name: t.to(device).to(dtype) for name, t in tensors}
    with torch.device("meta"):
        model = VisionEncoder(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.requires_grad_(False).eval()


def encoder_from_checkpoint_tensors(
    config: VisionConfig,
    tensors: Mapping[str, Tensor],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str = torch.float32,
) -> VisionEncoder:
    """A VisionEncoder from in-memory tensors named as in the checkpoint (extra non-vision keys are ignored)."""
    shapes = expected_shapes(config)
    layout = BY_NAME[config.family].layouts[0]
    pairs = []
    for name, shape in shapes.items():
        key = layout.to_checkpoint_key(name)
        if key not in tensors:
            raise ConfigError(f"missing tensor {key}")
        if tuple(tensors[key].shape) != tuple(shape):
            raise ConfigError(f"tensor {key} has shape {tuple(tensors[key].shape)}, expected {tuple(shape)}")
        pairs.append((name, tensors[key]))
    return build_encoder(config, pairs, device=device, dtype=dtype)


def load_encoder(
    model_path: Path | str | None,
    *,
    preset: str = "tiny",
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str = torch.float32,
) -> VisionEncoder:
    """The encoder from a checkpoint directory, or (model_path None) the preset with deterministic random weights.

    The returned module has `.config`. Bad checkpoints raise ConfigError naming the tensor and the file.
    """
    start = time.perf_counter()
    if model_path is None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        config = PRESETS[preset]
        model = build_encoder(config, random_state_dict(expected_shapes(config)), device=device, dtype=dtype)
        source = f"preset {preset!r} (random weights)"
    else:
        path = Path(model_path)
        config = read_config(path)
        model = build_encoder(config, read_vision_tensors(path, config), device=device, dtype=dtype)
        source = str(path)
    logger.info(
        "loaded vision encoder %s [family %s, %d layers, hidden %d -> %d] from %s on %s/%s in %.2fs",
        config.name,
        config.family,
        config.num_layers,
        config.hidden_size,
        config.text_hidden_size,
        source,
        model.device,
        model.dtype,
        time.perf_counter() - start,
    )
    return model


def read_config(path: Path) -> VisionConfig:
    """VisionConfig from `path/config.json`."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"no config.json in {path}")
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {config_file}: {exc}") from None
    return parse_config(raw, name=path.name or None)


def _weight_map(path: Path) -> dict[str, Path]:
    """Checkpoint tensor name -> file, from model.safetensors.index.json or a single model.safetensors."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot read the weight_map of {index}: {exc!r}") from None
        return {str(k): path / str(v) for k, v in weight_map.items()}
    single = path / "model.safetensors"
    if single.is_file():
        with safe_open(single, framework="pt") as f:  # header only
            return dict.fromkeys(f.keys(), single)
    raise ConfigError(f"no model.safetensors or model.safetensors.index.json in {path}")


def read_vision_tensors(path: Path, config: VisionConfig, *, read: bool = True) -> Iterable[tuple[str, Tensor]]:
    """Yield (internal name, CPU tensor) for every tower/projector tensor, checked against the expected shapes.

    Language-model tensors are never read, and shards holding none of the needed tensors are never opened.
    """
    shapes = expected_shapes(config)
    weight_map = _weight_map(path)
    layout = _pick_layout(BY_NAME[config.family].layouts, shapes, weight_map, path)
    wanted = {layout.to_checkpoint_key(name): name for name in shapes}
    for key, file in weight_map.items():
        if key.startswith(layout.vision_prefixes) and key.endswith(_QUANT_SUFFIXES):
            raise ConfigError(f"vision tensor {key} in {file} is an FP8 scale: {_UNQUANTIZED}")
        if key.startswith(layout.vision_prefixes) and key not in wanted:
            raise ConfigError(f"unexpected vision tensor {key} in {file} (not part of a {config.family} encoder)")
    by_file: dict[Path, list[str]] = defaultdict(list)
    for key in wanted:
        by_file[weight_map[key]].append(key)
    for file, keys in by_file.items():
        if not file.is_file():
            raise ConfigError(f"missing shard {file} (holds {keys[0]})")
        with safe_open(file, framework="pt", device="cpu") as f:
            present = set(f.keys())
            for key in keys:  # check every tensor of this file before reading any
                if key not in present:
                    raise ConfigError(f"missing tensor {key} in {file}")
                info = f.get_slice(key)
                shape, want = tuple(info.get_shape()), tuple(shapes[wanted[key]])
                if shape != want:
                    raise ConfigError(f"tensor {key} in {file} has shape {shape}, expected {want}")
                if info.get_dtype().startswith("F8"):
                    raise ConfigError(f"tensor {key} in {file} is {info.get_dtype()} (FP8): {_UNQUANTIZED}")
                if info.get_dtype() not in _FLOAT_DTYPES:
                    raise ConfigError(f"tensor {key} in {file} has unsupported dtype {info.get_dtype()}")
            for key in keys if read else ():
                yield wanted[key], f.get_tensor(key)


def check_checkpoint(path: Path, config: VisionConfig) -> None:
    """Every vision tensor present, of its shape and dtype, from the safetensors headers alone (no tensor read)."""
    try:
        for _ in read_vision_tensors(path, config, read=False):
            pass
    except SafetensorError as exc:  # a truncated or foreign file: name it
        files = sorted({*path.glob("*.safetensors")})
        bad = next((f for f in files if not _opens(f)), path)
        raise ConfigError(f"cannot read {bad}: {exc} (truncated?)") from None


def _opens(file: Path) -> bool:
    try:
        with safe_open(file, framework="pt"):
            return True
    except SafetensorError:
        return False


def _pick_layout(
    layouts: tuple[CheckpointLayout, ...], shapes: Mapping[str, torch.Size], weight_map: Mapping[str, Path], path: Path
) -> CheckpointLayout:
    """The first layout whose every tensor name is in the checkpoint; else ConfigError naming, per layout tried,
    the first tensor it missed."""
    missed = []
    for layout in layouts:
        absent = next((k for k in map(layout.to_checkpoint_key, shapes) if k not in weight_map), None)
        if absent is None:
            return layout
        missed.append(f"{absent} ({layout.name} layout)")
    raise ConfigError(f"missing tensor {' / '.join(missed)} in the checkpoint at {path}")
