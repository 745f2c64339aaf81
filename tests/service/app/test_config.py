"""Configuration: flags > MMPROC_* env > config file (JSON or TOML) > defaults; bad values fail at start,
exit code 2, naming the setting the way the operator gave it; `mmproc config` prints the result."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mmproc.errors import ConfigError
from mmproc.units import MiB
from service.app.cli import build_parser, main
from service.app.config_sources import load_settings
from service.app.settings import ServerSettings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("MMPROC_"):
            monkeypatch.delenv(key)


def effective(capsys, *argv: str) -> dict:
    assert main(["config", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_config_prints_every_setting_with_defaults(capsys) -> None:
    config = effective(capsys)
    assert set(config) == set(ServerSettings.model_fields)
    assert config["grpc_address"] == "127.0.0.1:50051"
    assert config["grace_period_s"] == 30.0


def test_flags_beat_env_beat_file(tmp_path, monkeypatch, capsys) -> None:
    config_file = tmp_path / "mmproc.json"
    config_file.write_text(json.dumps({"max_wait_ms": 5, "device": "cpu", "log_json": True}))
    assert effective(capsys, "--config", str(config_file))["max_wait_ms"] == 5
    monkeypatch.setenv("MMPROC_MAX_WAIT_MS", "6")
    assert effective(capsys, "--config", str(config_file))["max_wait_ms"] == 6
    config = effective(capsys, "--config", str(config_file), "--max-wait-ms", "7", "--no-log-json")
    assert config["max_wait_ms"] == 7
    assert config["log_json"] is False


def test_toml_config_file_via_env(tmp_path, monkeypatch, capsys) -> None:
    config_file = tmp_path / "mmproc.toml"
    config_file.write_text('grpc_address = "unix:/run/mmproc/encoder.sock"\ngrace_period_s = 12.5\n')
    monkeypatch.setenv("MMPROC_CONFIG_FILE", str(config_file))
    config = effective(capsys)
    assert config["grpc_address"] == "unix:/run/mmproc/encoder.sock"
    assert config["grace_period_s"] == 12.5


def test_every_setting_has_a_flag() -> None:
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    flags = {option for action in serve._actions for option in action.option_strings}
    for name in ServerSettings.model_fields:
        assert "--" + name.replace("_", "-") in flags, name


@pytest.mark.parametrize(
    ("env", "value", "named"),
    [
        ("MMPROC_GRACE_PERIOD_S", "-1", "MMPROC_GRACE_PERIOD_S (grace_period_s)"),
        ("MMPROC_DEVICE", "gpu0", "MMPROC_DEVICE (device)"),
        ("MMPROC_IPC_POOL_MB", "lots", "MMPROC_IPC_POOL_MB (ipc_pool_mb)"),
        ("MMPROC_LOG_LEVEL", "LOUD", "MMPROC_LOG_LEVEL (log_level)"),
    ],
)
def test_bad_env_var_exits_2_naming_it(monkeypatch, capsys, env, value, named) -> None:
    monkeypatch.setenv(env, value)
    assert main(["config"]) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err and named in err, err


def test_bad_flag_and_bad_file_key_are_named(tmp_path, capsys) -> None:
    assert main(["config", "--max-batch-images", "0"]) == 2
    assert "--max-batch-images (max_batch_images)" in capsys.readouterr().err
    config_file = tmp_path / "bad.json"
    config_file.write_text(json.dumps({"max_batch_imags": 4}))
    assert main(["config", "--config", str(config_file)]) == 2
    err = capsys.readouterr().err
    assert f"config file {config_file}: max_batch_imags" in err and "Extra inputs" in err, err


def test_stream_chunks_default_to_16_mib_or_what_a_smaller_message_cap_holds() -> None:
    # One message per image of up to 16 MiB (a 448² K2.5 image is 3.7 MB, a 1024² one 19 MB): each costs a copy.
    assert ServerSettings().stream_chunk_bytes == 16 * MiB
    assert ServerSettings(max_message_mb=6, max_request_mb=5, max_image_mb=5).stream_chunk_bytes == 5 * MiB
    assert ServerSettings(stream_chunk_mb=4).stream_chunk_bytes == 4 * MiB


def test_stream_chunks_must_fit_in_a_message(capsys) -> None:
    assert main(["config", "--max-message-mb", "49", "--stream-chunk-mb", "49"]) == 2
    assert "stream_chunk_mb" in capsys.readouterr().err
    assert main(["config", "--max-message-mb", "49", "--stream-chunk-mb", "48"]) == 0


def test_serve_refuses_bad_settings_before_starting() -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("MMPROC_")}
    proc = subprocess.run(
        [sys.executable, "-m", "service.app.cli", "serve", "--http-address", ""],
        env={**env, "MMPROC_MAX_QUEUED_IMAGES": "0"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "MMPROC_MAX_QUEUED_IMAGES (max_queued_images)" in proc.stderr


def test_an_unknown_mmproc_variable_is_warned_about(monkeypatch, caplog) -> None:
    monkeypatch.setenv("MMPROC_MAX_PIXLES", "10")  # a typo of max_pixels
    with caplog.at_level("WARNING"):
        load_settings(None)
    assert "ignoring MMPROC_MAX_PIXLES" in caplog.text
    monkeypatch.delenv("MMPROC_MAX_PIXLES")
    caplog.clear()
    with caplog.at_level("WARNING"):
        load_settings(None)
    assert "ignoring" not in caplog.text


def test_a_yaml_config_file_is_refused_not_misread(tmp_path) -> None:
    path = tmp_path / "mmproc.yaml"
    path.write_text("max_pixels: 10\n")
    with pytest.raises(ConfigError, match=r"\.json or \.toml"):
        load_settings(path)
