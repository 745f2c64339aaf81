"""Root hooks only: skip `cuda`-marked tests without a GPU; a test that configures logging (`main()` in-process)
leaves the root logger as it found it. Nothing of the service (nor torch) is imported for the
unit tests; the server fixtures live in tests/support/server.py and the conftests of the folders that use them."""

from __future__ import annotations

import logging

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if "cuda" in item.keywords]
    if not marked:
        return
    import torch  # asked only when a test needs the answer

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _root_logger_restored():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
