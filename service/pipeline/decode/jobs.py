"""What the decode pool hands a worker: one image's or one video's job (frozen, picklable), and how the worker's
shipped result is unpacked."""

from __future__ import annotations

from dataclasses import dataclass

from mmproc.media.video import VideoSampling
from mmproc.media.video_limits import VideoLimits
from mmproc.preprocess.video_config import VideoRules
from service.pipeline.decode.transfer import Shipped
from service.pipeline.decode.video_worker import ShippedVideo
from service.pipeline.decode.worker import Prepared


@dataclass(frozen=True)
class _ImageJob:
    data: bytes
    seconds: float = 0.0  # its own CPU budget (from its header)
    heavy: bool = False  # a long budget: it takes the heavy lane (service/pipeline/fair_share.py)

    @staticmethod
    def unship(result: Shipped | Prepared) -> Prepared:
        return result if isinstance(result, Prepared) else Prepared(result.to_image(), *result.timings[:2])


@dataclass(frozen=True)
class VideoJob:
    """One video to decode: its bytes, limits, rules and sampling (all frozen, picklable)."""

    data: bytes
    limits: VideoLimits
    rules: VideoRules
    sampling: VideoSampling
    max_patches: int = 0  # the request's patch budget, checked at the first decoded frame (0: none)
    heavy = True  # a video holds its worker for seconds: never in the light lane

    @property
    def args(self) -> tuple:
        return (self.data, self.limits, self.rules, self.sampling, self.max_patches)

    @staticmethod
    def unship(result: ShippedVideo) -> ShippedVideo:
        result.materialize()  # the patches mapped (a no-op for a result that came in-band)
        return result
