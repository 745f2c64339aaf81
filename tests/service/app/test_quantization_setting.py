"""`--quantization fp8` (mmproc/models/quantize.py): refused at start-up on a CPU, before a port is bound."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mmproc.errors import ConfigError
from service.app.cli import main
from service.app.server import serve
from tests.support.server import test_settings

NEED = r"quantization fp8 needs a CUDA device of compute capability >= 8\.9"


def test_fp8_on_the_cpu_is_a_start_up_error_naming_the_need() -> None:
    with pytest.raises(ConfigError, match=NEED):
        asyncio.run(serve(test_settings(quantization="fp8")))


def test_the_cli_says_why_and_exits_2(capsys) -> None:
    assert main(["serve", "--quantization", "fp8", "--grpc-address", "127.0.0.1:0", "--http-address", ""]) == 2
    assert "compute capability >= 8.9" in capsys.readouterr().err


def test_unknown_quantization_is_refused_by_the_settings() -> None:
    with pytest.raises(Exception, match="quantization"):
        test_settings(quantization="int4")


@pytest.mark.cuda
@pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)),
    reason="needs a CUDA GPU of compute capability >= 8.9",
)
def test_an_fp8_server_says_so_everywhere_and_encodes() -> None:
    from mmproc.client import EncoderClient
    from mmproc.v1 import encoder_pb2 as pb
    from tests.support.media_samples import make_image_bytes
    from tests.support.server import serving

    settings = test_settings(device="cuda", quantization="fp8", model="tiny-k3", transport="serialized")
    with serving(settings) as server, EncoderClient(server.grpc_target) as client:
        info = client.server_info()
        assert info.quantization == "fp8" and info.dtype == pb.DTYPE_BFLOAT16
        (emb,) = client.encode_images([make_image_bytes(224, 224, seed=1)])
        assert emb.shape[1] == info.hidden_size and emb.dtype == torch.bfloat16 and torch.isfinite(emb.float()).all()
        blocks = server.service.pipeline.encoder.tower.encoder.blocks
        assert type(blocks[0].wqkv).__name__ == "Fp8Linear"
