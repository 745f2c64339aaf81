"""Engine tests skip where the engine is not installed, except under MMPROC_REQUIRE_VLLM=1 (.ci/run's vLLM venv),
where a vLLM that fails to import is a failure, not a silent skip (MMPROC_REQUIRE_SGLANG=1 does the same for
test_sglang_epd.py). `tiny_server` is the shared in-process tiny server (tests/support/server.py)."""

from __future__ import annotations

import os

import pytest

from tests.support.server import tiny_server  # noqa: F401  (the fixture)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("MMPROC_REQUIRE_VLLM") == "1":
        import vllm  # noqa: F401  (raises here, failing the run, when the venv is broken)
