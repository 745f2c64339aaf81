"""Command-line flags made from the ServerSettings fields: every setting `name` is `--name` (dashes), with the
field's type, choices and description, so that a new setting needs no CLI code. A flag left out is None and
does not override the environment or the config file."""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from service.settings import ServerSettings


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


def _argument(name: str, field: FieldInfo) -> dict[str, object]:
    annotation = _plain(field.annotation)
    default = "" if field.default is PydanticUndefined else f" (default: {field.default!r})"
    kwargs: dict[str, object] = {
        "dest": name,
        "default": None,
        "help": f"{field.description or name.replace('_', ' ')}{default}; env {env_name(name)}",
    }
    if annotation is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif typing.get_origin(annotation) is typing.Literal:
        kwargs["choices"] = list(typing.get_args(annotation))
    elif annotation in (int, float, Path):
        kwargs["type"] = annotation
    return kwargs


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, plus --config FILE (JSON or TOML; below env vars and flags)."""
    parser.add_argument(
        "--config", type=Path, dest="config_file", default=None,
        help="JSON or TOML file of settings (below MMPROC_* env vars and flags); env MMPROC_CONFIG_FILE",
    )  # fmt: skip
    group = parser.add_argument_group("settings")
    for name, field in ServerSettings.model_fields.items():
        group.add_argument(flag_name(name), **_argument(name, field))


def setting_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The settings given as flags (None = not given)."""
    return {name: getattr(args, name) for name in ServerSettings.model_fields}
