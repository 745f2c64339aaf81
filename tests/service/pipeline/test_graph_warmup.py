"""Batches captured as CUDA graphs before serving (`cuda_graph_warmup_sizes`, RequestPipeline.start): traffic of those sizes
replays graphs from its first batch instead of capturing under load. The setting's rules run everywhere; the
captures on the device (scripts/gpu_overload_check.sh's server takes the same flags)."""

from __future__ import annotations

import pytest
import torch

from mmproc.client import EncoderClient
from mmproc.errors import ConfigError
from mmproc.models.cuda_graphs import CapturedForward
from service.app.configs import pipeline_config
from tests.support.media_samples import make_image_bytes
from tests.support.server import serving, test_settings


def test_warmup_sizes_are_width_by_height_pairs() -> None:
    config = pipeline_config(test_settings(cuda_graph_warmup_sizes="448x448, 896X672"), cache_context="")
    assert config.graph_warmup_sizes == ((448, 448), (896, 672))
    assert pipeline_config(test_settings(), cache_context="").graph_warmup_sizes == ()
    for bad in ("448", "448x", "0x448", "448x448x3", "big x small"):
        with pytest.raises(ConfigError, match="WxH"):
            test_settings(cuda_graph_warmup_sizes=bad)


def test_a_cpu_server_ignores_them() -> None:
    with serving(test_settings(cuda_graph_warmup_sizes="448x448", http_address="")) as server:
        assert not server.service.pipeline.encoder.graphs.graphs  # CUDA graphs are for a CUDA encoder only


@pytest.mark.cuda
def test_a_server_captures_its_warmup_sizes_before_serving_and_replays_them(monkeypatch) -> None:
    settings = test_settings(
        device="cuda:0", dtype="float32", transport="serialized", cache_mb=0, http_address="",
        cuda_graphs=4, cuda_graph_max_patches=4096, cuda_graph_warmup_sizes="448x448",
    )  # fmt: skip
    replays = []
    replay = CapturedForward.replay
    monkeypatch.setattr(CapturedForward, "replay", lambda self, *a: replays.append(self) or replay(self, *a))
    with serving(settings) as server, EncoderClient(server.grpc_target) as client:
        encoder = server.service.pipeline.encoder
        captured = dict(encoder.graphs.graphs)
        assert len(captured) == 4  # batches of 1..4 images of 448² (1,024 patches each, 4,096 at most)
        images = [make_image_bytes(448, 448, "JPEG", seed=s) for s in range(3)]
        got = client.encode_images(images)  # the first request of that size: replayed, nothing captured
        assert replays and all(r in captured.values() for r in replays) and encoder.graphs.graphs == captured
        graphs, encoder.graphs = encoder.graphs, None
        try:
            want = client.encode_images(images)  # the same images, eagerly
        finally:
            encoder.graphs = graphs
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
