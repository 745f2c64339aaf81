"""Start-up decision for video input: the family takes video, PyAV is there, the checkpoint's rules fit the tower."""

from __future__ import annotations

import importlib.util
import logging

from mmproc.errors import ConfigError
from mmproc.preprocess.video_config import VIDEO_FAMILIES, load_video_rules
from service.app import configs
from service.app.settings import ServerSettings
from service.pipeline.requests import RequestPipeline
from service.pipeline.videos import VideoPipeline

logger = logging.getLogger(__name__)


def build_video_pipeline(settings: ServerSettings, pipeline: RequestPipeline) -> VideoPipeline | None:
    """The video service of a model whose family takes video (None otherwise), its rules from the checkpoint."""
    if pipeline.encoder.config.family not in VIDEO_FAMILIES or pipeline.encoder.config.pos_emb_time < 1:
        return None
    if importlib.util.find_spec("av") is None:
        logger.warning(
            "video input needs PyAV (pip install av, or pip install -e '.[video]' in a checkout): EncodeVideos is off"
        )
        return None
    rules = load_video_rules(settings.model_path)
    if rules.temporal_patch_size > pipeline.encoder.config.pos_emb_time:
        raise ConfigError(
            f"video chunks of {rules.temporal_patch_size} frames, but the tower's time embedding has "
            f"{pipeline.encoder.config.pos_emb_time} rows (pos_emb_time)"
        )
    return VideoPipeline(pipeline, rules, configs.video_limits(settings), configs.video_request_limits(settings))
