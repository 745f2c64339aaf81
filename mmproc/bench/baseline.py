"""The eager per-image baseline of `mmproc bench encoder`: MoonViT + projector as a straightforward port of the HF
Kimi-VL code (or SGLang's K3 port) runs it, per image and per layer, on the SAME weights as a `VisionEncoder`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mmproc.layers.projector import PostNormProjector
from mmproc.layers.rope import build_rope_table
from mmproc.models import VisionEncoder
from mmproc.models.tower import MoonViT, TransformerBlock
from mmproc.types import PackedBatch


class EagerBaseline:
    """Callable like a `VisionEncoder` on a `PackedBatch`: (num_tokens, text_hidden) in the model dtype."""

    @staticmethod
    def supports(model: VisionEncoder) -> bool:
        """A port of MoonViT: other towers (Qwen3-VL) run without a baseline."""
        return isinstance(model.tower, MoonViT)

    def __init__(self, model: VisionEncoder) -> None:
        self.model = model
        cfg = model.config
        cos, sin = build_rope_table(cfg.head_dim, cfg.rope_max_grid, cfg.rope_max_grid, cfg.rope_theta)
        self.freqs_cis = torch.complex(cos, sin).to(model.device)  # (Th, Tw, dh/2) complex64, built once

    @torch.inference_mode()
    def __call__(self, batch: PackedBatch) -> Tensor:
        model = self.model
        pixels = batch.pixel_values.to(model.device, non_blocking=True).to(model.dtype)  # (L, 3, P, P)
        outs = []
        offsets = batch.cu_seqlens.tolist()
        for (h, w), start, end in zip(batch.grid_hws, offsets[:-1], offsets[1:], strict=True):
            outs.append(self.image(pixels[start:end], h, w))
        return torch.cat(outs)

    def image(self, pixels: Tensor, h: int, w: int) -> Tensor:
        """pixels (h*w, 3, P, P) model dtype -> (h/kh * w/kw, text_hidden)."""
        model, tower = self.model, self.model.tower
        embed = tower.patch_embed
        x = embed.proj(pixels).flatten(1)  # Conv2d -> (L, D, 1, 1) -> (L, D)
        table = embed.pos_emb.weight  # (H0, W0, D), interpolated on every call like the reference
        mode = model.config.pos_emb_mode
        pos = F.interpolate(table.float().permute(2, 0, 1)[None], size=(h, w), mode=mode, align_corners=False)
        x = x + pos[0].permute(1, 2, 0).reshape(h * w, -1).to(x.dtype)
        freqs = self.freqs_cis[:h, :w].reshape(h * w, 1, -1)  # (L, 1, dh/2)
        for block in tower.encoder.blocks:
            x = _layer(block, x, freqs)
        x = tower.encoder.final_layernorm(x)
        kh, kw = model.config.merge_kernel_size
        d = x.shape[-1]
        x = x.view(h // kh, kh, w // kw, kw, d).permute(0, 2, 1, 3, 4).reshape(-1, kh * kw, d)  # (T, kk, D)
        proj = model.projector
        if isinstance(proj, PostNormProjector):  # K3: no pre-norm, RMSNorm after the MLP
            return proj.post_norm(proj.linear_2(F.gelu(proj.linear_1(x.reshape(x.shape[0], -1)))))
        x = proj.pre_norm(x).reshape(x.shape[0], -1)  # (T, kk*D)
        return proj.linear_2(F.gelu(proj.linear_1(x)))


def _rope(x: Tensor, freqs: Tensor) -> Tensor:
    # x (L, H, dh) -> rotated (L, H, dh) in x's dtype; the HF `apply_rope` with complex64 math.
    xc = torch.view_as_complex(x.float().view(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(-2).type_as(x)


def _layer(block: TransformerBlock, x: Tensor, freqs: Tensor) -> Tensor:
    seq = x.shape[0]
    qkv = block.wqkv(block.norm0(x)).view(seq, 3, block.num_heads, block.head_dim)
    q, k, v = (t.contiguous() for t in qkv.unbind(1))  # split copies, (L, H, dh) each
    q, k = _rope(q, freqs), _rope(k, freqs)
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None])
    x = x + block.wo(o[0].transpose(0, 1).reshape(seq, -1))
    return x + block.mlp(block.norm1(x))  # fc0, GELU (tanh unless the config says exact), fc1
