"""Each default is written once: a server built from the default settings gets exactly the core dataclasses'
defaults (a library user and the server agree), and the settings load no torch to get them."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from mmproc.media.limits import MediaLimits
from mmproc.media.video_limits import VideoLimits
from mmproc.runner_config import RunnerConfig
from mmproc.transport.cuda_ipc.config import PoolConfig
from service.app import configs
from service.app.settings import ServerSettings
from service.pipeline.cache.store import CacheConfig
from service.pipeline.decode.config import DecodePoolConfig
from service.pipeline.key_store import KeyStoreConfig
from service.pipeline.overload import CPU_BATCH_SHARE, OverloadConfig
from service.pipeline.reply_budget import ReplyBudgetConfig
from service.pipeline.request_limits import InflightLimits, RequestLimits, VideoRequestLimits
from tests.support.python_subprocess import run_python


def default_settings() -> ServerSettings:
    """The settings' own defaults, whatever MMPROC_* variables the test process has."""
    return ServerSettings.model_construct(**{name: f.default for name, f in ServerSettings.model_fields.items()})


def not_from_a_default(config: DecodePoolConfig, settings: ServerSettings) -> DecodePoolConfig:
    # Worker count, memory cap, logging and where pixels are normalized follow other settings (the CPUs, max_pixels,
    # the server's log level, the device), not a default of their own.
    return replace(
        DecodePoolConfig(),
        workers=settings.decode_workers,
        worker_memory_mb=config.worker_memory_mb,
        log_level=settings.log_level,
        log_json=settings.log_json,
        normalize=config.normalize,
    )


BUILDERS = [
    (configs.media_limits, MediaLimits),
    (configs.request_limits, RequestLimits),
    (configs.inflight_limits, InflightLimits),
    (configs.video_limits, VideoLimits),
    (configs.video_request_limits, VideoRequestLimits),
    (configs.decode_config, DecodePoolConfig),
    (configs.runner_config, RunnerConfig),
    (configs.overload_config, OverloadConfig),
    (configs.reply_budget_config, ReplyBudgetConfig),
    (configs.key_store_config, KeyStoreConfig),
    (configs.cache_config, CacheConfig),
    (configs.ipc_pool_config, PoolConfig),
]


@pytest.mark.parametrize(("build", "config_type"), BUILDERS, ids=[c.__name__ for _, c in BUILDERS])
def test_default_settings_build_the_dataclass_defaults(build, config_type) -> None:
    settings = default_settings()
    built = build(settings)
    expected = not_from_a_default(built, settings) if config_type is DecodePoolConfig else config_type()
    if config_type is OverloadConfig:  # a batch's share of the target is the device's (these settings': the CPU)
        expected = replace(expected, batch_share=CPU_BATCH_SHARE)
    differ = [
        f"{f.name}: settings give {getattr(built, f.name)!r}, the dataclass {getattr(expected, f.name)!r}"
        for f in fields(config_type)
        if getattr(built, f.name) != getattr(expected, f.name)
    ]
    assert not differ, f"{config_type.__name__}: " + "; ".join(differ)


def test_a_changed_setting_reaches_its_config() -> None:
    """The walk above would pass if a builder ignored its settings; each one must also carry a change through."""
    changed = ServerSettings(
        max_image_mb=7, max_images_per_request=3, max_video_mb=5, max_videos_per_request=2, decode_timeout_s=9.0,
        max_batch_images=5, max_queue_delay_ms=250.0, key_store_max_keys=11, cache_invalid_ttl_s=4.0, ipc_word_slots=8,
        max_reply_mb=7,
    )  # fmt: skip
    assert configs.media_limits(changed).max_image_bytes == 7 << 20
    assert configs.request_limits(changed).max_images == 3
    assert configs.video_limits(changed).max_video_bytes == 5 << 20
    assert configs.video_request_limits(changed).max_videos == 2
    assert configs.decode_config(changed).timeout_s == 9.0
    assert configs.runner_config(changed).max_batch_images == 5
    assert configs.overload_config(changed).max_queue_delay_s == 0.25
    assert configs.reply_budget_config(changed).max_bytes == 7 << 20
    assert configs.key_store_config(changed).max_keys == 11
    assert configs.cache_config(changed).invalid_ttl_s == 4.0
    assert configs.ipc_pool_config(changed).num_word_slots == 8


def test_settings_and_their_defaults_load_no_torch() -> None:
    result = run_python(
        """
        import sys
        import service.app.configs, service.app.settings
        service.app.configs.media_limits(service.app.settings.ServerSettings())
        assert "torch" not in sys.modules, "torch imported"
        """
    )
    assert result.returncode == 0, result.stderr


def test_overload_settings_reach_the_engine() -> None:
    """--max-queue-delay-ms, --max-pending-mb and --max-reply-mb bound the engine the server builds (the first two
    used to stop at the settings: the engine ran on OverloadConfig's defaults whatever was given)."""
    from service.app.build import build_pipeline
    from tests.support.server import test_settings

    settings = test_settings(max_queue_delay_ms=250.0, max_pending_mb=64, max_reply_mb=3, decode_isolation="thread")
    pipeline = build_pipeline(settings)
    try:
        assert pipeline.overload.config.max_queue_delay_s == 0.25
        assert pipeline.overload.config.batch_share == CPU_BATCH_SHARE  # a CPU encoder's shorter batches
        assert pipeline.overload.config.max_pending_bytes == 64 << 20
        assert pipeline.delivery.replies.max_bytes == 3 << 20
    finally:
        pipeline.close()


def test_freed_heap_is_kept_for_replies_only_where_a_gpu_stages_them() -> None:
    from mmproc.units import MiB
    from service.app.settings import CUDA_HOST_MALLOC_REUSE_MB

    assert ServerSettings(device="cpu").host_malloc_reuse_bytes == 0  # glibc's thresholds: RSS returns to idle
    assert ServerSettings(device="cuda:1").host_malloc_reuse_bytes == CUDA_HOST_MALLOC_REUSE_MB * MiB
    assert ServerSettings(device="cpu", host_malloc_reuse_mb=64).host_malloc_reuse_bytes == 64 * MiB  # as set


def test_page_locked_reply_messages_only_where_a_gpu_writes_replies() -> None:
    from mmproc.units import MiB

    assert configs.reply_budget_config(ServerSettings(device="cpu")).pinned_bytes == 0
    on_gpu = configs.reply_budget_config(ServerSettings(device="cuda:0", max_reply_mb=32))
    assert on_gpu.pinned_bytes == 64 * MiB  # twice the reply budget: capacities round up to powers of two
    assert configs.reply_budget_config(ServerSettings(device="cuda:0", pinned_reply_mb=0)).pinned_bytes == 0  # off


def test_batches_are_shorter_with_the_encoder_on_the_cpu() -> None:
    """On the CPU a batch is no faster per image and its activations are host memory: a forward there may take an
    eighth of the target delay, not a quarter (the target itself is the same on every device)."""
    on_cpu = configs.overload_config(ServerSettings(device="cpu", max_queue_delay_ms=1000))
    on_gpu = configs.overload_config(ServerSettings(device="cuda:0", max_queue_delay_ms=1000))
    assert (on_cpu.batch_share, on_gpu.batch_share) == (0.125, 0.25)
    assert on_cpu.max_queue_delay_s == on_gpu.max_queue_delay_s == 1.0


def test_attention_backend_setting_names_exactly_the_encoder_backends() -> None:
    import typing

    from mmproc.layers.attention import ATTENTION_BACKENDS
    from mmproc.layers.kernels import KernelOptions

    field = ServerSettings.model_fields["attention_backend"]
    assert typing.get_args(field.annotation) == ATTENTION_BACKENDS  # settings load no torch: a copy, kept equal
    assert field.default == KernelOptions.attention_backend


def test_the_attention_backend_setting_reaches_the_encoder() -> None:
    from service.app.build import load_model

    settings = ServerSettings(attention_backend="torch_varlen")
    encoder, _ = load_model(settings)
    assert encoder.tower.options.attention_backend == "torch_varlen"
    with pytest.raises(ValueError, match="attention_backend"):
        ServerSettings(attention_backend="flash3")
