"""The garbage collector in the serving process (service.observe.gc_pauses): start-up's objects leave its scans,
and every pause is measured by generation."""

from __future__ import annotations

import gc

import grpc
import pytest

from service.observe.gc_pauses import freeze_start_up_objects
from service.observe.metrics import Metrics
from tests.support.python_subprocess import run_python


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # a test process must not keep what it froze: frozen cycles are never collected


def sample(metrics: Metrics, name: str, generation: str) -> float:
    return metrics.registry.get_sample_value(f"mmproc_gc_pause_seconds_{name}", {"generation": generation}) or 0.0


def test_freezing_takes_start_up_objects_out_of_every_later_full_pass(unfrozen, caplog) -> None:
    caplog.set_level("INFO", logger="service.observe.gc_pauses")
    scanned_before, frozen_before = len(gc.get_objects()), gc.get_freeze_count()
    frozen = freeze_start_up_objects()
    added = frozen - frozen_before
    assert added > 10_000 or frozen_before > 10_000  # torch, gRPC and the test's own modules at least
    assert len(gc.get_objects()) < scanned_before - added // 2  # what a full pass walks now
    assert f"{frozen} start-up objects frozen" in caplog.text


def test_pauses_are_observed_by_generation_while_installed() -> None:
    metrics = Metrics()
    with metrics.gc_pause:
        gc.collect()
        gc.collect(0)
    assert sample(metrics, "count", "2") == 1 and sample(metrics, "sum", "2") > 0
    assert sample(metrics, "count", "0") >= 1  # a young pass (more may run on their own)
    counted = sample(metrics, "count", "2")
    gc.collect()
    assert sample(metrics, "count", "2") == counted  # removed on exit


def test_a_decode_worker_starts_with_its_imports_frozen() -> None:
    # Its image budget is CPU time: a full pass over torch's objects inside a task would be charged to the image.
    out = run_python("""
        import gc
        from service.pipeline.decode.worker import init_worker
        init_worker(0, "WARNING", False)
        print(gc.get_freeze_count(), len(gc.get_objects()))
    """)
    assert out.returncode == 0, out.stderr
    frozen, scanned = map(int, out.stdout.split())
    assert frozen > 10_000 and scanned < frozen // 10, (frozen, scanned)


def live(kind: type) -> int:
    return sum(type(o) is kind for o in gc.get_objects())


def test_a_finished_call_leaves_its_request_to_reference_counting_not_to_the_collector() -> None:
    """Under overload most calls are refusals: each one left in a reference cycle (gRPC's abort keeps its error on
    the call's state) held its request, image bytes included, until a collection came."""
    from mmproc.v1 import encoder_pb2 as pb
    from mmproc.v1 import encoder_pb2_grpc as pb_grpc
    from tests.support.common import wait_until
    from tests.support.media_samples import encode_image, random_image
    from tests.support.server import serving, test_settings

    image = encode_image(random_image(64, 48, seed=1), "png")
    too_many = pb.EncodeImagesRequest(images=[image] * 3, transport=pb.TRANSPORT_SERIALIZED)
    answered = pb.EncodeImagesRequest(images=[image], transport=pb.TRANSPORT_SERIALIZED, cache_bypass=True)
    with serving(test_settings(max_images_per_request=2)) as server, grpc.insecure_channel(server.grpc_target) as ch:
        stub = pb_grpc.EncoderStub(ch)
        stub.EncodeImages(answered, timeout=30)  # warm: first calls build what later ones reuse
        gc.collect()
        gc.disable()
        try:
            before = live(pb.EncodeImagesRequest)
            for _ in range(5):
                with pytest.raises(grpc.RpcError) as info:
                    stub.EncodeImages(too_many, timeout=30)
                assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "limit 2" in info.value.details()
                assert "x-request-id" in dict(info.value.trailing_metadata())
                with pytest.raises(grpc.RpcError) as info:
                    list(stub.EncodeImagesStream(too_many, timeout=30))
                assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert len(stub.EncodeImages(answered, timeout=30).embeddings) == 1
            # The server ends its side of a call just after the client has its status: wait for that, not for a
            # collection (disabled), which alone would free a request held in a cycle.
            wait_until(lambda: live(pb.EncodeImagesRequest) == before, timeout=5)
            left = live(pb.EncodeImagesRequest) - before
        finally:
            gc.enable()
    assert left == 0, f"{left} requests of 15 finished calls wait for the garbage collector"
