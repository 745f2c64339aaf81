"""Coverage-guided fuzzing of validate -> decode -> preprocess with atheris (libFuzzer for Python).

The property: for any bytes, `decode_image` either returns an RGB image within the limits, which
`preprocess_image` turns into finite patches of the grid `target_grid` predicts, or raises InvalidMediaError
with a known reason. Any other exception, a crash or a hang is a finding (libFuzzer saves the input as
crash-*/timeout-* in the working directory). Seeds: every case of tests/support/corpus.py up to 64 KiB, plus small
cost bombs (scans, JPEG segments, PNG chunks, GIF blocks, RLE BMPs) just past the fuzz limits below, so that
the cost walks (mmproc/media/cost.py) and the paths just under their limits are mutated from the start.

    python3 -m tests.fuzz.fuzz_media -runs=3000 -max_total_time=30      # the bounded CI run (.ci/run)
    python3 -m tests.fuzz.fuzz_media -max_total_time=3600 -jobs=2      # a long run on demand
    python3 -m tests.fuzz.fuzz_media crash-0123abcd                    # replay one finding

mmproc's modules and Pillow's Python plugins are instrumented; Pillow's C decoders are not (their crashes
still surface, and the service contains them in decode worker processes anyway).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import atheris
import numpy as np
import torch  # noqa: F401 - imported (uninstrumented) before the block: instrumenting torch takes minutes

with atheris.instrument_imports(exclude=["torch", "numpy"]):
    from PIL import (  # noqa: F401 - imported here so that their Python parsers are instrumented
        BmpImagePlugin,
        GifImagePlugin,
        Image,
        JpegImagePlugin,
        PngImagePlugin,
        TiffImagePlugin,
        WebPImagePlugin,
    )

    from mmproc.errors import InvalidMediaError, Reason
    from mmproc.media import MediaLimits, decode_image
    from mmproc.preprocess import PreprocessConfig, preprocess_image, target_grid

# Smaller than the service's defaults so that each execution stays fast; the code paths are the same.
LIMITS = MediaLimits(max_image_bytes=1 << 20, max_pixels=4_000_000, max_jpeg_scans=20, max_chunks=64)
CONFIGS = (PreprocessConfig.kimi_vl(), PreprocessConfig.kimi_k25())
REASONS = frozenset(reason.value for reason in Reason)
SEED_MAX_BYTES = 64 * 1024


def test_one_input(data: bytes) -> None:
    try:
        decoded = decode_image(data, LIMITS)
    except InvalidMediaError as exc:
        assert exc.reason in REASONS and exc.index == -1, exc
        return
    image = decoded.image
    assert image.mode == "RGB" and image.width * image.height <= LIMITS.max_pixels, (image.mode, image.size)
    config = CONFIGS[len(data) % 2]
    try:
        grid = target_grid(image.width, image.height, config)
    except InvalidMediaError:  # a sliver the model cannot take: preprocess must refuse it the same way
        try:
            preprocess_image(image, config)
        except InvalidMediaError:
            return
        raise AssertionError(f"target_grid refused {image.size} but preprocess_image accepted it") from None
    prepared = preprocess_image(image, config)
    assert prepared.grid_hw == grid, (prepared.grid_hw, grid)
    assert prepared.patches.shape[0] == grid[0] * grid[1]
    assert np.isfinite(prepared.patches.numpy()).all()


def _cost_seeds() -> list[bytes]:
    from tests.support import cost_samples as cost

    seeds = []
    for count in (LIMITS.max_chunks - 8, LIMITS.max_chunks + 8):
        seeds += [cost.jpeg_many_segments(count), cost.png_many_chunks(count), cost.gif_many_blocks(count)]
        seeds.append(cost.png_many_chunks(count, b"tEXt"))
    for count in (LIMITS.max_jpeg_scans, LIMITS.max_jpeg_scans + 1):
        seeds.append(cost.jpeg_scan_bomb(128, 96, count))
    seeds += [cost.bmp_rle_eol_bomb(400, 400), cost.bmp_rle_eol_bomb(100, 100, rle4=True)]
    seeds += [cost.bmp_rle(510, 4, b"\xff\x07\xff\x09\x00\x00" * 4 + b"\x00\x01"), cost.jpeg_junk_after_app0(64, 48)]
    return seeds


def _seed_directory() -> str:
    from tests.support.corpus import build_corpus

    directory = Path(tempfile.mkdtemp(prefix="mmproc-fuzz-seeds-"))
    seeds = [case.data for case in build_corpus()] + _cost_seeds()
    for number, data in enumerate(seeds):
        if 0 < len(data) <= SEED_MAX_BYTES:
            (directory / f"seed-{number:04d}").write_bytes(data)
    return str(directory)


def main(argv: list[str]) -> None:
    args = list(argv)
    if not any(not arg.startswith("-") for arg in args[1:]):  # no corpus directory or input file given
        args.append(_seed_directory())
    if not any(arg.startswith("-max_len=") for arg in args):
        args.append(f"-max_len={SEED_MAX_BYTES}")
    atheris.Setup(args, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
