"""`VisionEncoder`: a family's tower + its head (patch merger(s), projector) as one module over a `PackedBatch`.

The registry names the family (`config.family`) and the family builds both modules (mmproc/models/family.py).
State-dict names: `tower.*` and `projector.*`; each family's `CheckpointLayout` maps its checkpoints onto them.
Per forward, two non_blocking H2D copies on a side stream (the pixels, and one int64 buffer of every index built on
the CPU) overlap the previous forward; nothing is read back.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmproc.layers.attention import VarlenMeta
from mmproc.layers.kernels import KernelOptions
from mmproc.layers.projector import merge_gather_index
from mmproc.layers.temporal import frame_grids, frame_time_index
from mmproc.models.config import VisionConfig
from mmproc.models.cuda_graphs import GraphCache
from mmproc.models.device_inputs import DeviceInputs
from mmproc.models.registry import BY_NAME
from mmproc.models.tower_base import TowerInputs
from mmproc.types import PackedBatch, apply_lut

_LUTS_PER_DEVICE = 8  # normalization tables kept on the device (one per preprocessing config in use)


class VisionEncoder(nn.Module):
    def __init__(self, config: VisionConfig, options: KernelOptions | None = None) -> None:
        super().__init__()
        self.config = config
        family = BY_NAME[config.family]
        self.tower = family.tower(config, options)
        self.graphs: GraphCache | None = None  # set by `use_cuda_graphs`
        self.projector = family.head(config)
        self._upload_streams: dict[torch.device, torch.cuda.Stream] = {}  # per device, made on first use
        self._device_luts: dict[tuple, Tensor] = {}  # (table bytes, device, dtype) -> the table there

    def use_cuda_graphs(
        self, capacity: int, max_patches: int, min_hits: int = 2, max_image_patches: int = 1 << 30
    ) -> None:
        """Replay captured forwards for batches seen `min_hits` times, up to `capacity` of them and `max_patches`
        patches each, of images of at most `max_image_patches` (CUDA only; capacity 0 turns it off). See
        mmproc/models/cuda_graphs.py."""
        self.graphs = GraphCache(capacity, max_patches, min_hits, max_image_patches) if capacity > 0 else None

    @property
    def device(self) -> torch.device:
        return next(self.projector.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.projector.parameters()).dtype

    @property
    def output_dim(self) -> int:
        """Width of one output row: every level side by side (`output_widths`)."""
        return self.config.output_dim

    @property
    def output_widths(self) -> tuple[int, ...]:
        """The main merger's width, then each DeepStack level's (vLLM's `mm_encoder_output_widths`)."""
        return self.config.output_widths

    def forward(self, batch: PackedBatch, out: Tensor | list[Tensor] | None = None) -> Tensor | None:
        """Embeddings (batch.num_tokens, output_dim) in the model dtype on the model device (with DeepStack levels,
        each row holds every level side by side: `output_widths`).

        `out`, when given, must have exactly that shape, dtype and device; the head writes into it.
        A list of contiguous (n_i, output_dim) tensors with sum n_i == num_tokens splits the rows over
        several destinations (consecutive ranges, in order); the forward then returns None.
        """
        device, dtype = self.device, self.dtype
        num_tokens = batch.num_tokens
        if isinstance(out, list):
            if sum(chunk.shape[0] for chunk in out) != num_tokens:
                raise ValueError(f"out chunks hold {sum(c.shape[0] for c in out)} rows, the batch has {num_tokens}")
            for chunk in out:
                _check_out(chunk, (chunk.shape[0], self.output_dim), dtype, device)
        elif out is not None:
            _check_out(out, (num_tokens, self.output_dim), dtype, device)
        if batch.num_images == 0:
            return (
                None
                if isinstance(out, list)
                else out
                if out is not None
                else torch.empty(0, self.output_dim, dtype=dtype, device=device)
            )

        if self.graphs is not None and not batch.frames:  # graphs are captured for image batches only
            captured = self.graphs.lookup(self, batch)
            if captured is not None:
                return captured.replay(self, batch, out)
        return self.run(self.prepare(batch), out)

    def prepare(self, batch: PackedBatch) -> DeviceInputs:
        """Everything one forward reads, on the model's device: pixels (cast to the model dtype), per-patch RoPE
        factors and the merge index, with the batch's CPU metadata."""
        device = self.device
        grids = batch.grid_hws
        if batch.frames and max(batch.frames) > self.config.pos_emb_time:
            raise ValueError(f"video chunks of {max(batch.frames)} frames; this tower takes {self.config.pos_emb_time}")
        pixels, rope_rows, merge_idx, cu_dev = self._inputs_to_device(batch, device)
        cos, sin = self.tower.rope_factors(device, rope_rows)  # (L, dh/2) float32 each
        time_index = None
        if batch.frames:
            time_index = frame_time_index(grids, batch.frames).to(device, non_blocking=True)
        return DeviceInputs(
            pixels=self.device_pixels(pixels, batch),  # (L, 3, P, P) model dtype
            cos=cos,
            sin=sin,
            merge_index=merge_idx,
            attn=VarlenMeta.from_cu_seqlens(batch.cu_seqlens, batch.max_seqlen, cu_dev),
            grid_hws=grids,
            frames=batch.frames,
            time_index=time_index,
        )

    def device_pixels(self, pixels: Tensor, batch: PackedBatch) -> Tensor:
        """The batch's pixels (already on the device) in the model dtype: bytes through the batch's table (one
        gather, straight into the model dtype: the same bits as normalizing in float32 and casting), others cast
        (no cast when packed in the model dtype)."""
        if batch.lut is None:
            return pixels.to(self.dtype)
        return apply_lut(pixels, self._device_lut(batch.lut, pixels.device))

    def _device_lut(self, lut: Tensor, device: torch.device) -> Tensor:
        key = (lut.numpy().tobytes(), device, self.dtype)
        table = self._device_luts.get(key)
        if table is None:
            if len(self._device_luts) >= _LUTS_PER_DEVICE:
                self._device_luts.pop(next(iter(self._device_luts)))
            table = self._device_luts[key] = lut.to(device=device, dtype=self.dtype)
        return table

    def run(self, inputs: DeviceInputs, out: Tensor | list[Tensor] | None = None) -> Tensor | None:
        """The forward proper over prepared inputs: only device work, no host reads (CUDA-graph capturable)."""
        frames = inputs.frames
        tower_inputs = TowerInputs(
            grid_hws=frame_grids(inputs.grid_hws, frames) if frames else inputs.grid_hws,
            cos=inputs.cos,
            sin=inputs.sin,
            attn=inputs.attn,
            kernels=self.tower.kernels(self.device, self.dtype),
            time_index=inputs.time_index,
            item_grids=inputs.grid_hws if frames else (),
            frames=frames,
        )
        features = self.tower(inputs.pixels, tower_inputs)  # (sum h*w, D) and the DeepStack taps
        return self.projector(features.hidden, inputs.merge_index, out, features.taps)

    def _inputs_to_device(self, batch: PackedBatch, device: torch.device) -> tuple[Tensor, ...]:
        """Pixels, RoPE rows (the tower's), merge gather (T*kk,) int64 and cu_seqlens (N+1,) int32 on `device`: the
        pixels in one copy, the indices (built on the CPU) in ONE more.

        On CUDA both copies run on a side stream, which the compute stream then waits for (an event): under load
        the copy engine uploads this batch while the GPU still computes the previous one."""
        # RoPE: every frame of a chunk is an (h, w) image; the merge gather runs after the temporal pool.
        rows = self.tower.rope_index(
            device, frame_grids(batch.grid_hws, batch.frames) if batch.frames else batch.grid_hws
        )
        merge = merge_gather_index(batch.grid_hws, self.config.merge_kernel_size)
        if device.type == "cpu":
            return batch.pixel_values, rows, merge, batch.cu_seqlens
        cu = batch.cu_seqlens
        sizes = (rows.numel(), merge.numel(), cu.numel())
        host = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=True)
        torch.cat((rows, merge, cu.to(torch.int64)), out=host)
        compute = torch.cuda.current_stream(device)
        upload = self._upload_stream(device)
        with torch.cuda.stream(upload):
            pixels = batch.pixel_values.to(device, non_blocking=True)
            indices = host.to(device, non_blocking=True)
        compute.wait_stream(upload)
        for tensor in (pixels, indices):
            tensor.record_stream(compute)  # freed after the forward: not reused before the compute stream is done
        rows_d, merge_d, cu_d = indices.split(sizes)
        return pixels, rows_d, merge_d, cu_d.to(torch.int32)

    def _upload_stream(self, device: torch.device) -> torch.cuda.Stream:
        stream = self._upload_streams.get(device)
        if stream is None:
            stream = self._upload_streams[device] = torch.cuda.Stream(device)
        return stream


def _check_out(out: Tensor, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> None:
    if tuple(out.shape) != shape or out.dtype != dtype or out.device != device or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous {shape} {dtype} tensor on {device}, "
            f"got {tuple(out.shape)} {out.dtype} on {out.device}"
        )
