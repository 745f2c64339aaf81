"""Start-up failures an operator meets first: each exits 2 with one line naming the cause and the setting, never a
traceback, and the model's configuration is checked before any port is bound."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

ENV = {k: v for k, v in os.environ.items() if not k.upper().startswith("MMPROC_")}


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.app.cli", "serve", *args],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_exit_2(proc: subprocess.CompletedProcess[str], *named: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("mmproc: configuration error:") and all(n in line for n in named), line


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--grpc-address", "foo"), ("--grpc-address", "127.0.0.1:99999"), ("--http-address", "localhost:")],
)
def test_bad_addresses_are_refused_before_starting(flag, value) -> None:
    assert_one_line_exit_2(serve(flag, value), flag.removeprefix("--").replace("-", "_"))


@pytest.mark.parametrize("busy_flag", ["--grpc-address", "--http-address"])
def test_a_busy_port_is_one_line_naming_the_flag(busy_flag) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        addresses = {"--grpc-address": "127.0.0.1:0", "--http-address": "", busy_flag: f"127.0.0.1:{port}"}
        proc = serve(*(item for pair in addresses.items() for item in pair))
    assert_one_line_exit_2(proc, busy_flag, str(port))


def test_an_unknown_preset_fails_before_any_port_is_bound() -> None:
    proc = serve("--model", "kimi-k9", "--grpc-address", "127.0.0.1:0", "--http-address", "")
    assert_one_line_exit_2(proc, "kimi-k9", "kimi-k3")
    assert "listening" not in proc.stderr  # refused before binding, not after NOT_SERVING


def test_a_checkpoint_of_no_known_family_fails_before_binding(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llava"}')
    proc = serve("--model-path", str(tmp_path), "--grpc-address", "127.0.0.1:0", "--http-address", "")
    assert_one_line_exit_2(proc, "model_type")
    assert "listening" not in proc.stderr
