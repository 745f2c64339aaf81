"""Which code a benchmark measured: the git commit, for every `--json` record."""

from __future__ import annotations

import os
import subprocess


def git_commit() -> str | None:
    """MMPROC_COMMIT when set (the GPU scripts set it: the device's copy of the tree carries a stale or no git
    HEAD), else HEAD's sha, else None."""
    explicit = os.environ.get("MMPROC_COMMIT")
    if explicit:
        return explicit
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return sha if len(sha) == 40 and all(c in "0123456789abcdef" for c in sha) else None


def git_dirty() -> bool:
    """Whether tracked files differ from HEAD (False where git cannot tell)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(out.strip())
