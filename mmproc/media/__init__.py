"""Media stage: validate image bytes before decoding, decode, apply EXIF orientation, convert to RGB.

    from mmproc.media import MediaLimits, decode_image, sniff_format
    img = decode_image(data, MediaLimits())   # DecodedImage, or InvalidMediaError(reason=..., index=-1)

One concern per module: `formats` (magic bytes, header peeks), `limits` (MediaLimits), `decode` (order of
checks, Pillow error mapping), `orientation` (EXIF), `convert` (mode -> RGB rule).
"""

from typing import TYPE_CHECKING

from mmproc.media.formats import SUPPORTED_FORMATS, sniff_format
from mmproc.media.limits import MediaLimits

if TYPE_CHECKING:
    from mmproc.media.decode import decode_image

__all__ = ["SUPPORTED_FORMATS", "MediaLimits", "decode_image", "sniff_format"]


def __getattr__(name: str) -> object:
    # decode needs torch (mmproc.types): imported on first use, so that the limits alone stay torch-free for the
    # settings, which take their defaults from them (`mmproc serve --help` loads no torch).
    if name == "decode_image":
        from mmproc.media.decode import decode_image

        return decode_image
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
