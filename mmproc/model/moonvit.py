"""The MoonViT vision tower (Kimi-VL `MoonVitPretrainedModel`; K2.5 `MoonViT3d` for t == 1) over a packed batch.

Parameter names equal the checkpoint's `vision_tower.*` names: patch_embed.proj / patch_embed.pos_emb,
encoder.blocks.{i}.{norm0,norm1,wqkv,wo,mlp.fc0,mlp.fc1}, encoder.final_layernorm.

Per block (pre-LN, LayerNorm eps 1e-5):
    x = x + wo(attn(rope(wqkv(norm0(x)))))        wqkv output viewed as (L, 3, H, dh)
    x = x + mlp.fc1(gelu_tanh(mlp.fc0(norm1(x))))
and `final_layernorm(x)` after the last block. The code computes the same thing with every residual add paired
with the LayerNorm that reads its result: (x, h) = add_norm(x, wo(...), norm1), then the MLP residual with the
NEXT block's norm0 (or final_layernorm), so a block takes and returns (x, norm(x)).

Optional fast paths (`KernelOptions`, fixed at construction; each with a plain fallback): fused Triton RoPE,
a varlen attention kernel, fc0 + bias + GELU(tanh) as one cuBLASLt matmul with a GELU epilogue, and the
residual add + LayerNorm as one Triton kernel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmproc.model import rope_triton
from mmproc.model.add_norm import AddNormFn, add_layer_norm, select_add_norm
from mmproc.model.attention import LONG_SEGMENT, AttentionFn, VarlenMeta, select_attention
from mmproc.model.config import VisionConfig
from mmproc.model.pos_emb import Learnable2DInterpPosEmb
from mmproc.model.rope import apply_rope, build_rope_table

logger = logging.getLogger(__name__)

_ROPE_TABLE_STEP = 64  # the lazily built RoPE table grows in steps of 64 patches per side

# (q, k, cos, sin) -> rotated (q, k); q/k are views of the wqkv output and may be rotated in place.
RopeFn = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def _fused_rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    rope_triton.apply_rope_(q, k, cos, sin)  # in place, one launch for q and k
    return q, k


def select_rope(device: torch.device) -> tuple[str, RopeFn]:
    """Fused Triton RoPE on CUDA when available, else the plain `apply_rope` (same math, float32)."""
    if device.type == "cuda" and rope_triton.available():
        return "triton", _fused_rope
    return "eager", apply_rope


# (x (L, D_in), weight (D_out, D_in), bias (D_out,)) -> gelu_tanh(x @ weight.T + bias) (L, D_out)
LinearGeluFn = Callable[[Tensor, Tensor, Tensor], Tensor]


def linear_gelu_tanh(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Plain path: matmul (+ bias in the epilogue), then a separate GELU(tanh) pass over the (L, D_out) output."""
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def addmm_gelu_tanh(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Fused path: cuBLASLt's GELU_BIAS epilogue (the tanh approximation, on the float32 accumulator), so the
    (L, D_out) output is written once instead of written, read and written again."""
    return torch._addmm_activation(bias, x, weight.t(), use_gelu=True)


@dataclass(frozen=True)
class KernelOptions:
    """Which optional fast paths the tower may use where the device/dtype allows; chosen once, never per call.

    fused_rope: Triton RoPE (CUDA). fused_gelu: cuBLASLt bias+GELU epilogue for mlp.fc0 (CUDA, fp16/bf16).
    uniform_attention: a batch of equal-size images runs one batched SDPA call instead of the varlen kernel.
    long_segment: patches from which a segment leaves the varlen kernel for its own SDPA call.
    sdpa_backend: "auto" or the SDPA backend to try first ("cudnn", "flash", "efficient"; CUDA only).
    fused_add_norm: each residual add and the LayerNorm after it as one Triton kernel (CUDA).
    attention_streams: CUDA streams the per-segment attention calls of a mixed batch are spread over (1: none).
    Defaults measured on an H200 (docs/benchmarks/encoder.md): uniform_attention +3-7% end to end.
    """

    fused_rope: bool = True
    fused_gelu: bool = True
    uniform_attention: bool = True
    long_segment: int = LONG_SEGMENT
    sdpa_backend: str = "auto"
    fused_add_norm: bool = True
    attention_streams: int = 1


@dataclass(frozen=True)
class Kernels:
    """The functions selected for one (device, dtype) under `KernelOptions`, with names for logs and benches."""

    attn_fn: AttentionFn
    rope_fn: RopeFn
    fc0_gelu: LinearGeluFn
    add_norm: AddNormFn
    names: tuple[str, str, str, str]  # (attention, rope, fc0+gelu, add+norm)


def select_kernels(
    device: torch.device, dtype: torch.dtype, num_heads: int, head_dim: int, options: KernelOptions
) -> Kernels:
    attn_name, attn_fn = select_attention(
        device,
        dtype,
        num_heads,
        head_dim,
        long_segment=options.long_segment,
        uniform_batched=options.uniform_attention,
        sdpa_backend=options.sdpa_backend,
        streams=options.attention_streams,
    )
    rope_name, rope_fn = select_rope(device) if options.fused_rope else ("eager", apply_rope)
    fused_gelu = options.fused_gelu and device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
    gelu_name, gelu_fn = ("addmm_gelu", addmm_gelu_tanh) if fused_gelu else ("eager", linear_gelu_tanh)
    width = num_heads * head_dim
    norm_name, norm_fn = select_add_norm(device, dtype, width) if options.fused_add_norm else ("eager", add_layer_norm)
    return Kernels(attn_fn, rope_fn, gelu_fn, norm_fn, (attn_name, rope_name, gelu_name, norm_name))


@dataclass(frozen=True)
class TowerInputs:
    """Per-batch inputs of the tower, all on the compute device except the Python-int metadata.

    cos, sin: (L, dh/2) float32 RoPE factors per patch. attn: segment metadata. kernels: the functions chosen
    for this device and dtype.
    """

    grid_hws: tuple[tuple[int, int], ...]
    cos: Tensor
    sin: Tensor
    attn: VarlenMeta
    kernels: Kernels


class PatchEmbed(nn.Module):
    """Conv2d(3, D, P, stride=P) on (L, 3, P, P) patches == a Linear over the 3*P*P flattened inputs."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        p = config.patch_size
        self.proj = nn.Conv2d(3, config.hidden_size, kernel_size=p, stride=p)  # weight (D, 3, P, P)
        self.pos_emb = Learnable2DInterpPosEmb(config.pos_emb_height, config.pos_emb_width, config.hidden_size)

    def forward(self, pixels: Tensor, grid_hws: tuple[tuple[int, int], ...]) -> Tensor:
        # pixels (L, 3, P, P) model dtype -> (L, D). The conv kernel covers the whole patch: one matmul.
        weight = self.proj.weight.reshape(self.proj.out_channels, -1)  # (D, 3*P*P), a view
        x = F.linear(pixels.reshape(pixels.shape[0], -1), weight, self.proj.bias)
        return self.pos_emb.add_to_(x, grid_hws)  # per run of equal sizes, in place: no (L, D) concatenation


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc0 = nn.Linear(dim, hidden)
        self.fc1 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor, fc0_gelu: LinearGeluFn = linear_gelu_tanh) -> Tensor:
        # x (L, D) -> (L, D). Kimi-VL uses gelu_pytorch_tanh in the tower (the projector uses exact GELU).
        return self.fc1(fc0_gelu(x, self.fc0.weight, self.fc0.bias))


class EncoderLayer(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.norm0 = nn.LayerNorm(d, eps=1e-5)
        self.norm1 = nn.LayerNorm(d, eps=1e-5)
        self.wqkv = nn.Linear(d, 3 * d)
        self.wo = nn.Linear(d, d)
        self.mlp = MLP(d, config.intermediate_size)

    def forward(self, x: Tensor, h: Tensor, next_norm: nn.LayerNorm, inputs: TowerInputs) -> tuple[Tensor, Tensor]:
        """x (L, D) residual stream and h = norm0(x) (L, D) -> (x', next_norm(x')) with x' this block's output.

        The fused add_norm updates x in place: callers must not hold on to the x they pass in.
        """
        seq = x.shape[0]
        qkv = self.wqkv(h).view(seq, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.unbind(1)  # each (L, H, dh)
        kernels = inputs.kernels
        q, k = kernels.rope_fn(q, k, inputs.cos, inputs.sin)
        attn = kernels.attn_fn(q, k, v, inputs.attn)  # (L, H, dh)
        x, h = kernels.add_norm(x, self.wo(attn.reshape(seq, -1)), self.norm1)
        return kernels.add_norm(x, self.mlp(h, kernels.fc0_gelu), next_norm)


class Encoder(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_layers))
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=1e-5)

    def forward(self, x: Tensor, inputs: TowerInputs) -> Tensor:
        # x (L, D) embedded patches (updated in place by the fused path) -> final_layernorm(last block) (L, D)
        blocks = list(self.blocks)
        h = blocks[0].norm0(x)  # the only LayerNorm without a residual add in front of it
        next_norms = [block.norm0 for block in blocks[1:]] + [self.final_layernorm]
        for block, next_norm in zip(blocks, next_norms, strict=True):
            x, h = block(x, h, next_norm, inputs)
        return h


class MoonViT(nn.Module):
    """Patch embedding + encoder. Holds two lazily built caches: the RoPE table and the attention backend."""

    def __init__(self, config: VisionConfig, options: KernelOptions | None = None) -> None:
        super().__init__()
        self.config = config
        self.options = options or KernelOptions()
        self.patch_embed = PatchEmbed(config)
        self.encoder = Encoder(config)
        self._rope: tuple[torch.device, Tensor, Tensor] | None = None  # (device, cos, sin)
        self._kernels: tuple[tuple[torch.device, torch.dtype], Kernels] | None = None

    def set_options(self, **changes: object) -> KernelOptions:
        """Switch fast paths (benchmarks, tests); the kernels are selected again on the next forward."""
        self.options = replace(self.options, **changes)
        self._kernels = None
        return self.options

    def rope_table(self, device: torch.device, max_h: int, max_w: int) -> tuple[Tensor, Tensor]:
        """cos, sin (Th, Tw, dh/2) float32 on `device` covering a max_h x max_w grid (grown on demand)."""
        cfg = self.config
        if max_h > cfg.rope_max_grid or max_w > cfg.rope_max_grid:
            raise ValueError(f"grid {(max_h, max_w)} exceeds rope_max_grid {cfg.rope_max_grid}")
        if self._rope is not None:
            dev, cos, sin = self._rope
            if dev == device and cos.shape[0] >= max_h and cos.shape[1] >= max_w:
                return cos, sin
        have_h, have_w = (0, 0) if self._rope is None else self._rope[1].shape[:2]
        th = min(cfg.rope_max_grid, max(have_h, _round_up(max_h)))
        tw = min(cfg.rope_max_grid, max(have_w, _round_up(max_w)))
        with torch.inference_mode(False), torch.no_grad():
            cos, sin = build_rope_table(cfg.head_dim, th, tw, cfg.rope_theta)
            cos, sin = cos.to(device), sin.to(device)
        logger.debug("built RoPE table %dx%d on %s", th, tw, device)
        self._rope = (device, cos, sin)
        return cos, sin

    def kernels(self, device: torch.device, dtype: torch.dtype) -> Kernels:
        """Attention, RoPE and fc0+GELU implementations for this device/dtype, selected once and then reused."""
        key = (device, dtype)
        if self._kernels is None or self._kernels[0] != key:
            cfg = self.config
            kernels = select_kernels(device, dtype, cfg.num_heads, cfg.head_dim, self.options)
            logger.info(
                "kernels on %s/%s: attention %s, RoPE %s, fc0+GELU %s, add+LayerNorm %s", device, dtype, *kernels.names
            )
            self._kernels = (key, kernels)
        return self._kernels[1]

    def forward(self, pixels: Tensor, inputs: TowerInputs) -> Tensor:
        # pixels (L, 3, P, P) in model dtype on the model device -> hidden states (L, D)
        x = self.patch_embed(pixels, inputs.grid_hws)
        return self.encoder(x, inputs)


def _round_up(n: int) -> int:
    return -(-n // _ROPE_TABLE_STEP) * _ROPE_TABLE_STEP
