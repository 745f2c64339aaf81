"""A model whose one image may hold more patches than the default batch budget (Qwen3-VL: 65,536) serves with
the defaults: the budget follows the model unless it was set, and a set one that is too small is refused."""

from __future__ import annotations

import pytest

from mmproc.client import EncoderClient
from mmproc.errors import ConfigError
from service.app.build import build_pipeline
from service.app.configs import runner_config
from service.observe.metrics import Metrics
from tests.support.media_samples import make_image_bytes
from tests.support.server import serving, test_settings


def test_a_qwen_preset_serves_with_the_default_batch_budget() -> None:
    with serving(test_settings(model="tiny-qwen3-vl")) as server, EncoderClient(server.grpc_target) as client:
        (embedding,) = client.encode_images([make_image_bytes(96, 64, fmt="PNG", seed=1)])
        budget = server.service.pipeline.config.runner.max_batch_patches
    assert embedding.shape[0] > 0
    assert (
        budget
        == server.service.pipeline.preprocess.max_patches_per_image
        > runner_config(test_settings()).max_batch_patches
    )


def test_a_batch_budget_that_was_set_is_kept_and_one_image_too_big_for_it_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_batch_patches"):
        build_pipeline(test_settings(model="tiny-qwen3-vl", max_batch_patches=4096), Metrics())
