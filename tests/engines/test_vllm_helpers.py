"""The vLLM connector's vLLM-free parts, in the main suite: the front-end helpers import and work without vLLM, the
scheduler's lookups fail each request at once with its reason (or fall back), the worker's fetch splits a step
whose key vanished. The connector itself runs against a real vLLM in test_vllm_e2e.py / test_vllm_serve_e2e.py."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmproc.client import EncoderClient
from mmproc.engines.vllm_fetch import fetch_rows
from mmproc.engines.vllm_lookups import ConnectorConfig, Failure, Lookups, Verdict
from mmproc.errors import InvalidMediaError, UnavailableError, UnknownKeyError
from tests.support.media_samples import make_image_bytes

REPO = Path(__file__).resolve().parents[2]
VLLM_HASH = "0123456789abcdef" * 4


def test_the_front_end_helpers_import_without_vllm() -> None:
    code = (
        "import sys; sys.modules['vllm'] = None\n"  # any `import vllm` now raises ModuleNotFoundError
        "from mmproc.engines.vllm import keep_images, vllm_inputs, content_key\n"
        "from mmproc.engines import vllm_chat, vllm_proxy, vllm_lookups, vllm_fetch\n"
        "print(vllm_inputs('kimi_k25', ['im'], [type('K', (), {'key': 'k1'})()]))\n"
        "try:\n    from mmproc.engines.vllm import MmprocECConnector\nexcept ModuleNotFoundError as e:\n"
        "    print('connector needs', e.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "'multi_modal_uuids': {'vision_chunk': ['k1']}" in out.stdout
    assert "connector needs vllm" in out.stdout


def test_keep_images_keeps_under_content_keys_and_refuses_bad_images_at_once(tiny_server) -> None:
    from mmproc.engines.vllm import content_key, keep_images

    image = make_image_bytes(100, 80, fmt="PNG", seed=1)
    with EncoderClient(tiny_server.grpc_target) as client:
        kept = keep_images(client, [image])
        assert kept[0].key == content_key(image) and kept[0].num_tokens > 0
        assert client.lookup([kept[0].key])[0].num_tokens == kept[0].num_tokens
        start = time.monotonic()
        with pytest.raises(InvalidMediaError):
            keep_images(client, [b"not an image"])
        assert time.monotonic() - start < 5


class FakeKeys:
    """mmproc's lookup/fetch: `held` maps key -> rows; `down` raises UNAVAILABLE; NOT_FOUND names a missing key."""

    def __init__(self, held: dict[str, int], down: bool = False) -> None:
        self.held, self.down, self.calls = held, down, []

    def lookup(self, keys, *, timeout=None):
        return [SimpleNamespace(num_tokens=self._get(keys)[0])]

    def fetch(self, keys, *, timeout=None):
        rows = self._get(keys)
        return [SimpleNamespace(tensor=torch.full((n, 4), float(n))) for n in rows]

    def _get(self, keys):
        self.calls.append(list(keys))
        if self.down:
            raise UnavailableError("UNAVAILABLE: connection refused")
        for key in keys:
            if key not in self.held:
                raise UnknownKeyError(f"no result kept under key {key!r}")
        return [self.held[k] for k in keys]


def settle(lookups: Lookups, request_id: str, items, steps: int = 200) -> Verdict:
    for _ in range(steps):  # as the scheduler does: ask every step until the lookups answered
        verdict = lookups.check(request_id, items)
        if verdict is not Verdict.PENDING:
            return verdict
        time.sleep(0.01)
    raise AssertionError("still pending")


@pytest.fixture
def pool():
    with ThreadPoolExecutor(2) as executor:
        yield executor


def test_each_failure_fails_its_own_request_at_once_with_its_reason(pool) -> None:
    lookups = Lookups(ConnectorConfig(), FakeKeys({"a": 12, "b": 270}), pool)
    start = time.monotonic()
    assert settle(lookups, "ok", [("a", 12), ("b", 270)]) is Verdict.READY
    assert settle(lookups, "missing", [("a", 12), ("gone", 5)]) is Verdict.FAILED
    assert settle(lookups, "no-uuid", [(VLLM_HASH, 12)]) is Verdict.FAILED
    assert settle(lookups, "mismatch", [("b", 12)]) is Verdict.FAILED
    assert time.monotonic() - start < 1.0  # no waiting for a key that may come later (lookup_wait_s = 0)
    failed = lookups.take_failed()
    assert set(failed) == {"missing", "no-uuid", "mismatch"} and lookups.take_failed() == {}
    assert "item 1 (key 'gone'): mmproc holds no result under this key" in failed["missing"]
    assert "carries no multi_modal_uuids" in failed["no-uuid"]
    assert "mmproc holds 270 rows, vLLM's prompt has 12 placeholders" in failed["mismatch"]
    assert lookups.held("a") and lookups.held("b") and not lookups.held("gone")
    assert lookups.counts == {"lookups": 2, "missing_key": 1, "no_uuid": 1, "count_mismatch": 1}


def test_an_unreachable_mmproc_fails_or_falls_back_to_vllm_when_asked(pool) -> None:
    down = FakeKeys({}, down=True)
    strict = Lookups(ConnectorConfig(), down, pool)
    assert settle(strict, "r1", [("a", 12)]) is Verdict.FAILED
    assert "is unreachable" in strict.take_failed()["r1"]
    calls = len(down.calls)
    assert strict.check("r2", [("b", 3)]) is Verdict.FAILED  # within down_retry_s: answered without a call
    assert len(down.calls) == calls

    lenient = Lookups(ConnectorConfig(fallback_to_vllm=True), FakeKeys({}, down=True), pool)
    assert settle(lenient, "r1", [("a", 12), ("b", 3)]) is Verdict.READY
    assert not lenient.held("a") and not lenient.held("b")  # vLLM's own encoder runs for them
    assert lenient.counts["fallback"] == 2 and lenient.take_failed() == {}
    lenient.finished("r1", ["a", "b"])
    assert lenient._local == {}  # nothing kept after the request


def test_a_key_whose_fetch_failed_fails_its_requests_and_is_not_used_again(pool) -> None:
    lookups = Lookups(ConnectorConfig(), FakeKeys({"a": 12, "b": 3}), pool)
    assert settle(lookups, "r1", [("a", 12)]) is Verdict.READY
    assert settle(lookups, "r2", [("b", 3)]) is Verdict.READY
    lookups.fetch_failed("a", "NOT_FOUND")
    assert set(lookups.take_failed()) == {"r1"}
    lookups.fail("r1", Failure.FETCH, "again")  # a request fails once: counted once, handed over once
    assert lookups.take_failed() == {} and lookups.counts["fetch"] == 1
    assert lookups.check("r3", [("a", 12)]) is Verdict.FAILED  # vLLM may hold zero rows under "a"
    assert "an earlier fetch of this key failed" in lookups.take_failed()["r3"]


def test_one_vanished_key_fails_only_its_own_rows_of_the_step() -> None:
    client = FakeKeys({"a": 12, "c": 3})
    tensors, failed = fetch_rows(client, {"a": 12, "gone": 5, "c": 3}, hidden=4, timeout=1.0)
    assert set(tensors) == {"a", "c"} and tensors["a"].shape == (12, 4)
    assert set(failed) == {"gone"} and "gone" in failed["gone"]
    assert client.calls == [["a", "gone", "c"], ["a"], ["gone"], ["c"]]  # one call, then split on NOT_FOUND
    tensors, failed = fetch_rows(client, {"a": 7}, hidden=4, timeout=1.0)  # rows differ from what vLLM expects
    assert tensors == {} and failed["a"] == "got (12, 4), want (7, 4)"
    down = FakeKeys({"a": 12}, down=True)
    tensors, failed = fetch_rows(down, {"a": 12, "c": 3}, hidden=4, timeout=1.0)
    assert tensors == {} and set(failed) == {"a", "c"} and len(down.calls) == 1  # no per-key retries when down
