"""Run a snippet in a fresh Python with the repo importable (for tests that must control imports or env vars)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` (dedented) in `python -c` from the repo root; `env`: extra environment variables."""
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )
