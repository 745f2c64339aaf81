"""`mmproc serve --help`: the settings in sections, one real sentence per flag, the presets named."""

from __future__ import annotations

import re
import subprocess
import sys

from mmproc.models.registry import PRESETS
from service.app.flags import GROUPS, flag_name, grouped_fields
from service.app.settings import ServerSettings


def serve_help() -> str:
    run = subprocess.run(
        [sys.executable, "-m", "service.app.cli", "serve", "--help"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


def sections(text: str) -> dict[str, str]:
    """Section title -> its text, from argparse's layout (a title line ending in ':' at column 0)."""
    parts = re.split(r"^(\S[^\n]*):\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_serve_help_shows_each_setting_in_its_section() -> None:
    found = sections(serve_help())
    assert {"model", "network", "request limits (checked before decoding)", "logging"} <= set(found)
    assert "settings" not in found  # the old single flat group
    for title, names in grouped_fields().items():
        for name in names:
            assert flag_name(name) in found[title], (name, title)


def test_every_setting_has_a_sentence_not_its_own_name() -> None:
    for name, field in ServerSettings.model_fields.items():
        text = field.description or ""
        assert len(text.split()) >= 4, name
        assert text.lower().rstrip(".") != name.replace("_", " "), name


def test_model_help_lists_the_presets() -> None:
    text = " ".join(serve_help().split())  # argparse wraps lines
    start = text.index("--model NAME Embedded")
    model_help = text[start : text.index("--device DEVICE", start)]
    for preset in PRESETS:
        assert preset in model_help


def test_a_new_setting_joins_the_section_of_the_one_before_it(monkeypatch) -> None:
    monkeypatch.setitem(GROUPS, "logging", ("log_level",))  # as if log_json were a new, unlisted setting
    assert grouped_fields()["logging"] == ["log_level", "log_json"]
