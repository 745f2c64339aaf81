"""Prose share of the production code: comment and docstring lines over non-blank lines, per top folder.

    python3 scripts/prose_share.py [--max 0.13] [FOLDER ...]   (default: mmproc service; generated mmproc/v1 left out)

A docstring counts whole (its opening and closing lines too); a line with code and a trailing comment counts as
code. Exits 1 when a share is over --max."""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def prose_lines(source: str) -> tuple[int, int]:
    """(prose lines, non-blank lines) of one Python file."""
    lines = source.splitlines()
    nonblank = {i for i, line in enumerate(lines, 1) if line.strip()}
    prose: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and not lines[token.start[0] - 1][: token.start[1]].strip():
            prose.add(token.start[0])
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                prose.update(range(body[0].lineno, body[0].end_lineno + 1))
    return len(prose & nonblank), len(nonblank)


def share(folder: Path) -> tuple[int, int]:
    prose = total = 0
    for path in sorted(folder.rglob("*.py")):
        if "v1" in path.relative_to(REPO).parts:
            continue
        p, t = prose_lines(path.read_text())
        prose, total = prose + p, total + t
    return prose, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="*", default=["mmproc", "service"])
    parser.add_argument("--max", type=float, default=None, help="fail above this share (e.g. 0.13)")
    args = parser.parse_args(argv)
    over = False
    for name in args.folders:
        prose, total = share(REPO / name)
        fraction = prose / max(1, total)
        over |= args.max is not None and fraction > args.max
        print(f"{name:10s} {prose:6d} prose / {total:6d} non-blank lines = {fraction:.1%}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
