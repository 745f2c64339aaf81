"""The vLLM side of tests/engines/test_vllm_e2e.py, run in the vLLM environment as its own process (vLLM's engine
spawns processes): `python -m tests.engines.vllm_run --mode native|mmproc --model DIR --out FILE [--target T]`.

native: vLLM encodes the images itself. mmproc: the images are kept in mmproc first and vLLM loads them through
`mmproc.engines.vllm` (here through `PerturbingConnector`, which reverses the rows of keys starting with
"perturb-", asks mmproc for keys "vanish-*" as "gone-*", never kept, at fetch time, and is the plain connector
otherwise). Writes {case: [token ids] | "error:<finish reason>"} and {"seconds": {case: s}} as JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import time

os.environ.setdefault("VLLM_MLA_DISABLE", "1")  # the tiny MLA heads have no CPU kernel; plain attention does
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB

from PIL import Image  # noqa: E402

from mmproc.engines.vllm_connector import MmprocECConnector  # noqa: E402
from tests.engines.checkpoint import token_id  # noqa: E402
from tests.support.media_samples import make_image_bytes  # noqa: E402

# (width, height): padded only, resized (over the checkpoint's 1024-patch limit), portrait, resized again
SIZES = {"pad": (100, 80), "resize": (1000, 300), "tall": (64, 200), "big": (600, 500)}
CASES = {"one_pad": ["pad"], "one_resize": ["resize"], "two": ["tall", "big"], "three": ["pad", "resize", "tall"]}
MAX_TOKENS = 12


class VanishingKeys:
    """mmproc's client, but keys "vanish-*" are fetched as "gone-*": a key that vanished from mmproc between the
    scheduler's lookup and the worker's fetch (mmproc answers NOT_FOUND for the whole call, as it would)."""

    def __init__(self, client) -> None:
        self.client = client

    def fetch(self, keys, **kwargs):
        return self.client.fetch([k.replace("vanish-", "gone-", 1) for k in keys], **kwargs)

    def close(self) -> None:
        self.client.close()


class PerturbingConnector(MmprocECConnector):
    def __init__(self, vllm_config, role) -> None:
        super().__init__(vllm_config, role)
        if not hasattr(self, "_lookups"):  # the worker side
            self._client = VanishingKeys(self._client)

    def start_load_caches(self, encoder_cache, **kwargs) -> None:
        meta = self._get_connector_metadata()
        fresh = [key for key in meta.loads if key not in encoder_cache]
        super().start_load_caches(encoder_cache, **kwargs)
        for key in fresh:
            if key.startswith("perturb-"):
                encoder_cache[key] = encoder_cache[key].flip(0).contiguous()


def image_bytes(name: str) -> bytes:
    width, height = SIZES[name]
    return make_image_bytes(width, height, fmt="PNG", seed=sorted(SIZES).index(name) + 1)


def prompt_ids(count: int) -> list[int]:
    image = [token_id(t) for t in ("<|media_begin|>", "image", "<|media_content|>", "<|media_pad|>", "<|media_end|>")]
    return [token_id("w3")] + image * count + [token_id("w7"), token_id("w11")]


def prompt(names: list[str], uuids: list[str | None]) -> dict:
    images = [Image.open(io.BytesIO(image_bytes(n))).convert("RGB") for n in names]
    items = [{"type": "image", "image": im, "uuid": u} for im, u in zip(images, uuids)]
    out = {"prompt_token_ids": prompt_ids(len(names)), "multi_modal_data": {"vision_chunk": items}}
    if any(u is not None for u in uuids):
        out["multi_modal_uuids"] = {"vision_chunk": uuids}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["native", "mmproc"], required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--target", default="127.0.0.1:50051")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    kwargs = {}
    prompts: dict[str, dict] = {}
    if args.mode == "mmproc":
        from mmproc.client import EncoderClient
        from mmproc.engines.vllm import keep_images

        kwargs["ec_transfer_config"] = {
            "ec_connector": "PerturbingConnector",
            "ec_role": "ec_consumer",
            "ec_connector_module_path": "tests.engines.vllm_run",
            "ec_connector_extra_config": {"target": args.target},
        }
        with EncoderClient(args.target) as client:
            for prefix in ("", "perturb-"):
                kept = keep_images(client, [image_bytes(n) for n in SIZES], [prefix + n for n in SIZES])
                assert [k.key for k in kept] == [prefix + n for n in SIZES]
            keep_images(client, [image_bytes("resize")], ["mismatch"])  # 270 rows under a key vLLM never saw
            keep_images(client, [image_bytes("tall")], ["vanish-tall"])
        for case, names in CASES.items():
            prompts[case] = prompt(names, names)
        prompts["perturbed"] = prompt(["pad", "resize"], ["perturb-pad", "perturb-resize"])
        prompts["unknown_key"] = prompt(["pad"], ["never-kept"])
        prompts["count_mismatch"] = prompt(["pad"], ["mismatch"])  # 12 placeholders, 270 rows kept
        prompts["no_uuid"] = prompt(["pad"], [None])  # vLLM's own hash as the key: fails at once, with a hint
    else:
        for case, names in CASES.items():
            prompts[case] = prompt(names, [None] * len(names))
        prompts["perturbed"] = prompt(["pad", "resize"], [None, None])

    llm = LLM(
        model=args.model,
        dtype="float32",
        max_model_len=2048,
        max_num_batched_tokens=2048,
        enforce_eager=True,
        limit_mm_per_prompt={"vision_chunk": 4},
        enable_prefix_caching=False,
        **kwargs,
    )
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    results: dict[str, object] = {}
    seconds: dict[str, float] = {}
    batches = {name: [request] for name, request in prompts.items()}  # one at a time: the same batch shapes
    if args.mode == "mmproc":
        # one scheduler step: a good request beside one whose key vanishes before the fetch; then that key again
        batches["vanish_step"] = [prompt(["pad"], ["pad"]), prompt(["tall"], ["vanish-tall"])]
        batches["vanished_again"] = [prompt(["tall"], ["vanish-tall"])]
        batches["after_errors"] = [prompt(["pad"], ["pad"])]  # the engine still serves after the failed requests
    for name, batch in batches.items():
        start = time.monotonic()
        outputs = [out.outputs[0] for out in llm.generate(batch, params, use_tqdm=False)]
        seconds[name] = time.monotonic() - start
        got = [list(c.token_ids) if c.finish_reason == "length" else f"error:{c.finish_reason}" for c in outputs]
        results[name] = got[0] if len(batch) == 1 else got
    results["seconds"] = seconds
    with open(args.out, "w") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main()
