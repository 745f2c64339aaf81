"""Install lines a user copies install this project: `mmproc` is not a package on the index, so `mmproc[extra]` would
install whoever registers that name."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_BY_NAME = re.compile(r"pip install [^\n`]*\bmmproc\[")


def test_no_install_line_names_mmproc_on_the_index() -> None:
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "mmproc").rglob("*.py")]
    files += [*(ROOT / "service").rglob("*.py")]
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
                 if _BY_NAME.search(line)]  # fmt: skip
    assert not offenders, f"say `pip install -e '.[extra]'` from a checkout: {offenders}"
    assert "pip install -e '.[video]'" in (ROOT / "README.md").read_text()
