"""The model seam holds: no module outside a family's own names a family (as a string: `if config.family ==
"kimi_k3"`) — the encoder, loader, graphs and every layer take what differs from the family's record."""

from __future__ import annotations

import ast
from pathlib import Path

from mmproc.models import FAMILIES

ROOT = Path(__file__).resolve().parents[2] / "mmproc"
FAMILY_MODULES = {"moonvit.py", "moonvit3d.py", "qwen3_vl.py", "registry.py"}  # registry: one line per family
SHARED = sorted(
    [p for p in (ROOT / "models").glob("*.py") if p.name not in FAMILY_MODULES] + list((ROOT / "layers").glob("*.py"))
)


def string_literals(path: Path) -> set[str]:
    """String constants of a module, docstrings and comments left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }


def test_no_family_name_in_shared_model_code() -> None:
    names = {f.name for f in FAMILIES} | {t for f in FAMILIES for t in f.model_types}
    assert len(SHARED) > 10 and {p.name for p in SHARED} >= {"vision_encoder.py", "loader.py", "cuda_graphs.py"}
    found = {p.name: sorted(string_literals(p) & names) for p in SHARED}
    assert not {name: hits for name, hits in found.items() if hits}
