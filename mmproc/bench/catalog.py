"""Which module runs `mmproc bench NAME`: the wheel's (mmproc/bench), or the checkout's benchmarks/ package, found by
name at run time so that mmproc never imports it."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

INSTALLED = {
    "encoder": "mmproc.bench.forward",
    "accuracy": "mmproc.bench.accuracy",
    "serve": "mmproc.bench.serve",
    "cpu_preprocess": "mmproc.bench.cpu_preprocess",
    "client": "mmproc.bench.client",
}
CHECKOUT = {
    "decode": "decode_isolation",
    "rope": "rope_kernels",
    "d2h": "d2h",
    "fanout": "fanout",
    "gpu_preprocess": "gpu_preprocess",
    "cache": "cache",
    "malloc_arenas": "malloc_arenas",
}
BENCHMARKS = (
    "encoder",
    "accuracy",
    "serve",
    "client",
    "decode",
    "cpu_preprocess",
    "rope",
    "d2h",
    "fanout",
    "gpu_preprocess",
    "cache",
    "malloc_arenas",
)


def checkout_module(name: str) -> ModuleType | None:
    """`benchmarks.<name>`, or None outside a checkout (the wheel does not ship benchmarks/)."""
    root = Path(__file__).resolve().parents[2]  # the checkout this mmproc was imported from, if it is one
    if (root / "benchmarks" / "__init__.py").is_file() and str(root) not in sys.path:
        sys.path.append(str(root))  # an editable install maps mmproc/ and service/ only
    try:
        return importlib.import_module(f"benchmarks.{name}")
    except ModuleNotFoundError as err:
        if err.name not in ("benchmarks", f"benchmarks.{name}"):
            raise
        return None


def run(name: str, argv: Sequence[str]) -> int:
    if name in INSTALLED:
        return importlib.import_module(INSTALLED[name]).main(list(argv))
    module = checkout_module(CHECKOUT[name])
    if module is None:
        print(f"mmproc bench {name}: a micro-benchmark of the source tree: run `python3 -m benchmarks.{CHECKOUT[name]}`"
              " from a checkout", file=sys.stderr)  # fmt: skip
        return 2
    return module.main(list(argv))
