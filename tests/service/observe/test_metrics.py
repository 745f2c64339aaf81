"""`GET /metrics` while a load runs: counters move, histograms get samples, every family is there."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import mmproc
from mmproc.client import EncoderClient
from mmproc.errors import InvalidMediaError
from service.observe.metrics import STAGES
from tests.support.common import wait_until
from tests.support.media_samples import make_image_bytes

Samples = dict[tuple[str, frozenset], float]


def scrape(server) -> tuple[Samples, set[str]]:
    """(every sample keyed by name and labels, the family names) of the server's /metrics."""
    reply = httpx.get(f"{server.http_url}/metrics", timeout=10)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    families = set()
    for family in text_string_to_metric_families(reply.text):
        families.add(family.name)
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, families


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_every_family_is_exported_before_any_traffic(tiny_server) -> None:
    samples, families = scrape(tiny_server)
    for family in (
        "mmproc_requests", "mmproc_request_duration_seconds", "mmproc_rejections", "mmproc_images_encoded",
        "mmproc_tokens_encoded", "mmproc_stage_duration_seconds", "mmproc_batch_images", "mmproc_batch_patches",
        "mmproc_queue_images", "mmproc_inflight_requests", "mmproc_ready", "mmproc_ipc_pool_bytes_in_use",
        "mmproc_ipc_pool_capacity_bytes", "mmproc_ipc_leases", "mmproc_ipc_fallbacks", "mmproc_ipc_sessions_opened",
        "mmproc_decode_worker_crashes", "mmproc_decode_worker_retirements", "mmproc_decode_quarantined_images",
        "mmproc_build_info", "process_cpu_seconds", "mmproc_cpu_seconds", "mmproc_reply_pinned_bytes",
        "mmproc_reply_pinned_misses", "mmproc_log_records_dropped",
    ):  # fmt: skip
        assert family in families, family
    for stage in STAGES:
        assert ("mmproc_stage_duration_seconds_count", frozenset({("stage", stage)})) in samples
    assert value(samples, "mmproc_ready") == 1.0
    assert value(samples, "mmproc_ipc_fallbacks_total") == 0.0
    assert value(samples, "mmproc_pinned_host_bytes") == 0.0  # a CPU server pins nothing
    assert (
        value(samples, "mmproc_reply_pinned_bytes") == 0.0 and value(samples, "mmproc_reply_pinned_misses_total") == 0
    )
    assert value(samples, "mmproc_log_records_dropped_total") == 0.0


def test_counters_and_histograms_move_under_load(tiny_server) -> None:
    good = [make_image_bytes(64 + 16 * i, 48, fmt="PNG", seed=i) for i in range(3)]
    before, _ = scrape(tiny_server)
    # cache=False: every request runs the whole pipeline (the embedding cache would answer repeats)
    with EncoderClient(tiny_server.grpc_target, timeout=60, cache=False) as client:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: client.encode_images(good), range(8)))
        with pytest.raises(InvalidMediaError):
            client.encode_images([good[0], b"definitely not an image"])
    http_reply = httpx.post(f"{tiny_server.http_url}/v1/encode", json={"images": ["%%%"]}, timeout=10)
    assert http_reply.status_code == 400
    after, _ = scrape(tiny_server)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    tokens = sum(t.shape[0] for result in results for t in result)
    assert moved("mmproc_requests_total", front_end="grpc", method="EncodeImagesStream", code="OK") == 8
    assert moved("mmproc_requests_total", front_end="grpc", method="EncodeImagesStream", code="INVALID_ARGUMENT") == 1
    assert moved("mmproc_requests_total", front_end="http", method="/v1/encode", code="INVALID_ARGUMENT") == 1
    assert moved("mmproc_request_duration_seconds_count", front_end="grpc", method="EncodeImagesStream") == 9
    assert moved("mmproc_rejections_total", reason="unsupported_format") == 1
    assert moved("mmproc_rejections_total", reason="bad_request") == 1
    assert moved("mmproc_images_encoded_total") >= 8 * len(good)
    assert moved("mmproc_tokens_encoded_total") >= tokens
    for stage in STAGES:
        assert moved("mmproc_stage_duration_seconds_count", stage=stage) > 0, stage
    assert moved("mmproc_stage_duration_seconds_count", stage="decode") >= 8 * len(good)
    assert moved("mmproc_batch_images_count") > 0
    assert moved("mmproc_batch_patches_sum") > 0
    assert value(after, "mmproc_inflight_requests") == 0
    assert value(after, "mmproc_queue_images") == 0


def test_servers_in_one_process_keep_separate_registries(tiny_server) -> None:
    from tests.support.server import ServiceThread, test_settings

    other = ServiceThread(test_settings()).start()
    try:
        with EncoderClient(other.grpc_target) as client:
            client.encode_images([make_image_bytes(32, 32, fmt="PNG")])
        before, _ = scrape(tiny_server)
        with EncoderClient(other.grpc_target) as client:
            client.encode_images([make_image_bytes(32, 32, fmt="PNG")])
        after, _ = scrape(tiny_server)
        theirs, _ = scrape(other)
    finally:
        other.stop()
    assert value(theirs, "mmproc_requests_total", front_end="grpc", method="EncodeImagesStream", code="OK") == 2
    assert value(after, "mmproc_images_encoded_total") == value(before, "mmproc_images_encoded_total")


def test_build_info_names_the_version_and_the_model_served(tiny_server) -> None:
    samples, _ = scrape(tiny_server)
    (labels,) = [dict(labels) for name, labels in samples if name == "mmproc_build_info"]
    assert labels == {
        "version": mmproc.__version__, "model": "tiny", "family": "kimi_vl", "layout": "kimi_vl",
        "dtype": "float32", "quantization": "none", "device": "cpu", "transport": "serialized",
    }  # fmt: skip
    assert value(samples, "mmproc_build_info", **labels) == 1.0
    assert value(samples, "mmproc_decode_worker_crashes_total", pool="shared") == 0.0


def test_a_stalled_event_loop_shows_in_the_loop_lag_histogram(tiny_server) -> None:
    # A handler that blocks the loop for 0.3 s delays every other request by as much: the lag metric must say so.
    def slow_bucket_count() -> float:
        samples, _ = scrape(tiny_server)
        total = value(samples, "mmproc_event_loop_lag_seconds_count")
        return total - value(samples, "mmproc_event_loop_lag_seconds_bucket", le="0.1")

    before = slow_bucket_count()
    tiny_server.on_loop(lambda: time.sleep(0.3))
    assert wait_until(lambda: slow_bucket_count() > before, timeout=10)


def test_refusals_before_the_handler_are_requests_too_and_no_created_series(tiny_server) -> None:
    body = httpx.get(f"{tiny_server.http_url}/metrics", timeout=10).text
    assert "_created" not in body  # a second series per family, read by no dashboard
    before, _ = scrape(tiny_server)
    for _ in range(3):  # refused from its headers, before the handler: no Content-Length on a POST
        reply = httpx.post(f"{tiny_server.http_url}/v1/encode", content=iter([b"{}"]), timeout=10)
        assert reply.status_code == 400
    after, _ = scrape(tiny_server)
    labels = {"front_end": "http", "method": "/v1/encode", "code": "INVALID_ARGUMENT"}
    moved = value(after, "mmproc_requests_total", **labels) - value(before, "mmproc_requests_total", **labels)
    rejected = value(after, "mmproc_rejections_total", reason="bad_request")
    assert moved == 3 == rejected - value(before, "mmproc_rejections_total", reason="bad_request")
    assert not any(dict(labels_).get("method", "").startswith("http:") for _, labels_ in after)
