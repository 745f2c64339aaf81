"""The MoonViT vision tower (Kimi-VL `MoonVitPretrainedModel`; K2.5 `MoonViT3d` for t == 1) over a packed batch.

Parameter names equal the checkpoint's `vision_tower.*` names: patch_embed.proj / patch_embed.pos_emb,
encoder.blocks.{i}.{norm0,norm1,wqkv,wo,mlp.fc0,mlp.fc1}, encoder.final_layernorm.

Per block (pre-LN, LayerNorm eps 1e-5):
    x = x + wo(attn(rope(wqkv(norm0(x)))))        wqkv output viewed as (L, 3, H, dh)
    x = x + mlp.fc1(gelu_tanh(mlp.fc0(norm1(x))))
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmproc.model import rope_triton
from mmproc.model.attention import AttentionFn, VarlenMeta, select_attention
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


@dataclass(frozen=True)
class TowerInputs:
    """Per-batch inputs of the tower, all on the compute device except the Python-int metadata.

    cos, sin: (L, dh/2) float32 RoPE factors per patch. attn: segment metadata. attn_fn, rope_fn: the kernels
    chosen for this device and dtype.
    """

    grid_hws: tuple[tuple[int, int], ...]
    cos: Tensor
    sin: Tensor
    attn: VarlenMeta
    attn_fn: AttentionFn
    rope_fn: RopeFn


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
        return x.add_(self.pos_emb(grid_hws))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc0 = nn.Linear(dim, hidden)
        self.fc1 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        # Kimi-VL uses gelu_pytorch_tanh in the tower (the projector uses exact GELU).
        return self.fc1(F.gelu(self.fc0(x), approximate="tanh"))


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

    def forward(self, x: Tensor, inputs: TowerInputs) -> Tensor:
        # x (L, D) -> (L, D)
        seq = x.shape[0]
        qkv = self.wqkv(self.norm0(x)).view(seq, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.unbind(1)  # each (L, H, dh)
        q, k = inputs.rope_fn(q, k, inputs.cos, inputs.sin)
        attn = inputs.attn_fn(q, k, v, inputs.attn)  # (L, H, dh)
        x = x + self.wo(attn.reshape(seq, -1))
        return x + self.mlp(self.norm1(x))


class Encoder(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_layers))
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=1e-5)

    def forward(self, x: Tensor, inputs: TowerInputs) -> Tensor:
        for block in self.blocks:
            x = block(x, inputs)
        return self.final_layernorm(x)


class MoonViT(nn.Module):
    """Patch embedding + encoder. Holds two lazily built caches: the RoPE table and the attention backend."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.encoder = Encoder(config)
        self._rope: tuple[torch.device, Tensor, Tensor] | None = None  # (device, cos, sin)
        self._kernels: tuple[tuple[torch.device, torch.dtype], AttentionFn, RopeFn] | None = None

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

    def kernels(self, device: torch.device, dtype: torch.dtype) -> tuple[AttentionFn, RopeFn]:
        """Attention backend and RoPE implementation for this device/dtype, selected once and then reused."""
        key = (device, dtype)
        if self._kernels is None or self._kernels[0] != key:
            _, attn_fn = select_attention(device, dtype, self.config.num_heads, self.config.head_dim)
            rope_name, rope_fn = select_rope(device)
            logger.info("RoPE: %s on %s", rope_name, device)
            self._kernels = (key, attn_fn, rope_fn)
        return self._kernels[1], self._kernels[2]

    def forward(self, pixels: Tensor, inputs: TowerInputs) -> Tensor:
        # pixels (L, 3, P, P) in model dtype on the model device -> hidden states (L, D)
        x = self.patch_embed(pixels, inputs.grid_hws)
        return self.encoder(x, inputs)


def _round_up(n: int) -> int:
    return -(-n // _ROPE_TABLE_STEP) * _ROPE_TABLE_STEP
