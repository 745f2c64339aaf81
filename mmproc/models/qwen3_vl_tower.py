"""The Qwen3-VL vision tower (Qwen3-VL, Qwen3.5, Qwen3.6) over a packed batch, and its head: the merger plus the
DeepStack mergers.

transformers 5.23 `Qwen3VLVisionModel` / `Qwen3_5MoeVisionModel`, reproduced with mmproc's blocks:
- patch embed: Conv3d(3, D, (2, 16, 16)) over a patch that holds its frame twice (a still image); the kernel's
  two temporal slices summed make it one Linear over the (3, 16, 16) patch.
- learned 48 x 48 position table (`nn.Embedding(2304, D)`), bilinear with align_corners=True per image.
- 2D RoPE in the rotate-half layout: channel j < dh/4 rotates by row * f_j, dh/4 <= j < dh/2 by column * f_(j-dh/4),
  each paired with j + dh/2. Permuting q's and k's channels per head at load (q.k is unchanged) turns it into
  the interleaved layout of mmproc/layers/rope.py, so the fused RoPE kernel serves both families.
- blocks: LayerNorm (eps 1e-6, bias), qkv and proj with bias, MLP linear_fc1 -> tanh GELU -> linear_fc2; no
  final norm (the merger norms).
- merger: LayerNorm(D) -> 2x2 shuffle -> fc1 -> erf GELU -> fc2; DeepStack mergers read the hidden states after
  `deepstack_layers` and norm after the shuffle (LayerNorm(4D)).
Patch order: the reference's processor emits patches in 2x2-window order; here they stay row-major per image and
the merge gather forms the same windows (attention is per image, so the order within an image is free).
A video of grid (t, h, w) attends per temporal slice, with the (h, w) positions of an image in each: packed as t
images of two-frame patches (mmproc/preprocess/qwen3_vl_video.py), it runs this tower unchanged.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import MutableMapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmproc.layers.add_norm import Norm, apply_norm
from mmproc.layers.fp8 import gelu_tanh_linear
from mmproc.layers.kernels import KernelOptions
from mmproc.layers.pos_emb import Learnable2DInterpPosEmb
from mmproc.layers.projector import PatchMergerMLP
from mmproc.layers.rope import build_rope_axis_table, gather_rope_axes, rope_axis_index
from mmproc.models.config import VisionConfig
from mmproc.models.tower_base import RopeTower, TowerInputs, TowerOutput

logger = logging.getLogger(__name__)

_ROPE_TABLE_STEP = 256  # the per-axis RoPE tables grow in steps of 256 positions
LN_EPS = 1e-6  # every LayerNorm of the tower and mergers


@functools.lru_cache(maxsize=8)
def rotate_half_to_interleaved(head_dim: int) -> Tensor:
    """(dh,) int64: new channel c of a head reads old channel perm[c] (module docstring)."""
    quarter, half = head_dim // 4, head_dim // 2
    perm = [c for k in range(quarter) for c in (quarter + k, quarter + k + half, k, k + half)]
    return torch.tensor(perm, dtype=torch.int64)


class PatchEmbed(nn.Module):
    """`proj`: Conv3d(3, D, (T, P, P)) as in the checkpoint; applied to one-frame patches (L, 3, P, P) (images) or
    T-frame patches (L, 3, T, P, P) (a video's temporal slices)."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        t, p = config.temporal_patch_size, config.patch_size
        self.proj = nn.Conv3d(3, config.hidden_size, kernel_size=(t, p, p), stride=(t, p, p), bias=True)

    def forward(self, pixels: Tensor) -> Tensor:
        # pixels (L, 3, P, P) or (L, 3, T, P, P) model dtype -> (L, D), one matmul. A still image repeats its frame
        # T times: the sum of the kernel's T slices is the same conv over one frame.
        weight = self.proj.weight if pixels.dim() == 5 else self.proj.weight.sum(dim=2)
        return F.linear(pixels.reshape(pixels.shape[0], -1), weight.reshape(self.proj.out_channels, -1), self.proj.bias)


class Attention(nn.Module):
    """`qkv` (D -> 3D) and `proj`; q and k rows are held in the interleaved RoPE order (permuted at load)."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = nn.Linear(d, 3 * d, bias=True)
        self.proj = nn.Linear(d, d, bias=True)
        self.register_load_state_dict_pre_hook(_permute_qk_rows)


def _permute_qk_rows(module: nn.Module, state: MutableMapping[str, Any], prefix: str, *args: object) -> None:
    """Checkpoint (rotate-half) -> internal (interleaved) order of q's and k's channels in each head."""
    assert isinstance(module, Attention)
    perm = rotate_half_to_interleaved(module.head_dim)
    for name in ("qkv.weight", "qkv.bias"):
        key = prefix + name
        tensor = state.get(key)
        if tensor is None or tensor.device.type == "meta":
            continue
        view = tensor.view(3, module.num_heads, module.head_dim, *tensor.shape[1:])  # (3, H, dh[, D])
        qk = view[:2].index_select(2, perm.to(tensor.device))
        state[key] = torch.cat((qk, view[2:])).view(tensor.shape)


class MLP(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=True)


class Block(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=LN_EPS)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=LN_EPS)
        self.attn = Attention(config)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, h: Tensor, next_norm: Norm | None, inputs: TowerInputs) -> tuple[Tensor, Tensor]:
        """x (L, D) residual stream, h = norm1(x) -> (x', next_norm(x')); without a next norm (the last block)
        (x', x'). The fused add_norm updates x in place: callers must not hold on to the x they pass in."""
        seq, kernels, attn = x.shape[0], inputs.kernels, self.attn
        q, k, v = attn.qkv(h).view(seq, 3, attn.num_heads, attn.head_dim).unbind(1)  # each (L, H, dh)
        q, k = kernels.rope_fn(q, k, inputs.cos, inputs.sin)
        o = kernels.attn_fn(q, k, v, inputs.attn)  # (L, H, dh)
        x, h = kernels.add_norm(x, attn.proj(o.reshape(seq, -1)), self.norm2)
        fc1, fc2 = self.mlp.linear_fc1, self.mlp.linear_fc2
        if isinstance(fc1, nn.Linear):
            y = fc2(kernels.fc0_gelu(h, fc1.weight, fc1.bias))
        else:  # quantized (mmproc/models/quantize.py): GELU fused into fc2's input
            y = gelu_tanh_linear(fc2, fc1(h))
        if next_norm is None:
            x = x + y
            return x, x
        return kernels.add_norm(x, y, next_norm)


class Qwen3VLTower(RopeTower):
    """Patch embed + position table + blocks; returns the last block's output and the DeepStack taps."""

    def __init__(self, config: VisionConfig, options: KernelOptions | None = None) -> None:
        super().__init__(config, options)
        self.patch_embed = PatchEmbed(config)
        self.pos_embed = Learnable2DInterpPosEmb(
            config.pos_emb_height, config.pos_emb_width, config.hidden_size, mode=config.pos_emb_mode, flat=True
        )
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self._rope: tuple[torch.device, Tensor, Tensor] | None = None  # (device, cos, sin), (N, dh/4) each

    def rope_index(self, device: torch.device, grid_hws: tuple[tuple[int, int], ...]) -> Tensor:
        # (2L,) int64 (column, row) per patch into the per-axis tables, grown here to the longest side
        side = max(max(h, w) for h, w in grid_hws)
        if side > self.config.rope_max_grid:
            raise ValueError(f"grid side {side} exceeds rope_max_grid {self.config.rope_max_grid}")
        if self._rope is None or self._rope[0] != device or self._rope[1].shape[0] < side:
            size = min(self.config.rope_max_grid, -(-side // _ROPE_TABLE_STEP) * _ROPE_TABLE_STEP)
            with torch.inference_mode(False), torch.no_grad():
                cos, sin = build_rope_axis_table(self.config.head_dim, size, self.config.rope_theta)
            self._rope = (device, cos.to(device), sin.to(device))
            logger.debug("built RoPE axis tables of %d positions on %s", size, device)
        return rope_axis_index(grid_hws)

    def rope_factors(self, device: torch.device, index: Tensor) -> tuple[Tensor, Tensor]:
        assert self._rope is not None and self._rope[0] == device, "rope_index builds the tables first"
        return gather_rope_axes(self._rope[1], self._rope[2], index)  # (L, dh/2) each

    def pos_tables(self, grid_hws: tuple[tuple[int, int], ...]) -> list[Tensor]:
        return self.pos_embed.tables(grid_hws)

    def forward(self, pixels: Tensor, inputs: TowerInputs) -> TowerOutput:
        # pixels (L, 3, P, P) model dtype -> last block's output (L, D) and one (L, D) tap per DeepStack level
        if inputs.frames:
            raise ValueError(f"{self.config.name}: video is not served by this tower yet")
        x = self.pos_embed.add_to_(self.patch_embed(pixels), inputs.grid_hws)
        blocks = list(self.blocks)
        h = apply_norm(x, blocks[0].norm1)
        next_norms: list[Norm | None] = [block.norm1 for block in blocks[1:]] + [None]
        taps = []
        for i, (block, next_norm) in enumerate(zip(blocks, next_norms, strict=True)):
            x, h = block(x, h, next_norm, inputs)
            if i in self.config.deepstack_layers:
                taps.append(x.clone())  # the next block's fused add updates x in place
        return TowerOutput(x, tuple(taps))


class DeepStackHead(nn.Module):
    """`merger` (norm before the shuffle) and `deepstack_merger_list` (norm after it), one per DeepStack level.
    Output row: [merger | level 0 | level 1 | ...], each `text_hidden_size` wide (vLLM's layout)."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        args = (config.hidden_size, config.merge_kernel_size, config.text_hidden_size, LN_EPS)
        self.width = config.text_hidden_size
        self.merger = PatchMergerMLP(*args, postshuffle_norm=False)
        self.deepstack_merger_list = nn.ModuleList(
            PatchMergerMLP(*args, postshuffle_norm=True) for _ in config.deepstack_layers
        )

    def forward(
        self, x: Tensor, merge_index: Tensor, out: Tensor | list[Tensor] | None = None, taps: tuple[Tensor, ...] = ()
    ) -> Tensor | None:
        """x (L, D), taps (L, D) per level, merge_index (T*kk,) -> (T, (1 + levels) * width), into `out` if given
        (a tensor, or consecutive row chunks of it)."""
        levels = list(self.deepstack_merger_list)
        if len(taps) != len(levels):
            raise ValueError(f"{len(taps)} DeepStack taps for {len(levels)} mergers")
        if not levels:
            return self.merger(x, merge_index, out)
        rows = merge_index.shape[0] // self.merger.kk
        dest = out if out is not None else x.new_empty(rows, self.width * (1 + len(levels)))
        for i, (merger, hidden) in enumerate(zip([self.merger, *levels], [x, *taps], strict=True)):
            _write_columns(merger(hidden, merge_index), dest, i * self.width)
        return None if isinstance(out, list) else dest


def _write_columns(y: Tensor, dest: Tensor | list[Tensor], col: int) -> None:
    """Copy y (T, W) into columns [col, col + W) of dest (T, ...), or of consecutive row chunks of it."""
    width = y.shape[1]
    if isinstance(dest, Tensor):
        dest[:, col : col + width].copy_(y)
        return
    start = 0
    for chunk in dest:
        chunk[:, col : col + width].copy_(y[start : start + chunk.shape[0]])
        start += chunk.shape[0]
