"""The transport seam: a third transport (tests/support/loopback_transport.py) added through the table alone is
started by the server, asked for by the client, described in replies and server info, falls back when full, and
is unknown to every other file."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

import pytest
import torch

from mmproc.client import AsyncEncoderClient, EncoderClient
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.transports import TRANSPORTS, Table
from service.app.build import build_pipeline
from tests.support.loopback_transport import LOOPBACK, NAME, SHELF
from tests.support.media_samples import make_image_bytes
from tests.support.server import serving, test_settings

REPO = Path(__file__).resolve().parents[2]
WITH_LOOPBACK = Table((*TRANSPORTS, LOOPBACK))
IMAGES = [make_image_bytes(64, 48, fmt="PNG", seed=1), make_image_bytes(96, 80, fmt="JPEG", seed=2)]


@pytest.fixture(scope="module")
def loopback_server():
    factory = lambda s, m: build_pipeline(s, m, transports=WITH_LOOPBACK)  # noqa: E731
    with serving(test_settings(cache_mb=0), pipeline_factory=factory) as server:
        yield server


def test_a_transport_added_through_the_table_carries_the_same_embeddings(loopback_server) -> None:
    with EncoderClient(loopback_server.grpc_target, transport="serialized") as plain:
        want = plain.encode_images(IMAGES)
    with EncoderClient(loopback_server.grpc_target, transport=NAME, transports=WITH_LOOPBACK) as client:
        info = client.server_info()
        with client.encode_images_view(IMAGES) as got:
            assert SHELF.lent  # the rows were lent, not sent: the reply carried handles
        assert not SHELF.lent  # and given back once read
    assert list(info.transport_names) == [NAME, "serialized"] and pb.TRANSPORT_IPC not in info.transports
    assert "loopback active" in info.ipc_status
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_auto_takes_the_first_transport_of_the_table_this_process_can_read(loopback_server) -> None:
    first = Table((LOOPBACK, *TRANSPORTS))
    before = SHELF.lends
    with EncoderClient(loopback_server.grpc_target, transport="auto", transports=first) as client:
        assert len(client.encode_images(IMAGES)) == 2 and SHELF.lends == before + 1
    with EncoderClient(loopback_server.grpc_target, transport="auto", transports=WITH_LOOPBACK) as client:
        assert len(client.encode_images(IMAGES)) == 2  # IPC first: not on a CPU client; then bytes, not the shelf
    assert SHELF.lends == before + 1


def test_the_async_client_reads_a_table_transport_in_a_worker_thread(loopback_server) -> None:
    async def encode() -> list[torch.Tensor]:
        async with AsyncEncoderClient(loopback_server.grpc_target, transport=NAME, transports=WITH_LOOPBACK) as c:
            return await c.encode_images(IMAGES)

    before = SHELF.lends
    got = asyncio.run(encode())
    assert SHELF.lends == before + 1
    with EncoderClient(loopback_server.grpc_target, transport="serialized") as plain:
        assert all(torch.equal(g, w) for g, w in zip(got, plain.encode_images(IMAGES), strict=True))
    assert not SHELF.lent


def test_a_full_transport_falls_back_to_serialized_and_counts_it(loopback_server, monkeypatch) -> None:
    monkeypatch.setattr(SHELF, "max_rows", 0)
    with EncoderClient(loopback_server.grpc_target, transport=NAME, transports=WITH_LOOPBACK) as client:
        got = client.encode_images(IMAGES)
    assert [e.shape[0] for e in got] and not SHELF.lent
    metrics = urllib.request.urlopen(loopback_server.http_url + "/metrics", timeout=10).read().decode()
    assert re.search(r"^mmproc_ipc_fallbacks_total 1\.0$", metrics, re.M)


def test_a_server_without_the_transport_answers_in_bytes(tiny_server) -> None:
    with EncoderClient(tiny_server.grpc_target, transport=NAME, transports=WITH_LOOPBACK) as client:
        assert NAME not in client.server_info().transport_names
        assert len(client.encode_images(IMAGES)) == 2


def test_no_file_but_its_own_names_the_third_transport() -> None:
    """The seam holds: the loopback transport lives in its module and the table a test builds, nowhere else."""
    sources = [p for top in ("mmproc", "service") for p in (REPO / top).rglob("*.py")]
    named = re.compile(r"[\"']loopback[\"']|loopback_transport|Loopback")
    assert len(sources) > 100 and not [p for p in sources if named.search(p.read_text())]
