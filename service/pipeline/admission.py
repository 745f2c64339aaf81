"""Request-level checks that need no decoding: the patch budget, estimated from the images' headers.

`mmproc.media` already reads each format's declared size without Pillow; `mmproc.preprocess.target_grid`
turns a size into the exact grid `preprocess_image` will produce. Summing those lets a request that asks for
more than `max_patches` be refused before a single raster is decoded. The estimate never refuses more than
the exact check after decoding would: an image whose header cannot be read counts 0 here, and EXIF orientation
is covered by taking the smaller grid of the two orientations. Nothing unknown stays at 0: once decoded, the
engine counts every patch the headers did not announce against both budgets (the request's, exactly, and the
in-flight one, `Engine._admit_decoded`) before any patch reaches the runner.
"""

from __future__ import annotations

from collections.abc import Sequence

from mmproc.errors import InvalidMediaError, InvalidRequestError, Reason
from mmproc.media.formats import peek_size, sniff_format
from mmproc.preprocess import PreprocessConfig, target_grid


def header_patches(data: bytes, config: PreprocessConfig) -> int:
    """Patches `data` will need according to its header; 0 when the header does not say (or is refused)."""
    fmt = sniff_format(data)
    size = None if fmt is None else peek_size(fmt, data)
    if size is None:
        return 0
    width, height = size
    try:
        grids = [target_grid(width, height, config), target_grid(height, width, config)]
    except InvalidMediaError:  # too small, sliver ...: the decode refuses it with its own reason
        return 0
    return min(gh * gw for gh, gw in grids)


def check_patch_budget(images: Sequence[bytes], config: PreprocessConfig, max_patches: int) -> int:
    """TOO_MANY_PATCHES when the headers alone already ask for more than `max_patches` in total; else the total
    (a lower bound of the patches the request will need)."""
    total = 0
    for data in images:
        total += header_patches(data, config)
        if total > max_patches:
            raise InvalidRequestError(
                f"request needs at least {total} patches (from the image headers), limit {max_patches}",
                reason=Reason.TOO_MANY_PATCHES,
            )
    return total
