"""Engine tests skip where the engine is not installed, except under MMPROC_REQUIRE_VLLM=1 (.ci/run's vLLM venv),
where a vLLM that fails to import is a failure, not a silent skip."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("MMPROC_REQUIRE_VLLM") == "1":
        import vllm  # noqa: F401  (raises here, failing the run, when the venv is broken)
