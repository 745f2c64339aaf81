"""`python -m benchmarks.gpu_preprocess`: JPEG decode + preprocessing on the GPU against the CPU path (CUDA).

Per size: the CPU path (Pillow/libjpeg decode, then `preprocess_image`) one image at a time, against each GPU
decoder on the whole batch followed by `preprocess_tensor` on the GPU: torchvision's nvJPEG `decode_jpeg` and,
where installed, nvImageCodec with nvJPEG's interpolated ("fancy", libjpeg's) chroma upsampling. Reported: the max
and mean pixel difference of the decodes, and the relative difference of the embeddings a kimi-k2.5-shaped
encoder (random weights, bf16) computes from each.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from mmproc.batching import pack_images
from mmproc.bench.workloads import random_encoder
from mmproc.media import MediaLimits, decode_image
from mmproc.models import PRESETS
from mmproc.preprocess import PreprocessConfig, preprocess_image
from mmproc.preprocess.device import preprocess_tensor

SIZES = ((512, 512), (1024, 768), (1920, 1080), (4032, 3024))


def photo_like(width: int, height: int, seed: int) -> bytes:
    """A JPEG (quality 90, 4:2:0, like a phone's) of smooth colour fields, edges and fine noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / (17 + 13 * c) + y / (29 + 7 * c) + c) for c in range(3)], axis=-1)
    img[(x // 97 + y // 61) % 5 == 0] = (230, 40, 40)
    img += rng.normal(0, 12, img.shape)
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def gpu_decoders() -> dict:
    """name -> decode(list of JPEG bytes) -> list of (H, W, 3) uint8 CUDA tensors, for each decoder installed."""
    from torchvision.io import decode_jpeg

    def torchvision_nvjpeg(files: list[bytes]) -> list[torch.Tensor]:
        data = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files]
        return [d.permute(1, 2, 0) for d in decode_jpeg(data, device="cuda")]

    out = {"torchvision-nvjpeg": torchvision_nvjpeg}
    try:
        from nvidia import nvimgcodec
    except ImportError:
        return out
    decoder = nvimgcodec.Decoder(options=":fancy_upsampling=1")
    params = nvimgcodec.DecodeParams(sample_format=nvimgcodec.SampleFormat.I_RGB, apply_exif_orientation=False)

    def nvimgcodec_fancy(files: list[bytes]) -> list[torch.Tensor]:
        stream = torch.cuda.current_stream().cuda_stream
        images = decoder.decode(files, params=params, cuda_stream=stream)
        return [torch.from_dlpack(im.to_dlpack(cuda_stream=stream)) for im in images]

    out["nvimgcodec-fancy"] = nvimgcodec_fancy
    return out


def _one_level_noise(model, ref: np.ndarray, cfg: PreprocessConfig, want: torch.Tensor) -> float:
    """The yardstick: the embedding change when 0.02% of the CPU decode's values move by one level (a random-weight
    tower amplifies small input changes; a decoder within one level of libjpeg cannot do better than this)."""
    rng = np.random.default_rng(0)
    noisy = ref.copy()
    flat = noisy.reshape(-1)
    idx = rng.choice(flat.size, max(1, flat.size // 5000), replace=False)
    flat[idx] = np.clip(flat[idx] + rng.choice([-1, 1], idx.size), 0, 255)
    image = preprocess_image(Image.fromarray(noisy.astype(np.uint8)), cfg)
    with torch.inference_mode():
        got = model(pack_images([image], pin_memory=True)).float()
    return float((got - want).norm() / want.norm())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_preprocess", description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--sizes", nargs="+", default=[f"{w}x{h}" for w, h in SIZES], help="WxH ...")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    decoders = gpu_decoders()
    cfg = PreprocessConfig.kimi_k25()
    model = random_encoder(PRESETS["kimi-k2.5"], torch.bfloat16, 0, "cuda")
    rows = []
    for width, height in (tuple(int(v) for v in size.split("x")) for size in args.sizes):
        files = [photo_like(width, height, seed) for seed in range(args.batch)]
        t0 = time.perf_counter()
        for _ in range(args.reps):
            cpu = [preprocess_image(decode_image(f, MediaLimits()).image, cfg) for f in files]
        cpu_ms = (time.perf_counter() - t0) * 1e3 / (args.reps * len(files))
        with torch.inference_mode():
            want = model(pack_images(cpu[:1], pin_memory=True)).float()
        ref = np.asarray(decode_image(files[0], MediaLimits()).image).astype(np.int16)
        floor = _one_level_noise(model, ref, cfg, want)
        for name, decode in decoders.items():
            decode(files[:1])  # warm-up: decoder state, handles
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.reps):
                gpu = [preprocess_tensor(d, cfg) for d in decode(files)]  # (H, W, 3) uint8 on the GPU each
            torch.cuda.synchronize()
            gpu_ms = (time.perf_counter() - t0) * 1e3 / (args.reps * len(files))
            pixels = decode(files[:1])[0].cpu().numpy().astype(np.int16)
            first = gpu[0]
            with torch.inference_mode():
                got = model(pack_images([type(first)(first.patches.cpu(), first.grid_hw, first.num_tokens)])).float()
            row = {
                "size": f"{width}x{height}",
                "decoder": name,
                "cpu_ms_per_image": cpu_ms,
                "gpu_ms_per_image": gpu_ms,
                "speedup": cpu_ms / gpu_ms,
                "decode_max_abs": int(np.abs(pixels - ref).max()),
                "decode_mean_abs": float(np.abs(pixels - ref).mean()),
                "embedding_rel_diff": float((got - want).norm() / want.norm()),
                "embedding_rel_diff_of_1_level_noise": floor,
            }
            rows.append(row)
            print(json.dumps(row))
    if args.json is not None:
        args.json.write_text(json.dumps({"bench": "gpu_preprocess", "batch": args.batch, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
