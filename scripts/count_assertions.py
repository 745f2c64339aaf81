"""Assertions in a tests tree: `assert` statements plus `pytest.raises` / `pytest.warns` checks.

    python3 scripts/count_assertions.py [TESTS_DIR]   (default: tests)"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def count(root: Path) -> int:
    total = 0
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assert):
                total += 1
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("raises", "warns") and getattr(node.func.value, "id", "") == "pytest":
                    total += 1
    return total


if __name__ == "__main__":
    print(count(Path(sys.argv[1] if len(sys.argv) > 1 else "tests")))
