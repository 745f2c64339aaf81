"""Media stage: validate image bytes before decoding, decode, apply EXIF orientation, convert to RGB.

    from mmproc.media import MediaLimits, decode_image, sniff_format
    img = decode_image(data, MediaLimits())   # DecodedImage, or InvalidMediaError(reason=..., index=-1)

One concern per module: `formats` (magic bytes, header peeks), `limits` (MediaLimits), `decode` (order of
checks, Pillow error mapping), `orientation` (EXIF), `convert` (mode -> RGB rule).
"""

from mmproc.media.decode import decode_image
from mmproc.media.formats import SUPPORTED_FORMATS, sniff_format
from mmproc.media.limits import MediaLimits

__all__ = ["SUPPORTED_FORMATS", "MediaLimits", "decode_image", "sniff_format"]
