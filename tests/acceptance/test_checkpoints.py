"""The walking skeleton's acceptance test: random-weight checkpoints in the real Kimi-VL and K2.5 layouts,
served in float32 on the CPU through `--model-path`, give embeddings within 1e-3 relative error of an
independent implementation of the published architecture (tests/support/reference_moonvit.py), for images of many
sizes, formats and modes; invalid media in the same server is a 400."""

from __future__ import annotations

import base64

import httpx
import pytest
import torch

from mmproc.batching import pack_images
from mmproc.client import EncoderClient
from mmproc.errors import InvalidMediaError
from mmproc.media import MediaLimits, decode_image
from mmproc.preprocess import load_preprocess_config, preprocess_image
from tests.support.checkpoints import TINY_VISION, write_checkpoint
from tests.support.common import rel_err
from tests.support.media_samples import make_image_bytes
from tests.support.reference_moonvit import reference_model
from tests.support.server import serving, test_settings

# (width, height, format, mode, EXIF orientation)
CASES = [
    (448, 448, "PNG", "RGB", None),
    (300, 200, "JPEG", "RGB", 6),  # rotated by EXIF: the server must see 200x300
    (97, 333, "WEBP", "RGBA", None),
    (64, 64, "GIF", "P", None),
    (50, 70, "BMP", "RGB", None),
    (120, 90, "PNG", "L", None),
    (200, 150, "PNG", "I;16", None),
    (256, 128, "JPEG", "CMYK", None),
    (37, 53, "PNG", "LA", None),
    (1030, 260, "JPEG", "L", 3),
]
IMAGES = [make_image_bytes(w, h, fmt=f, mode=m, seed=i, exif_orientation=o) for i, (w, h, f, m, o) in enumerate(CASES)]
TEXT_HIDDEN = 256


@pytest.fixture(scope="module", params=["kimi_vl", "kimi_k25"])
def served(request, tmp_path_factory):
    family = request.param
    path = tmp_path_factory.mktemp(family)
    tensors = write_checkpoint(path, family, sharded=family == "kimi_vl", with_language_model=True, seed=11)
    with serving(test_settings(model_path=str(path), dtype="float32")) as server:
        yield family, path, tensors, server


@torch.inference_mode()
def test_served_checkpoint_matches_the_independent_reference(served) -> None:
    family, path, tensors, server = served
    with EncoderClient(server.grpc_target, timeout=120) as client:
        embeddings = client.encode_images(IMAGES)
    reference = reference_model(family, TINY_VISION, TEXT_HIDDEN, tensors)
    preprocess = load_preprocess_config(path)
    for case, data, got in zip(CASES, IMAGES, embeddings):
        image = preprocess_image(decode_image(data, MediaLimits()).image, preprocess)
        batch = pack_images([image])
        want = reference(batch.pixel_values, list(batch.grid_hws))
        assert got.shape == want.shape == (image.num_tokens, TEXT_HIDDEN), case
        assert rel_err(got, want) < 1e-3, case


def test_the_server_describes_the_checkpoint(served) -> None:
    family, _, _, server = served
    with EncoderClient(server.grpc_target) as client:
        info = client.server_info()
    assert info.model_layout == family
    assert info.hidden_size == TEXT_HIDDEN
    assert info.vision_hidden_size == TINY_VISION["hidden_size"]
    assert info.preprocess.family == family


def test_invalid_media_is_a_client_error_on_both_front_ends(served) -> None:
    _, _, _, server = served
    bad = IMAGES[0][:100]  # a truncated PNG
    with EncoderClient(server.grpc_target) as client, pytest.raises(InvalidMediaError) as info:
        client.encode_images([IMAGES[1], bad])
    assert info.value.index == 1 and info.value.reason == "truncated"
    body = {"images": [base64.b64encode(IMAGES[1]).decode(), base64.b64encode(bad).decode()]}
    reply = httpx.post(f"{server.http_url}/v1/encode", json=body, timeout=60)
    assert reply.status_code == 400
    assert reply.json()["error"]["index"] == 1 and reply.json()["error"]["reason"] == "truncated"
