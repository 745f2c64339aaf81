"""An independent re-implementation of the published Hugging Face modules (Kimi-VL `modeling_kimi_vl.py`,
Kimi K2.5 `MoonViT3d` + `PatchMergerMLP`), written the way they are written there: per-image Python loops,
a complex (512, 512, dh/2) RoPE table used through `torch.view_as_complex`, `F.interpolate` per image, a
block-diagonal attention mask, a Python-loop patch merger, and module names equal to the checkpoint names.

It must not import `mmproc.models`: it is the yardstick for it. Slow by design; tests only.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Learnable2DInterpPosEmb(nn.Module):
    def __init__(self, height: int, width: int, dim: int) -> None:
        super().__init__()
        self.height, self.width = height, width
        self.weight = nn.Parameter(torch.empty(height, width, dim))

    def interp(self, h: int, w: int) -> torch.Tensor:
        if (h, w) == (self.height, self.width):
            return self.weight.flatten(end_dim=1)
        resized = F.interpolate(self.weight.permute((2, 0, 1)).unsqueeze(0), size=(h, w), mode="bicubic")
        return resized.squeeze(0).permute((1, 2, 0)).flatten(end_dim=1)

    def forward(self, x: torch.Tensor, grid_hws: torch.Tensor) -> torch.Tensor:
        return x + torch.cat([self.interp(h, w) for h, w in grid_hws.tolist()])


def get_1d_sincos_pos_embed(embed_dim: int, t_size: int) -> np.ndarray:
    omega = np.arange(embed_dim // 2, dtype=np.float32) / (embed_dim / 2.0)
    omega = 1.0 / 10000**omega
    out = np.einsum("m,d->md", np.arange(t_size, dtype=np.float32), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


class Learnable2DInterpPosEmbDividedFixed(Learnable2DInterpPosEmb):
    """K2.5: the same learnable 2D table plus a fixed sincos time embedding, added only when t > 1."""

    def __init__(self, height: int, width: int, num_frames: int, dim: int) -> None:
        super().__init__(height, width, dim)
        time_weight = torch.from_numpy(get_1d_sincos_pos_embed(dim, num_frames)).float().unsqueeze(1)
        self.register_buffer("time_weight", time_weight, persistent=False)

    def forward(self, x: torch.Tensor, grid_thws: torch.Tensor) -> torch.Tensor:
        pos_embs = []
        for t, h, w in grid_thws.tolist():
            pos_emb_2d = self.interp(h, w)
            if t == 1:
                pos_embs.append(pos_emb_2d)
            else:
                pos_embs.append((pos_emb_2d.unsqueeze(0).repeat(t, 1, 1) + self.time_weight[0:t]).flatten(0, 1))
        return x + torch.cat(pos_embs)


class MoonVisionPatchEmbed(nn.Module):
    def __init__(self, out_dim: int, patch_size: int, pos_emb: nn.Module) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, out_dim, kernel_size=patch_size, stride=patch_size)
        self.pos_emb = pos_emb

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        x = self.proj(x).view(x.size(0), -1)
        return self.pos_emb(x, grid)


class Rope2DPosEmb(nn.Module):
    def __init__(self, dim: int, max_height: int = 512, max_width: int = 512, theta_base: float = 10000) -> None:
        super().__init__()
        self.dim, self.max_height, self.max_width, self.theta_base = dim, max_height, max_width, theta_base

    @cached_property
    def precomputed_freqs_cis(self) -> torch.Tensor:
        """(max_height, max_width, dim/2) complex64: [..., 2i] = cis(x * f_i), [..., 2i+1] = cis(y * f_i)."""
        n = self.max_height * self.max_width
        flat_pos = torch.arange(0, n).float()
        x_pos = flat_pos % self.max_width
        y_pos = flat_pos // self.max_width
        dim_range = torch.arange(0, self.dim, 4)[: (self.dim // 4)].float()
        freqs = 1.0 / (self.theta_base ** (dim_range / self.dim))
        x_cis = torch.polar(torch.ones(n, self.dim // 4), torch.outer(x_pos, freqs).float())
        y_cis = torch.polar(torch.ones(n, self.dim // 4), torch.outer(y_pos, freqs).float())
        freqs_cis = torch.cat([x_cis.unsqueeze(dim=-1), y_cis.unsqueeze(dim=-1)], dim=-1)
        return freqs_cis.reshape(self.max_height, self.max_width, -1)

    def get_freqs_cis_by_seqlens(self, grid_hws: list[tuple[int, int]]) -> torch.Tensor:
        return torch.cat([self.precomputed_freqs_cis[:h, :w].reshape(-1, self.dim // 2) for h, w in grid_hws])


def apply_rope(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    freqs_cis = freqs_cis.unsqueeze(-2)  # ..., 1, head_dim/2
    xq_ = torch.view_as_complex(xq.float().view(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().view(*xk.shape[:-1], -1, 2))
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(-2)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(-2)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: list[int]) -> torch.Tensor:
    """The reference's SDPA path: one attention over the whole packed sequence with a block-diagonal mask."""
    seq_length = q.shape[0]
    mask = torch.zeros([1, seq_length, seq_length], dtype=torch.bool)
    for i in range(1, len(cu_seqlens)):
        mask[..., cu_seqlens[i - 1] : cu_seqlens[i], cu_seqlens[i - 1] : cu_seqlens[i]] = True
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    attn_output = F.scaled_dot_product_attention(q, k, v, mask, dropout_p=0.0)
    return attn_output.transpose(0, 1).reshape(seq_length, -1)


class MLP2(nn.Module):
    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        self.fc0 = nn.Linear(dims[0], dims[1], bias=True)
        self.fc1 = nn.Linear(dims[1], dims[2], bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc1(F.gelu(self.fc0(x), approximate="tanh"))  # PytorchGELUTanh


class MoonVitEncoderLayer(nn.Module):
    def __init__(self, num_heads: int, hidden_dim: int, mlp_dim: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.hidden_size_per_attention_head = hidden_dim // num_heads
        self.norm0 = nn.LayerNorm(hidden_dim)
        self.norm1 = nn.LayerNorm(hidden_dim)
        self.mlp = MLP2([hidden_dim, mlp_dim, hidden_dim])
        self.wqkv = nn.Linear(hidden_dim, hidden_dim * 3, bias=True)
        self.wo = nn.Linear(hidden_dim, hidden_dim, bias=True)

    def forward(self, hidden_states: torch.Tensor, cu_seqlens: list[int], rope_freqs_cis: torch.Tensor):
        residual = hidden_states
        hidden_states = self.norm0(hidden_states)
        xqkv = self.wqkv(hidden_states)
        xqkv = xqkv.view(*xqkv.size()[:-1], 3, self.num_heads, self.hidden_size_per_attention_head)
        xq, xk, xv = torch.unbind(xqkv, dim=-3)
        xq, xk = apply_rope(xq, xk, rope_freqs_cis)
        attn_out = sdpa_attention(xq, xk, xv, cu_seqlens)
        hidden_states = residual + self.wo(attn_out)
        residual = hidden_states
        return residual + self.mlp(self.norm1(hidden_states))


class MoonVitEncoder(nn.Module):
    def __init__(self, hidden_dim: int, num_layers: int, num_heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.rope_2d = Rope2DPosEmb(hidden_dim // num_heads, 512, 512)
        self.blocks = nn.ModuleList([MoonVitEncoderLayer(num_heads, hidden_dim, mlp_dim) for _ in range(num_layers)])
        self.final_layernorm = nn.LayerNorm(hidden_dim)

    def forward(self, hidden_states: torch.Tensor, grid_hws: list[tuple[int, int]]) -> torch.Tensor:
        rope_freqs_cis = self.rope_2d.get_freqs_cis_by_seqlens(grid_hws)
        cu_seqlens = np.concatenate([[0], np.cumsum([h * w for h, w in grid_hws])]).tolist()
        for block in self.blocks:
            hidden_states = block(hidden_states, cu_seqlens, rope_freqs_cis)
        return self.final_layernorm(hidden_states)


def patch_merger(x: torch.Tensor, grid_hws: list[tuple[int, int]], merge_kernel_size=(2, 2)) -> list[torch.Tensor]:
    d_model = x.size(-1)
    outputs = []
    pre_sum = 0
    for height, width in grid_hws:
        seq = x[pre_sum : pre_sum + height * width]
        kernel_height, kernel_width = merge_kernel_size
        new_height, new_width = height // kernel_height, width // kernel_width
        reshaped_seq = seq.view(new_height, kernel_height, new_width, kernel_width, d_model)
        reshaped_seq = reshaped_seq.permute(0, 2, 1, 3, 4).contiguous()
        outputs.append(reshaped_seq.view(new_height * new_width, kernel_height * kernel_width, -1))
        pre_sum += height * width
    return outputs


def tpool_patch_merger(x: torch.Tensor, grid_thws: list[list[int]], merge_kernel_size=(2, 2)) -> list[torch.Tensor]:
    d_model = x.size(-1)
    outputs = []
    pre_sum = 0
    for t, h, w in grid_thws:
        seq = x[pre_sum : pre_sum + t * h * w]
        kh, kw = merge_kernel_size
        new_h, new_w = h // kh, w // kw
        reshaped = seq.view(t, new_h, kh, new_w, kw, d_model).permute(0, 1, 3, 2, 4, 5).contiguous().mean(dim=0)
        outputs.append(reshaped.view(new_h * new_w, kh * kw, -1))
        pre_sum += t * h * w
    return outputs


class MoonVitPretrainedModel(nn.Module):
    """Kimi-VL tower (k25=False) or K2.5 MoonViT3d (k25=True; images are t == 1)."""

    def __init__(self, v: dict, k25: bool = False) -> None:
        super().__init__()
        d = v["hidden_size"]
        self.merge_kernel_size = tuple(v["merge_kernel_size"])
        self.k25 = k25
        if k25:
            pos = Learnable2DInterpPosEmbDividedFixed(v["pos_emb_height"], v["pos_emb_width"], 4, d)
        else:
            pos = Learnable2DInterpPosEmb(v["pos_emb_height"], v["pos_emb_width"], d)
        self.patch_embed = MoonVisionPatchEmbed(d, v["patch_size"], pos)
        self.encoder = MoonVitEncoder(d, v["num_layers"], v["num_heads"], v["intermediate_size"])

    def forward(self, pixel_values: torch.Tensor, grid: torch.Tensor) -> list[torch.Tensor]:
        hidden_states = self.patch_embed(pixel_values, grid)
        grid_list = grid.tolist()
        grid_hws = [(h, w) for *_, h, w in grid_list]
        hidden_states = self.encoder(hidden_states, grid_hws)
        if self.k25:
            return tpool_patch_merger(hidden_states, grid_list, self.merge_kernel_size)
        return patch_merger(hidden_states, grid_hws, self.merge_kernel_size)


class KimiVLMultiModalProjector(nn.Module):
    def __init__(self, vision_hidden: int, merge_kernel_size, text_hidden: int) -> None:
        super().__init__()
        self.hidden_size = vision_hidden * merge_kernel_size[0] * merge_kernel_size[1]
        self.pre_norm = nn.LayerNorm(vision_hidden, eps=1e-5)
        self.linear_1 = nn.Linear(self.hidden_size, self.hidden_size, bias=True)
        self.act = nn.GELU()
        self.linear_2 = nn.Linear(self.hidden_size, text_hidden, bias=True)

    def forward(self, image_features: torch.Tensor) -> torch.Tensor:
        hidden_states = self.pre_norm(image_features).view(-1, self.hidden_size)
        return self.linear_2(self.act(self.linear_1(hidden_states)))


class PatchMergerMLP(nn.Module):
    def __init__(self, mm_hidden_size: int, merge_kernel_size, text_hidden: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.hidden_size = mm_hidden_size * merge_kernel_size[0] * merge_kernel_size[1]
        self.pre_norm = nn.LayerNorm(mm_hidden_size, eps=eps)
        self.proj = nn.Sequential(
            nn.Linear(self.hidden_size, self.hidden_size), nn.GELU(), nn.Linear(self.hidden_size, text_hidden)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        return self.proj(self.pre_norm(x).view(b, -1))


class ReferenceKimiVL(nn.Module):
    """state_dict keys == the Kimi-VL checkpoint's vision_tower.* and multi_modal_projector.* names."""

    def __init__(self, vision: dict, text_hidden: int) -> None:
        super().__init__()
        self.vision_tower = MoonVitPretrainedModel(vision)
        self.multi_modal_projector = KimiVLMultiModalProjector(
            vision["hidden_size"], vision["merge_kernel_size"], text_hidden
        )

    def forward(self, pixel_values: torch.Tensor, grid_hws: list[tuple[int, int]]) -> torch.Tensor:
        features = self.vision_tower(pixel_values, torch.tensor(grid_hws))
        return torch.cat([self.multi_modal_projector(f) for f in features])


class ReferenceKimiK25(nn.Module):
    """state_dict keys == the K2.5 checkpoint's vision_tower.* and mm_projector.* names; images are t == 1."""

    def __init__(self, vision: dict, text_hidden: int, projector_ln_eps: float = 1e-5) -> None:
        super().__init__()
        self.vision_tower = MoonVitPretrainedModel(vision, k25=True)
        self.mm_projector = PatchMergerMLP(
            vision["hidden_size"], vision["merge_kernel_size"], text_hidden, projector_ln_eps
        )

    def forward(self, pixel_values: torch.Tensor, grid_hws: list[tuple[int, int]]) -> torch.Tensor:
        features = self.vision_tower(pixel_values, torch.tensor([(1, h, w) for h, w in grid_hws]))
        return torch.cat([self.mm_projector(f) for f in features])


def reference_model(family: str, vision: dict, text_hidden: int, tensors: dict[str, torch.Tensor]) -> nn.Module:
    """A reference model of `family` holding `tensors` (checkpoint names, loaded strictly)."""
    cls = ReferenceKimiVL if family == "kimi_vl" else ReferenceKimiK25
    model = cls(vision, text_hidden)
    model.load_state_dict(tensors, strict=True)
    return model.eval()
