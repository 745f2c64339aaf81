"""The garbage collector in the serving process (service.process.gc_pauses): start-up's objects leave its scans,
and every pause is measured by generation."""

from __future__ import annotations

import gc

import pytest

from service.process.gc_pauses import freeze_start_up_objects
from service.process.metrics import Metrics
from tests.support.python_subprocess import run_python


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # a test process must not keep what it froze: frozen cycles are never collected


def sample(metrics: Metrics, name: str, generation: str) -> float:
    return metrics.registry.get_sample_value(f"mmproc_gc_pause_seconds_{name}", {"generation": generation}) or 0.0


def test_freezing_takes_start_up_objects_out_of_every_later_full_pass(unfrozen, caplog) -> None:
    caplog.set_level("INFO", logger="service.process.gc_pauses")
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
        from service.pipeline.decode_worker import init_worker
        init_worker(0, "WARNING", False)
        print(gc.get_freeze_count(), len(gc.get_objects()))
    """)
    assert out.returncode == 0, out.stderr
    frozen, scanned = map(int, out.stdout.split())
    assert frozen > 10_000 and scanned < frozen // 10, (frozen, scanned)
