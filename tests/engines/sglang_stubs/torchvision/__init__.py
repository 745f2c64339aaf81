"""Import-only torchvision for tests/engines/test_sglang_epd.py (see tests/engines/sglang_side.py): SGLang 0.5.23
imports it at module level (sglang.srt.configs -> InternVL), no CPU build for torch 2.13 is on the index, and the
receiver path never calls it. Any use raises."""

import sys
import types

__version__ = "0.0.0+import-only"


class _Unusable:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, *args, **kwargs):
        raise RuntimeError("torchvision is an import-only stand-in in this test environment")

    def __getattr__(self, name: str) -> "_Unusable":
        return _Unusable()

    def __mro_entries__(self, bases):
        return (object,)


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> _Unusable:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unusable()


def __getattr__(name: str) -> _Unusable:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Unusable()


for _name in ("transforms", "transforms.functional", "transforms.v2", "transforms.v2.functional", "io", "ops"):
    sys.modules[f"{__name__}.{_name}"] = _Module(f"{__name__}.{_name}")
transforms = sys.modules[f"{__name__}.transforms"]
io = sys.modules[f"{__name__}.io"]
ops = sys.modules[f"{__name__}.ops"]
