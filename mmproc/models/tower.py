"""The MoonViT vision tower over a packed batch (Kimi-VL `MoonVitPretrainedModel`, K2.5 and K3 `MoonViT3d`); what
differs between the Kimi families is read from `VisionConfig`. `moonvit_head` builds their projector.

Parameter names equal the checkpoint's `vision_tower.*` names. Pre-norm blocks; each residual add is paired with
the norm that reads its result (the MLP's with the NEXT block's norm0), so a block takes and returns
(x, norm(x)). Fast paths: mmproc/layers/kernels.py.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmproc.layers.add_norm import Norm, apply_norm, make_norm
from mmproc.layers.fp8 import gelu_tanh_linear
from mmproc.layers.kernels import KernelOptions, LinearGeluFn, linear_gelu_tanh
from mmproc.layers.pos_emb import Learnable2DInterpPosEmb
from mmproc.layers.projector import PROJECTORS
from mmproc.layers.rope import build_rope_table, gather_rope, rope_row_index
from mmproc.layers.temporal import temporal_pool, time_embedding_table
from mmproc.models.config import VisionConfig
from mmproc.models.tower_base import RopeTower, TowerInputs, TowerOutput

logger = logging.getLogger(__name__)

_ROPE_TABLE_STEP = 64  # the lazily built RoPE table grows in steps of 64 patches per side

__all__ = ["KernelOptions", "MoonViT", "TowerInputs", "TowerOutput"]


class PatchEmbed(nn.Module):
    """Conv2d(3, D, P, stride=P) on (L, 3, P, P) patches == a Linear over the 3*P*P flattened inputs."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        p = config.patch_size
        self.proj = nn.Conv2d(3, config.hidden_size, kernel_size=p, stride=p, bias=config.patch_embed_bias)
        self.pos_emb = Learnable2DInterpPosEmb(
            config.pos_emb_height, config.pos_emb_width, config.hidden_size, mode=config.pos_emb_mode
        )

    def forward(self, pixels: Tensor, grid_hws: tuple[tuple[int, int], ...]) -> Tensor:
        # pixels (L, 3, P, P) model dtype -> (L, D). The conv kernel covers the whole patch: one matmul.
        weight = self.proj.weight.reshape(self.proj.out_channels, -1)  # (D, 3*P*P), a view
        x = F.linear(pixels.reshape(pixels.shape[0], -1), weight, self.proj.bias)
        return self.pos_emb.add_to_(x, grid_hws)  # per run of equal sizes, in place: no (L, D) concatenation


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, *, bias: bool, exact_gelu: bool) -> None:
        super().__init__()
        self.fc0 = nn.Linear(dim, hidden, bias=bias)
        self.fc1 = nn.Linear(hidden, dim, bias=bias)
        self.exact_gelu = exact_gelu

    def forward(self, x: Tensor, fc0_gelu: LinearGeluFn = linear_gelu_tanh) -> Tensor:
        # x (L, D) -> (L, D). The towers use gelu_pytorch_tanh (the projectors use exact GELU).
        if self.exact_gelu:
            return self.fc1(F.gelu(self.fc0(x)))
        if not isinstance(self.fc0, nn.Linear):  # quantized (mmproc/models/quantize.py): GELU fused into fc1's input
            return gelu_tanh_linear(self.fc1, self.fc0(x))
        return self.fc1(fc0_gelu(x, self.fc0.weight, self.fc0.bias))


class TransformerBlock(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        d, width = config.hidden_size, config.qkv_width
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.norm0 = make_norm(config.norm, d, config.norm_eps)
        self.norm1 = make_norm(config.norm, d, config.norm_eps)
        self.wqkv = nn.Linear(d, 3 * width, bias=config.attn_bias)
        self.wo = nn.Linear(width, d, bias=config.attn_bias)
        exact = config.activation == "gelu"
        self.mlp = MLP(d, config.intermediate_size, bias=config.mlp_bias, exact_gelu=exact)

    def forward(self, x: Tensor, h: Tensor, next_norm: Norm, inputs: TowerInputs) -> tuple[Tensor, Tensor]:
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


class TransformerBlocks(nn.Module):
    """The tower's stack of blocks and its final norm."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TransformerBlock(config) for _ in range(config.num_layers))
        self.final_layernorm = make_norm(config.norm, config.hidden_size, config.norm_eps)

    def forward(self, x: Tensor, inputs: TowerInputs) -> Tensor:
        # x (L, D) embedded patches (updated in place by the fused path) -> final_layernorm(last block) (L, D)
        blocks = list(self.blocks)
        h = apply_norm(x, blocks[0].norm0)  # the only norm without a residual add in front of it
        next_norms = [block.norm0 for block in blocks[1:]] + [self.final_layernorm]
        for block, next_norm in zip(blocks, next_norms, strict=True):
            x, h = block(x, h, next_norm, inputs)
        return h


class MoonViT(RopeTower):
    """Patch embedding + encoder. Holds lazily built caches: the RoPE table, the time table and (in the base) the
    kernel choice. RoPE layout: one (h, w) table, interleaved pairs (mmproc/layers/rope.py)."""

    def __init__(self, config: VisionConfig, options: KernelOptions | None = None) -> None:
        super().__init__(config, options)
        self.patch_embed = PatchEmbed(config)
        self.encoder = TransformerBlocks(config)  # `encoder`: the checkpoints' name (vision_tower.encoder.*)
        self._rope: tuple[torch.device, Tensor, Tensor] | None = None  # (device, cos, sin)
        self._time: Tensor | None = None  # (pos_emb_time + 1, D) in the model's device and dtype

    def time_table(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        """The fixed time embedding (pos_emb_time + 1, D), made on first use (not a buffer: the model is built on
        `meta` and its tensors assigned from the checkpoint, which has none for it)."""
        if self.config.pos_emb_time < 1:
            raise ValueError(f"{self.config.name}: this tower takes no video")
        if self._time is None or self._time.device != device or self._time.dtype != dtype:
            with torch.inference_mode(False), torch.no_grad():
                table = time_embedding_table(self.config.pos_emb_time, self.config.hidden_size)
                self._time = table.to(device=device, dtype=dtype)
        return self._time

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

    def rope_index(self, device: torch.device, grid_hws: tuple[tuple[int, int], ...]) -> Tensor:
        # (L,) int64: flat rows of the (Th * Tw, dh/2) table
        cos, _ = self.rope_table(device, max(h for h, _ in grid_hws), max(w for _, w in grid_hws))
        return rope_row_index(grid_hws, cos.shape[1])

    def rope_factors(self, device: torch.device, index: Tensor) -> tuple[Tensor, Tensor]:
        assert self._rope is not None and self._rope[0] == device, "rope_index builds the table first"
        return gather_rope(self._rope[1], self._rope[2], index)  # (L, dh/2) each

    def pos_tables(self, grid_hws: tuple[tuple[int, int], ...]) -> list[Tensor]:
        return self.patch_embed.pos_emb.tables(grid_hws)

    def forward(self, pixels: Tensor, inputs: TowerInputs) -> TowerOutput:
        # pixels (L, 3, P, P) in model dtype on the model device -> hidden states (L', D): a video chunk's frames
        # averaged after the final norm (K2.5 sd2_tpool, mmproc/layers/temporal.py), so L' = sum h*w per item.
        x = self.patch_embed(pixels, inputs.grid_hws)
        if inputs.time_index is not None:
            x.add_(self.time_table(x.device, x.dtype)[inputs.time_index])  # (L, D) gather: video frames only
        hidden = self.encoder(x, inputs)
        if inputs.frames:
            hidden = temporal_pool(hidden, inputs.item_grids, inputs.frames)  # a chunk costs one frame's tokens
        return TowerOutput(hidden)


def moonvit_head(config: VisionConfig) -> nn.Module:
    """The projector `config.projector` names (mmproc/layers/projector.py)."""
    return PROJECTORS[config.projector](
        config.hidden_size, config.merge_kernel_size, config.text_hidden_size, config.projector_ln_eps
    )


def _round_up(n: int) -> int:
    return -(-n // _ROPE_TABLE_STEP) * _ROPE_TABLE_STEP
