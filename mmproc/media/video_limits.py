"""Limits every video must meet before a frame of it is decoded (see `mmproc/media/video.py` for the order).

Frozen and built once at the edge, like `MediaLimits`; the per-request totals (sampled frames, bytes) are the
service's to sum, the fields here are per video.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mmproc.errors import ConfigError
from mmproc.units import MiB

# Containers by magic bytes (`video.sniff_container`) and the FFmpeg demuxer each one is opened with, so that
# FFmpeg never probes the other few hundred formats it could parse.
CONTAINERS = {"mp4": "mov", "matroska": "matroska"}  # mp4 = ISO BMFF (MP4, MOV); matroska = MKV, WebM
CODECS = frozenset({"h264", "hevc", "vp8", "vp9", "av1"})


def _positive(name: str, value: object, kind: type = int) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok or (kind is int and not isinstance(value, int)):
        raise ConfigError(f"VideoLimits.{name} must be a positive {kind.__name__}, got {value!r}")


@dataclass(frozen=True)
class VideoLimits:
    """Per-video limits, all checked from the container's header and packet index (no frame decoded)."""

    max_video_bytes: int = 32 * MiB  # the server caps it at its request size
    allowed_containers: frozenset[str] = frozenset(CONTAINERS)
    allowed_codecs: frozenset[str] = CODECS
    max_duration_s: float = 600.0  # the larger of the header's and the packets' duration
    max_fps: float = 240.0  # the stream's average frame rate
    max_pixels: int = 3840 * 2160  # per frame
    max_stream_frames: int = 144_000  # video packets (600 s at 240 fps)
    max_sampled_frames: int = 512  # per video, after sampling (256 s at 2 fps)
    # Frames the plan must decode (keyframe to each sampled frame) x pixels, in MP: refuses decoder bombs up front.
    max_decode_megapixels: float = 8_000.0  # 30 s of 4K30 or 64 s of 1080p60 decoded whole
    decode_cpu_s: float = 30.0  # CPU seconds of decoding per video (DECODE_TIME past it)
    max_sample_fps: float = 30.0  # the largest sampling rate a request may ask for
    decode_threads: int = 1  # FFmpeg threads per decoder: the decode workers give the parallelism

    def __post_init__(self) -> None:
        for name in ("max_video_bytes", "max_pixels", "max_stream_frames", "max_sampled_frames", "decode_threads"):
            _positive(name, getattr(self, name))
        for name in ("max_duration_s", "max_fps", "max_decode_megapixels", "decode_cpu_s", "max_sample_fps"):
            _positive(name, getattr(self, name), float)
        for name, known in (("allowed_containers", CONTAINERS), ("allowed_codecs", CODECS)):
            names = frozenset(str(n).lower() for n in getattr(self, name))
            if not names or not names <= set(known):
                raise ConfigError(f"VideoLimits.{name} must be a non-empty subset of {sorted(known)}, got {names}")
            object.__setattr__(self, name, names)
