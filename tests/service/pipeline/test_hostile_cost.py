"""Hostile images whose cost is out of proportion to their size, through a real server (issue 17).

Each class is refused with its own reason within 1 s; a good-request probe beside them keeps its p99 under
2 s; refusals are counted by reason in /metrics; an image the header peek cannot size is still counted
against the patch budgets once decoded.
"""

from __future__ import annotations

import concurrent.futures
import re
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from mmproc.client import EncoderClient
from mmproc.errors import InvalidMediaError, Reason, ResourceExhaustedError
from mmproc.media.formats import JPEG, peek_size
from tests.support.common import wait_until
from tests.support.cost_samples import (
    bmp_rle_eol_bomb,
    bmp_rle_slow,
    gif_many_blocks,
    jpeg_junk_after_app0,
    jpeg_many_segments,
    jpeg_scan_bomb,
    png_many_chunks,
)
from tests.support.media_samples import make_image_bytes
from tests.support.server import ServiceThread, serving, test_settings, wait_inflight

ANSWER_S = 1.0  # each hostile class is answered within this (the budget)
PROBE_P99_S = 2.0
GOOD = make_image_bytes(64, 48, "PNG", seed=3)
PEEK_EVASION = jpeg_junk_after_app0(4000, 3000)  # ~4,100 patches, once the peek reads past the junk byte

# (class, bytes, reason). The slow RLE BMP is within the run-length ratio, so only its decode time gives it away.
HOSTILE = [
    ("jpeg-scan-bomb", jpeg_scan_bomb(4096, 4096, 5000), Reason.TOO_MANY_SCANS),
    ("jpeg-segments", jpeg_many_segments(70_000), Reason.TOO_MANY_CHUNKS),
    ("png-idat-chunks", png_many_chunks(70_000), Reason.TOO_MANY_CHUNKS),
    ("png-text-chunks", png_many_chunks(70_000, b"tEXt"), Reason.TOO_MANY_CHUNKS),
    ("gif-extension-blocks", gif_many_blocks(70_000), Reason.TOO_MANY_CHUNKS),
    ("bmp-rle8-eol-bomb", bmp_rle_eol_bomb(6000, 6500), Reason.COMPRESSION_RATIO),
    ("bmp-rle4-eol-bomb", bmp_rle_eol_bomb(6000, 6500, rle4=True), Reason.COMPRESSION_RATIO),
    ("bmp-rle-slow-decode", bmp_rle_slow(3000, 2000), Reason.DECODE_TIME),
]
SLOW = HOSTILE[-1][1]


@pytest.fixture(scope="module")
def server() -> Iterator[ServiceThread]:
    # A tighter decode budget than the default (0.5 s + 0.2 s/MP of CPU time), so that the slow RLE BMP
    # (~0.14 us of CPU per pixel in Pillow's Python decoder) runs out of it: 0.1 + 6 x 0.02 = 0.22 s.
    settings = test_settings(decode_budget_base_s=0.1, decode_budget_per_mp_s=0.02)
    with serving(settings) as server:
        yield server


def timed_refusal(client: EncoderClient, images: list[bytes]) -> tuple[InvalidMediaError, float]:
    started = time.monotonic()
    with pytest.raises(InvalidMediaError) as info:
        client.encode_images(images)
    return info.value, time.monotonic() - started


@pytest.mark.parametrize(("name", "data", "reason"), HOSTILE, ids=[name for name, _, _ in HOSTILE])
def test_each_hostile_class_is_refused_with_its_reason_within_a_second(
    server: ServiceThread, name: str, data: bytes, reason: Reason
) -> None:
    with EncoderClient(server.grpc_target) as client:
        client.encode_images([GOOD])  # a warm channel: the time below is the server's answer, not a connect
        error, seconds = timed_refusal(client, [GOOD, data])
        print(f"{name}: {error.reason} in {seconds * 1000:.0f} ms ({len(data)} bytes)")
        assert (error.reason, error.index) == (reason.value, 1)
        assert seconds <= ANSWER_S, f"{name} took {seconds:.2f} s"
        assert client.encode_images([GOOD])[0].shape[1] == 256  # and the server serves on


def test_a_decode_over_budget_retires_its_workers_and_spares_other_requests(server: ServiceThread) -> None:
    pool = server.service.pipeline.decode_pool
    retired, crashes = pool.retired, pool.crashes
    with EncoderClient(server.grpc_target) as client, concurrent.futures.ThreadPoolExecutor(4) as threads:
        goods = [threads.submit(client.encode_images, [GOOD, GOOD]) for _ in range(3)]
        error, _ = timed_refusal(client, [SLOW])
        assert error.reason == "decode_time"
        assert all(len(good.result(30)) == 2 for good in goods)
    # fresh workers are started in the background (up to 120 s each on a loaded machine), then swapped in
    wait_until(lambda: pool.retired != retired, 150)
    assert pool.retired > retired and pool.crashes == crashes  # recycled gracefully, no crash, nobody else failed
    with EncoderClient(server.grpc_target) as client:
        assert len(client.encode_images([GOOD])) == 1


def test_refusals_are_counted_by_reason(server: ServiceThread) -> None:
    with EncoderClient(server.grpc_target) as client:
        for _, data, _ in HOSTILE[:3]:
            with pytest.raises(InvalidMediaError):
                client.encode_images([data])
    text = httpx.get(f"{server.http_url}/metrics").text
    counts = dict(re.findall(r'mmproc_rejections_total\{reason="([a-z_]+)"\} ([0-9.]+)', text))
    assert float(counts["too_many_scans"]) >= 1 and float(counts["too_many_chunks"]) >= 2
    for reason in ("compression_ratio", "decode_time", "too_many_patches"):
        assert reason in counts  # every reason is exported, from zero


def test_good_requests_keep_moving_beside_hostile_ones(server: ServiceThread) -> None:
    """Two attackers loop over every hostile class (the slow one in requests of 8) while a probe sends one good
    image at a time: every probe request succeeds and their p99 stays under 2 s."""
    stop = threading.Event()
    refused: list[str] = []

    def attack(requests: list[list[bytes]]) -> None:
        with EncoderClient(server.grpc_target) as client:
            while not stop.is_set():
                for images in requests:
                    try:
                        client.encode_images(images)
                    except InvalidMediaError as exc:
                        refused.append(exc.reason)

    attackers = [
        threading.Thread(target=attack, args=([[SLOW] * 8, [GOOD, SLOW, SLOW]],), daemon=True),
        threading.Thread(target=attack, args=([[data, data] for _, data, _ in HOSTILE],), daemon=True),
    ]
    for thread in attackers:
        thread.start()
    latencies = []
    try:
        with EncoderClient(server.grpc_target) as client:
            client.encode_images([GOOD])
            time.sleep(0.5)  # the attack is under way
            for _ in range(25):
                started = time.monotonic()
                assert client.encode_images([GOOD])[0].shape[1] == 256
                latencies.append(time.monotonic() - started)
    finally:
        stop.set()
        for thread in attackers:
            thread.join(30)
    p99 = float(np.percentile(latencies, 99))
    print(f"probe: {len(latencies)} requests, p50 {np.median(latencies) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; "
          f"{len(refused)} hostile refusals")  # fmt: skip
    assert {"decode_time", "too_many_scans"} <= set(refused)
    assert p99 <= PROBE_P99_S, sorted(latencies)[-5:]


def test_peek_evasion_is_sized_or_counted_once_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A junk byte after APP0 no longer hides a JPEG's size from admission (the peek skips it, as libjpeg does):
    the patch budget refuses it from the header, within a second. Where the peek truly cannot size an image
    (simulated here for JPEG), the image counts after decoding, before anything reaches the encoder: past the
    per-request budget a 400, past the in-flight budget a 429 — never a free pass."""
    assert peek_size(JPEG, PEEK_EVASION) == (4000, 3000)
    # A generous per-MP budget: the held BMP must finish however loaded the machine is.
    # cache_mb=0: the same image twice in one request must count twice here (the cache would encode it once)
    settings = test_settings(
        max_patches_per_request=5000, max_inflight_patches=5000, decode_budget_per_mp_s=1.0, cache_mb=0
    )
    server = ServiceThread(settings).start()
    pipeline = server.service.pipeline
    try:
        with EncoderClient(server.grpc_target) as client, concurrent.futures.ThreadPoolExecutor(1) as threads:
            client.encode_images([GOOD])
            error, seconds = timed_refusal(client, [PEEK_EVASION, PEEK_EVASION])  # 8,288 patches by the headers
            print(f"jpeg-peek-evasion: {error.reason} in {seconds * 1000:.0f} ms")
            assert (error.reason, error.index) == ("too_many_patches", -1) and seconds <= ANSWER_S

            monkeypatch.setattr(
                "service.pipeline.admission.peek_size", lambda fmt, data: None if fmt == JPEG else peek_size(fmt, data)
            )
            with pytest.raises(InvalidMediaError) as info:
                client.encode_images([PEEK_EVASION, PEEK_EVASION])  # 0 patches by header, 8,288 once decoded
            assert info.value.reason == "too_many_patches"
            # A slow BMP (4,320 patches by its header, ~1 s to decode) holds most of the in-flight budget ...
            held = threads.submit(client.encode_images, [bmp_rle_slow(3000, 2000)])
            wait_inflight(server)
            # ... so the unsized JPEG, admitted as 0, is refused once decoding shows its 4,144 patches.
            with pytest.raises(ResourceExhaustedError, match="found by decoding"):
                client.encode_images([PEEK_EVASION])
            assert len(held.result(60)) == 1
            assert pipeline.idle
            assert len(client.encode_images([PEEK_EVASION])) == 1  # alone it fits
    finally:
        server.stop()
