"""What one request may carry, checked before any decoding; torch-free so that the server's settings take their
defaults from here (service/app/settings.py): each default is written once."""

from __future__ import annotations

from dataclasses import dataclass

from mmproc.units import MiB


@dataclass(frozen=True)
class RequestLimits:
    max_images: int = 32
    max_request_bytes: int = 48 * MiB
    max_patches: int = 262_144


@dataclass(frozen=True)
class VideoRequestLimits:
    max_videos: int = 4
    max_request_bytes: int = 48 * MiB
    max_sampled_frames: int = 1024  # over every video of the request


@dataclass(frozen=True)
class InflightLimits:
    """What all admitted requests may hold at once; more are refused with RESOURCE_EXHAUSTED."""

    max_requests: int = 256
    max_patches: int = 2_097_152  # from the headers, then as decoded: bounds the decoded pixels held at once
