"""`event_loop` (service/app/event_loop.py): auto takes uvloop where installed, asyncio where not; uvloop asked for
but missing stops the start with a ConfigError; the server's main coroutine runs on the loop chosen."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from mmproc.errors import ConfigError
from service.app import event_loop
from tests.support.server import test_settings

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_asyncio_runs_on_asyncios_own_loop() -> None:
    assert event_loop.run(loop_module(), "asyncio").startswith("asyncio")


def test_auto_takes_uvloop_only_where_it_is_installed(monkeypatch) -> None:
    assert event_loop.resolve("auto") == ("uvloop" if HAVE_UVLOOP else "asyncio")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # as on a host without it
    assert event_loop.resolve("auto") == "asyncio"
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        event_loop.resolve("uvloop")


@pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop is not installed here (it comes with the cuda extra)")
def test_uvloop_runs_the_coroutine_on_uvloop() -> None:
    assert event_loop.run(loop_module(), "uvloop").startswith("uvloop")


def test_the_setting_takes_the_three_values_and_defaults_to_auto() -> None:
    assert test_settings().event_loop == "auto"
    assert test_settings(event_loop="uvloop").event_loop == "uvloop"
    with pytest.raises(Exception, match="event_loop"):
        test_settings(event_loop="trio")
