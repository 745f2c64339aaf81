"""Weight quantization of a loaded encoder, in place, for every family: each `nn.Linear` (attention qkv and
output, MLP, merger/projector) becomes an `Fp8Linear` (mmproc/layers/fp8.py), chosen by module type, never by
family. Norms, the patch embedding (a Conv), position tables, attention and the residual stream keep the model
dtype. Figures and the accuracy floor: docs/benchmarks/fp8.md.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from mmproc.errors import ConfigError
from mmproc.layers.fp8 import EMULATED, Fp8Kernels, Fp8Linear, select_fp8_kernels

logger = logging.getLogger(__name__)

QUANTIZATIONS = ("none", "fp8")
FP8_MIN_CAPABILITY = (8, 9)  # e4m3 tensor cores: Ada (sm_89), Hopper (sm_90) and later
FP8_DTYPES = (torch.bfloat16,)  # the row-wise scaled matmul writes bf16 only
# The output projection writes the embedding itself, straight into its destination (projector._linear_into), and
# names the encoder's dtype; about 2% of the FLOPs. It stays in the model dtype.
KEEP = ("projector.linear_2",)
_ALIGN = 16  # torch._scaled_mm: K and N multiples of 16


def check_fp8_device(device: torch.device | str, dtype: torch.dtype) -> None:
    """ConfigError unless FP8 matmuls can run here: a CUDA device of compute capability >= 8.9 and a bf16 model."""
    device = torch.device(device)
    need = "a CUDA device of compute capability >= 8.9 (Ada, Hopper or later)"
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ConfigError(f"quantization fp8 needs {need}; the model is on {device}")
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise ConfigError(f"quantization fp8 needs {need}; {device} is {name} ({capability[0]}.{capability[1]})")
    if dtype not in FP8_DTYPES:
        raise ConfigError(f"quantization fp8 needs dtype bfloat16, got {str(dtype).removeprefix('torch.')}")


def quantize_fp8(model: nn.Module, *, emulate: bool = False, keep: tuple[str, ...] = KEEP) -> list[str]:
    """Replace every eligible `nn.Linear` of `model` by an `Fp8Linear`, in place; returns the replaced names.

    emulate: the CPU/any-device emulation of the FP8 math (tests, `bench accuracy`), never for serving. Otherwise
    ConfigError unless `check_fp8_device` passes. Eligible: not in `keep` (a full name, or a name's last parts:
    "wo" keeps every block's attention output), in and out features multiples of 16 (the scaled matmul's
    alignment); the others stay in the model dtype and are logged.
    """
    suffixes = tuple("." + k for k in keep)
    param = next(model.parameters())
    if emulate:
        kernels: Fp8Kernels = EMULATED
    else:
        check_fp8_device(param.device, param.dtype)
        kernels = select_fp8_kernels(param.device, param.dtype)
    replaced, skipped = [], []
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Linear or name in keep or name.endswith(suffixes):
            continue
        if module.in_features % _ALIGN or module.out_features % _ALIGN:
            skipped.append(name)
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, Fp8Linear.from_linear(module, kernels))
        replaced.append(name)
    if skipped:
        logger.warning("fp8: %d linear layers stay %s (features not multiples of 16): %s", len(skipped), param.dtype,
                       ", ".join(skipped))  # fmt: skip
    logger.info("fp8: %d linear layers quantized (kernels: quantize %s, matmul %s); kept %s", len(replaced),
                *kernels.names, ", ".join(keep) or "none")  # fmt: skip
    return replaced


def apply_quantization(model: nn.Module, quantization: str) -> nn.Module:
    """The start-up step after loading: "none" leaves the model alone, "fp8" quantizes it (or ConfigError)."""
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    if quantization == "fp8":
        quantize_fp8(model)
        torch.cuda.empty_cache()  # the bf16 weights just freed (quantize_fp8 checked the model is on CUDA)
    return model
