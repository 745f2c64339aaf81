"""`mmproc bench cpu_preprocess`: what one decode worker spends per image after the decode, against the decode.

How it measures: docs/bench.md."""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image

from mmproc.bench.report import Progress
from mmproc.preprocess import PreprocessConfig, preprocess_image
from mmproc.preprocess.config import FAMILIES


def photo_jpeg(width: int, height: int, seed: int = 0) -> bytes:
    """Smooth noise upscaled (JPEG-friendly like a photo), quality 90, 4:2:0."""
    small = np.random.default_rng(seed).integers(0, 256, (max(1, height // 8), max(1, width // 8), 3), np.uint8)
    image = Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def decode(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image.convert("RGB")


def run(sizes: Sequence[tuple[int, int]], family: str, repeat: int, progress: Progress | None = None) -> list[dict]:
    cfg = PreprocessConfig.default_for(family)
    rows = []
    for width, height in sizes:
        data = photo_jpeg(width, height)
        image = decode(data)
        decode_ms = median_ms(lambda d=data: decode(d), repeat)
        float_ms = median_ms(lambda i=image: preprocess_image(i, cfg), repeat)
        bytes_ms = median_ms(lambda i=image: preprocess_image(i, cfg, normalize=False), repeat)
        rows.append({"size": f"{width}x{height}", "decode_ms": decode_ms, "float32_ms": float_ms, "uint8_ms": bytes_ms})
        if progress is not None:
            progress.tick()
    return rows


def _size(text: str) -> tuple[int, int]:
    """WIDTHxHEIGHT, or one side for a square (512 = 512x512)."""
    try:
        sides = [int(v) for v in text.lower().split("x")]
    except ValueError:
        sides = []
    if len(sides) not in (1, 2) or min(sides) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: WIDTHxHEIGHT (1920x1080) or a side (512)")
    return sides[0], sides[-1]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mmproc bench cpu_preprocess", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=_size, nargs="+", default=[(512, 512), (1024, 1024), (1920, 1080)],
                        help="WIDTHxHEIGHT or a square's side (512)")  # fmt: skip
    parser.add_argument("--family", default="kimi_k25", choices=FAMILIES)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    with Progress(len(args.sizes), "cpu_preprocess", unit="size", enabled=False if args.quiet else None) as bar:
        rows = run(args.sizes, args.family, args.repeat, bar)
    print(f"{'size':>10} {'decode ms':>10} {'float32 ms':>11} {'x decode':>9} {'uint8 ms':>9} {'x decode':>9}")
    for r in rows:
        d = r["decode_ms"]
        print(
            f"{r['size']:>10} {d:10.2f} {r['float32_ms']:11.2f} {r['float32_ms'] / d:9.2f}"
            f" {r['uint8_ms']:9.2f} {r['uint8_ms'] / d:9.2f}"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"family": args.family, "rows": rows}, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
