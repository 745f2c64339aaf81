"""Command-line flags made from the ServerSettings fields: every setting `name` is `--name` (dashes), with the
field's type, choices and description, so that a new setting needs no CLI code. A flag left out is None and
does not override the environment or the config file."""

from __future__ import annotations

import argparse
import textwrap
import types
import typing
from pathlib import Path

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from service.app.settings import ServerSettings


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    return "MMPROC_" + field.upper()


def _plain(annotation: object) -> object:
    """`X | None` -> X."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


# `serve --help` in sections. A setting missing here (a new one) joins the section of the setting declared
# before it in ServerSettings, so that it still shows next to its neighbours.
GROUPS: dict[str, tuple[str, ...]] = {
    "model": (
        "model_path", "model", "device", "dtype", "quantization", "cuda_graphs", "cuda_graph_max_patches",
        "cuda_graph_max_image_patches", "attention_backend", "torch_threads", "event_loop", "grpc_loop",
    ),
    "network": ("grpc_address", "http_address", "http_max_connections", "max_message_mb", "stream_chunk_mb", "max_connection_age_s"),
    "transport (CUDA IPC and serialized replies)": (
        "transport", "ipc_pool_mb", "ipc_word_slots", "ipc_ttl_s", "ipc_fallback", "host_malloc_reuse_mb",
        "malloc_arena_max", "max_reply_mb", "pinned_reply_mb",
    ),
    "key store (results kept for engines)": ("key_store_mb", "key_store_ttl_s", "key_store_max_keys"),
    "request limits (checked before decoding)": (
        "max_images_per_request", "max_request_mb", "max_image_mb", "max_pixels", "max_aspect_ratio",
        "max_patches_per_request", "max_jpeg_scans", "max_jpeg_passes", "max_chunks", "max_rle_ratio", "apply_exif_orientation",
    ),
    "admission and batching": (
        "max_inflight_requests", "max_inflight_patches", "max_batch_patches", "max_batch_images", "max_wait_ms",
        "max_queued_images", "default_deadline_s",
    ),
    "decoding (docs/reliability.md)": (
        "preprocess_workers", "decode_isolation", "decode_worker_memory_mb", "decode_timeout_s",
        "decode_budget_base_s", "decode_budget_per_mp_s", "decode_request_cpu_s", "decode_request_megapixels",
    ),
    "security": ("auth_token", "auth_token_file"),
    "SGLang encoder (docs/engines.md)": (
        "sglang_address", "sglang_push_timeout_s", "sglang_register_wait_s", "sglang_fetch_hosts",
        "sglang_fetch_max_mb", "sglang_fetch_timeout_s", "sglang_fetch_private",
    ),
    "shutdown (docs/deploy.md)": ("grace_period_s", "drain_delay_s"),
    "logging": ("log_level", "log_json"),
}  # fmt: skip
_UNITS = {"_s": "SECONDS", "_ms": "MS", "_mb": "MIB"}


class HelpFormatter(argparse.HelpFormatter):
    """argparse's layout, without breaking flag and preset names at their hyphens."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _Presets:
    """The preset names, looked up only when help is printed (the registry imports torch)."""

    def __str__(self) -> str:
        from mmproc.models.registry import PRESETS

        return ", ".join(sorted(PRESETS))


def grouped_fields() -> dict[str, list[str]]:
    """Section title -> setting names, in declaration order within a section."""
    section_of = {name: title for title, names in GROUPS.items() for name in names}
    sections: dict[str, list[str]] = {title: [] for title in GROUPS}
    previous = next(iter(GROUPS))
    for name in ServerSettings.model_fields:
        previous = section_of.get(name, previous)
        sections[previous].append(name)
    return sections


def _metavar(name: str, annotation: object) -> str | None:
    if annotation is Path:
        return "DIR" if name == "model_path" else "FILE"
    unit = next((unit for suffix, unit in _UNITS.items() if name.endswith(suffix)), None)
    if unit is not None:
        return unit
    if annotation in (int, float):
        return "N" if annotation is int else "X"
    return "NAME" if name == "model" else name.rsplit("_", 1)[-1].upper()  # ADDRESS, DEVICE, TOKEN


def _argument(name: str, field: FieldInfo) -> dict[str, object]:
    annotation = _plain(field.annotation)
    given = field.default is not PydanticUndefined and field.default is not None and annotation is not bool
    default = f"default {field.default}; " if given else ""
    kwargs: dict[str, object] = {
        "dest": name,
        "default": None,
        "help": f"{field.description} ({default}env {env_name(name)})",
    }
    if annotation is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
        kwargs["help"] = f"{field.description} (default {'on' if field.default else 'off'}; env {env_name(name)})"
    elif typing.get_origin(annotation) is typing.Literal:
        kwargs["choices"] = list(typing.get_args(annotation))
    else:
        if annotation in (int, float, Path):
            kwargs["type"] = annotation
        kwargs["metavar"] = _metavar(name, annotation)
    return kwargs


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, in sections, plus --config FILE (JSON or TOML; below env vars and flags)."""
    parser.add_argument(
        "--config", type=Path, dest="config_file", default=None, metavar="FILE",
        help="JSON or TOML file of settings, below MMPROC_* variables and flags (env MMPROC_CONFIG_FILE)",
    )  # fmt: skip
    fields = ServerSettings.model_fields
    for title, names in grouped_fields().items():
        group = parser.add_argument_group(title)
        for name in names:
            action = group.add_argument(flag_name(name), **_argument(name, fields[name]))
            if name == "model":
                action.help = f"{action.help[:-1]}; presets: %(presets)s)"
                action.presets = _Presets()  # type: ignore[attr-defined]


def setting_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The settings given as flags (None = not given)."""
    return {name: getattr(args, name) for name in ServerSettings.model_fields}
