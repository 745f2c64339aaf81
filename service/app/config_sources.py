"""Where settings come from: defaults < config file (JSON or TOML) < environment < explicit overrides (CLI flags),
and errors that name each bad setting the way it was given."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from mmproc.errors import ConfigError
from service.app.settings import ServerSettings


def load_settings(config_file: Path | None = None, **overrides: object) -> ServerSettings:
    """Settings from defaults < config file < environment < overrides; ConfigError names each bad one as given."""
    from pydantic import ValidationError

    file_values = read_config_file(config_file) if config_file is not None else {}
    given = {k: v for k, v in overrides.items() if v is not None}
    _warn_unknown_env()
    try:
        env_only = ServerSettings()  # defaults + environment
        return ServerSettings(**{**file_values, **_explicit(env_only), **given})
    except ValidationError as exc:
        problems = "; ".join(f"{_source(e['loc'], given, file_values, config_file)}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid settings: {problems}") from None


# MMPROC_* variables read elsewhere (the config file's path, the CI switch of the vLLM test), not settings.
_OTHER_ENV = frozenset({"MMPROC_CONFIG_FILE", "MMPROC_COMMIT", "MMPROC_REQUIRE_VLLM"})


def _warn_unknown_env() -> None:
    """A typo in an MMPROC_* variable would otherwise be ignored in silence."""
    known = {f"MMPROC_{name.upper()}" for name in ServerSettings.model_fields} | _OTHER_ENV
    for key in sorted(k for k in os.environ if k.upper().startswith("MMPROC_") and k.upper() not in known):
        logging.getLogger(__name__).warning(
            "ignoring %s: not a setting of mmproc serve (mmproc config lists them)", key
        )


def read_config_file(path: Path) -> dict[str, object]:
    """A flat JSON object or TOML table (by suffix; other suffixes refused, not guessed)."""
    path = Path(path)
    if path.suffix not in (".toml", ".json", ""):
        raise ConfigError(f"config file {path}: use a .json or .toml file (got {path.suffix!r})")
    try:
        text = path.read_text()
        if path.suffix == ".toml":
            try:
                import tomllib  # Python >= 3.11
            except ImportError:  # Python 3.10: the backport, where installed
                import tomli as tomllib  # type: ignore[no-redef]

            values = tomllib.loads(text)
        else:
            values = json.loads(text)
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path}: expected a JSON object of settings")
    return values


def _source(loc: tuple, given: dict[str, object], file_values: dict[str, object], config_file: Path | None) -> str:
    """Where the bad value came from, named so that the operator can find it."""
    if not loc:
        return "settings"
    name = str(loc[0])
    env = f"MMPROC_{name.upper()}"
    if name in given:
        return f"--{name.replace('_', '-')} ({name})"
    if any(key.upper() == env for key in os.environ):
        return f"{env} ({name})"
    if name in file_values:
        return f"config file {config_file}: {name}"
    return name


def _explicit(settings: ServerSettings) -> dict[str, object]:
    """Values that came from the environment (not defaults), so that they beat the config file."""
    return {name: getattr(settings, name) for name in settings.model_fields_set}
