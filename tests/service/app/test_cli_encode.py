"""`mmproc encode` as an operator uses it: the target from the same settings as the server, JSON lines, one-line
errors; and secrets from files instead of the process list."""

from __future__ import annotations

import json
import logging

import pytest

from mmproc.errors import ConfigError
from service.app.cli import main
from service.app.config_sources import load_settings
from tests.support.common import wait_until
from tests.support.media_samples import make_image_bytes


def test_encode_takes_the_configured_address_and_prints_json(tiny_server, tmp_path, monkeypatch, capsys) -> None:
    image = tmp_path / "cat.png"
    image.write_bytes(make_image_bytes(100, 80, fmt="PNG"))
    monkeypatch.setenv("MMPROC_GRPC_ADDRESS", tiny_server.grpc_target)  # as `mmproc serve` would read it
    assert main(["encode", str(image), "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    fields = json.loads(line)
    assert fields["path"] == str(image) and fields["image_size"] == [100, 80]
    assert fields["tokens"] == fields["shape"][0] == fields["grid_thw"][1] * fields["grid_thw"][2] // 4


def test_encode_can_send_its_requests_as_batch_work(tiny_server, tmp_path, caplog) -> None:
    image = tmp_path / "cat.png"
    image.write_bytes(make_image_bytes(64, 64, fmt="PNG"))
    with caplog.at_level(logging.INFO, logger="mmproc.access"):
        assert main(["encode", str(image), "--target", tiny_server.grpc_target, "--priority", "batch"]) == 0
        assert wait_until(lambda: any("priority=batch" in r.getMessage() for r in caplog.records), timeout=5)
    with pytest.raises(SystemExit):  # argparse: one of the two names
        main(["encode", str(image), "--target", tiny_server.grpc_target, "--priority", "urgent"])


def test_encode_of_a_missing_file_is_one_line(capsys) -> None:
    assert main(["encode", "/nonexistent/cat.jpg", "--target", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "mmproc: cannot read /nonexistent/cat.jpg: No such file or directory"


def test_the_auth_token_can_come_from_a_file(tmp_path) -> None:
    secret = tmp_path / "token"
    secret.write_text("a-long-enough-shared-secret\n")
    settings = load_settings(None, auth_token_file=str(secret))
    assert settings.auth_token is not None and settings.auth_token.get_secret_value() == "a-long-enough-shared-secret"
    with pytest.raises(ConfigError, match="not both"):
        load_settings(None, auth_token_file=str(secret), auth_token="another-long-enough-secret")
    with pytest.raises(ConfigError, match="auth_token_file"):
        load_settings(None, auth_token_file=str(tmp_path / "missing"))


def test_encode_reads_the_token_from_a_file(tmp_path, capsys) -> None:
    from tests.support.server import ServiceThread, test_settings

    token = "a-long-enough-shared-secret"
    (tmp_path / "token").write_text(token + "\n")
    image = tmp_path / "cat.png"
    image.write_bytes(make_image_bytes(64, 64, fmt="PNG"))
    server = ServiceThread(test_settings(auth_token=token)).start()
    try:
        target = ["--target", server.grpc_target]
        assert main(["encode", str(image), *target, "--token-file", str(tmp_path / "token")]) == 0
        assert main(["encode", str(image), *target]) == 1  # no token: refused
    finally:
        server.stop()
    assert "UnauthenticatedError" in capsys.readouterr().err


def test_encode_prints_the_good_files_when_one_is_bad(tiny_server, tmp_path, capsys) -> None:
    paths = [tmp_path / n for n in ("a.png", "bad.png", "c.png")]
    paths[0].write_bytes(make_image_bytes(64, 64, fmt="PNG"))
    paths[1].write_bytes(b"not an image at all")
    paths[2].write_bytes(make_image_bytes(96, 64, fmt="PNG"))
    assert main(["encode", *map(str, paths), "--target", tiny_server.grpc_target]) == 2
    out, err = capsys.readouterr()
    assert [line.split("\t")[0] for line in out.splitlines()] == [str(paths[0]), str(paths[2])]
    assert err.strip().startswith(f"invalid: {paths[1]}: ") and "unsupported_format" in err
