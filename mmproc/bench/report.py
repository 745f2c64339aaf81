"""What a benchmark shows a person: a progress bar on stderr (terminals only), aligned tables, optional PNG plots
(the `[plot]` extra)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

WIDTH = 30  # characters of the bar itself


class Progress:
    """`label [#####.....] done/total rate unit/s eta`, redrawn at most 10 times a second on one stderr line."""

    def __init__(
        self, total: int, label: str, *, unit: str = "it", enabled: bool | None = None, stream: IO[str] | None = None
    ) -> None:
        self.stream = stream or sys.stderr
        self.total, self.label, self.unit = max(0, total), label, unit
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.done = 0
        self._lock = threading.Lock()
        self._start = time.perf_counter()
        self._drawn = 0.0
        self._shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tick(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            now = time.perf_counter()
            if self.enabled and (now - self._drawn >= 0.1 or self.done >= self.total):
                self._drawn = now
                self._draw(now)

    def print(self, *parts: object, file: IO[str] | None = None) -> None:
        """print() to stdout (or `file`) without tearing the bar: clear it, print, draw it again."""
        with self._lock:
            if self._shown:
                self.stream.write("\r\033[K")
            print(*parts, file=file or sys.stdout, flush=True)
            if self._shown:
                self._draw(time.perf_counter())

    def close(self) -> None:
        with self._lock:
            if self._shown:
                self.stream.write("\n")
                self.stream.flush()
                self._shown = False

    def _draw(self, now: float) -> None:
        elapsed = max(1e-9, now - self._start)
        filled = WIDTH * min(self.done, self.total) // max(1, self.total)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate > 0 and self.done < self.total else 0.0
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total} "
                          f"{rate:.1f} {self.unit}/s, {elapsed:.0f} s, ~{left:.0f} s left\033[K")  # fmt: skip
        self.stream.flush()
        self._shown = True


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, floats: str = "{:.2f}") -> str:
    """Rows under their headers, columns aligned: text left, numbers right; None and missing values as '-'."""

    def cell(value: object) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return floats.format(value)
        return str(value)

    cells = [[cell(v) for v in row] for row in rows]
    numeric = [
        all(_is_number(row[i]) for row in rows if i < len(row) and row[i] is not None) for i in range(len(headers))
    ]
    widths = [max([len(h), *(len(r[i]) for r in cells if i < len(r))]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        padded = [v.rjust(w) if numeric[i] else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))]
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def save_plot(path: Path | None, draw: Callable[[Any], None], *, note: Callable[[str], None] | None = None) -> bool:
    """Draw with `draw(pyplot)` and write a PNG to `path`; False (and one line on stderr) without matplotlib."""
    if path is None:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        (note or _stderr)(f"--plot {path}: matplotlib is not installed (pip install matplotlib); no plot written")
        return False
    try:
        draw(plt)
        path.parent.mkdir(parents=True, exist_ok=True)
        plt.savefig(path, dpi=120, bbox_inches="tight")
    finally:
        plt.close("all")
    (note or _stderr)(f"wrote {path}")
    return True


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def bars(ax: Any, groups: Sequence[str], series: dict[str, Sequence[float | None]], ylabel: str) -> None:
    """Grouped bars: one group per x label, one bar per series (None: no bar)."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        heights = [0.0 if v is None else v for v in values]
        ax.bar(xs, heights, width, label=name)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize="small")
