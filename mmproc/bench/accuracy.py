"""`mmproc bench accuracy`: how far fp8 (and bf16) embeddings are from float32, per family, on generated images.

Per preset: the same weights (random, seeded, or `--model-path`) in float32 (the reference), bf16, and bf16 with
FP8 linear layers; seeded photos, documents, screenshots and charts through the family's preprocessing. Reported
against float32 (and fp8 against bf16): cosine per token (mean, worst), per image (mean, worst), relative error
per image, and the share of tokens whose top-1 next token under a seeded random LM head is unchanged. On a CUDA
device of capability >= 8.9 fp8 runs the real kernels; elsewhere (or with --emulate) their math is emulated.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from mmproc.batching import pack_images
from mmproc.bench.accuracy_images import KINDS, accuracy_images
from mmproc.bench.provenance import git_commit, git_dirty
from mmproc.bench.workloads import random_encoder
from mmproc.models import PRESETS, VisionEncoder, load_encoder
from mmproc.models.quantize import KEEP, quantize_fp8
from mmproc.preprocess import PreprocessConfig, load_preprocess_config, preprocess_image

# The floor docs/benchmarks/fp8.md states for fp8 against float32 (issue 50): worst image, mean token.
FLOOR_IMAGE_WORST_COS = 0.995
FLOOR_TOKEN_MEAN_COS = 0.999
LM_VOCAB = 4096  # rows of the random LM head: enough that near-ties are rare, small enough for a CPU


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmproc bench accuracy", description=__doc__.split("\n")[0])
    p.add_argument("--presets", nargs="+", choices=sorted(PRESETS), default=["kimi-k2.5", "kimi-k3"])
    p.add_argument("--model-path", type=Path, default=None, help="a checkpoint instead of presets (real weights)")
    p.add_argument("--device", default="cuda", help="cuda[:N], or cpu (fp8 emulated; use tiny presets)")
    p.add_argument("--emulate", action="store_true", help="emulate the fp8 math even on a GPU that runs it")
    p.add_argument("--keep", nargs="*", default=[], metavar="NAME",
                   help="also keep these linears in bf16 (full names or last parts: wqkv wo mlp.fc0 mlp.fc1 "
                        "projector.linear_1): which layers cost the accuracy")  # fmt: skip
    p.add_argument("--per-kind", type=int, default=2, help="images of each kind: " + ", ".join(KINDS))
    p.add_argument("--max-side", type=int, default=None, help="scale the images down to this side (CPU runs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write machine-readable results here")
    return p.parse_args(argv)


def _models(args: argparse.Namespace, preset: str, device: torch.device) -> tuple[dict[str, VisionEncoder], str]:
    """float32, bfloat16 and fp8 (bf16 with FP8 linears) encoders with the same weights; how fp8 ran."""
    if args.model_path is not None:
        f32 = load_encoder(args.model_path, device=device, dtype=torch.float32)
        bf16 = load_encoder(args.model_path, device=device, dtype=torch.bfloat16)
    else:
        f32 = random_encoder(PRESETS[preset], torch.float32, args.seed, device)
        bf16 = random_encoder(PRESETS[preset], torch.bfloat16, args.seed, device)  # the same draws, rounded
    fp8 = copy.deepcopy(bf16)
    fast = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9) and not args.emulate
    quantize_fp8(fp8, emulate=not fast, keep=(*KEEP, *args.keep))
    return {"float32": f32, "bfloat16": bf16, "fp8": fp8}, ("kernels" if fast else "emulated")


def _embeddings(model: VisionEncoder, images, rules: PreprocessConfig) -> list[Tensor]:
    """Per image (tokens_i, text_hidden) float32 on the CPU, one packed batch in the model's dtype."""
    pre = [preprocess_image(image, rules) for _, image in images]
    pin = model.device.type == "cuda"
    batch = pack_images(pre, model.config.merge_kernel_size, pin_memory=pin, dtype=model.dtype)
    with torch.inference_mode():
        out = model(batch).float().cpu()
    return list(out.split(list(batch.token_counts)))


def compare(got: list[Tensor], want: list[Tensor], head: Tensor) -> dict[str, float]:
    """Cosine per token and per image, relative error per image, top-1 agreement under `head` (V, text_hidden)."""
    g, w = torch.cat(got).double(), torch.cat(want).double()
    token_cos = torch.nn.functional.cosine_similarity(g, w, dim=-1)
    image_cos = torch.stack([torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0)
                             for a, b in zip(got, want, strict=True)])  # fmt: skip
    rel = torch.stack([(a.double() - b.double()).norm() / b.double().norm() for a, b in zip(got, want, strict=True)])
    top1 = ((g @ head.T).argmax(-1) == (w @ head.T).argmax(-1)).double().mean()
    return {
        "token_cos_mean": token_cos.mean().item(),
        "token_cos_worst": token_cos.min().item(),
        "image_cos_mean": image_cos.mean().item(),
        "image_cos_worst": image_cos.min().item(),
        "image_rel_err_mean": rel.mean().item(),
        "image_rel_err_worst": rel.max().item(),
        "top1_unchanged": top1.item(),
        "tokens": int(g.shape[0]),
    }


def run_preset(args: argparse.Namespace, preset: str, device: torch.device, images) -> list[dict]:
    models, fp8_mode = _models(args, preset, device)
    config = models["float32"].config
    rules = (load_preprocess_config(args.model_path, config.family) if args.model_path is not None
             else PreprocessConfig.default_for(config.family))  # fmt: skip
    out = {name: _embeddings(model, images, rules) for name, model in models.items()}
    gen = torch.Generator().manual_seed(args.seed)
    head = torch.randn(LM_VOCAB, config.text_hidden_size, generator=gen, dtype=torch.float64)
    rows = []
    for name, ref in (("bfloat16", "float32"), ("fp8", "float32"), ("fp8", "bfloat16")):
        row = {"preset": config.name, "family": config.family, "model": name, "reference": ref}
        row |= compare(out[name], out[ref], head)
        if name == "fp8":
            row["fp8_mode"] = fp8_mode
        if (name, ref) == ("fp8", "float32"):
            row["meets_floor"] = (row["image_cos_worst"] >= FLOOR_IMAGE_WORST_COS
                                  and row["token_cos_mean"] >= FLOOR_TOKEN_MEAN_COS)  # fmt: skip
        rows.append(row)
    for kind in KINDS:  # fp8 against float32 per kind of image: where the cost lands
        pick = [i for i, (k, _) in enumerate(images) if k == kind]
        if pick:
            fp8 = compare([out["fp8"][i] for i in pick], [out["float32"][i] for i in pick], head)
            rows.append({"preset": config.name, "family": config.family, "model": "fp8", "reference": "float32",
                         "kind": kind, **fp8})  # fmt: skip
    del models
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def _line(r: dict) -> str:
    what = f"{r['model']} vs {r['reference']}" + (f" [{r['kind']}]" if "kind" in r else "")
    floor = "" if "meets_floor" not in r else ("  floor: MET" if r["meets_floor"] else "  floor: NOT MET")
    return (f"{r['preset']:>10} {what:>30} {r['token_cos_mean']:.6f} {r['token_cos_worst']:.6f} "
            f"{r['image_cos_mean']:.6f} {r['image_cos_worst']:.6f} {r['image_rel_err_mean']:.4f} "
            f"{r['image_rel_err_worst']:.4f} {r['top1_unchanged']:7.2%}{floor}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("mmproc bench accuracy: no CUDA GPU here; use --device cpu with tiny presets", file=sys.stderr)
        return 2
    presets = [args.model_path.name] if args.model_path is not None else args.presets
    images = accuracy_images(args.seed, args.per_kind, args.max_side)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.machine()})"
    kept = ", ".join((*KEEP, *args.keep))
    print(f"# {where} | torch {torch.__version__} | fp8 keeps {kept} in bf16 | {len(images)} images ({args.per_kind} per kind: "
          f"{', '.join(KINDS)}) seed {args.seed} | floor: worst image cos >= {FLOOR_IMAGE_WORST_COS}, "
          f"mean token cos >= {FLOOR_TOKEN_MEAN_COS} (fp8 vs float32)")  # fmt: skip
    print(f"{'preset':>10} {'model vs reference':>30} {'tok_cos':>8} {'tok_min':>8} {'img_cos':>8} {'img_min':>8} "
          f"{'rel_err':>6} {'rel_max':>6} {'top1_eq':>7}")  # fmt: skip
    rows = []
    for preset in presets:
        found = run_preset(args, preset, device, images)
        for r in found:
            print(_line(r))
        rows += found
    if args.json is not None:
        record = {
            "bench": "accuracy",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": git_commit() or "unknown",
            "dirty": git_dirty(),
            "command": ["mmproc", "bench", "accuracy", *(sys.argv[1:] if argv is None else argv)],
            "device": where,
            "torch": torch.__version__,
            "weights": str(args.model_path) if args.model_path is not None else f"random (seed {args.seed})",
            "fp8_keep": [*KEEP, *args.keep],
            "floor": {"image_cos_worst": FLOOR_IMAGE_WORST_COS, "token_cos_mean": FLOOR_TOKEN_MEAN_COS},
            "results": rows,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
