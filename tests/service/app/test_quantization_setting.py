"""`--quantization fp8` (mmproc/models/quantize.py): refused at start-up on a CPU, before a port is bound."""

from __future__ import annotations

import asyncio

import pytest

from mmproc.errors import ConfigError
from service.app.cli import main
from service.app.server import serve
from tests.support.server import test_settings

NEED = r"quantization fp8 needs a CUDA device of compute capability >= 8\.9"


def test_fp8_on_the_cpu_is_a_start_up_error_naming_the_need() -> None:
    with pytest.raises(ConfigError, match=NEED):
        asyncio.run(serve(test_settings(quantization="fp8")))


def test_the_cli_says_why_and_exits_2(capsys) -> None:
    assert main(["serve", "--quantization", "fp8", "--grpc-address", "127.0.0.1:0", "--http-address", ""]) == 2
    assert "compute capability >= 8.9" in capsys.readouterr().err


def test_unknown_quantization_is_refused_by_the_settings() -> None:
    with pytest.raises(Exception, match="quantization"):
        test_settings(quantization="int4")
