"""CUDA graphs for batches of small images, whose forward is set by kernel launches, not math: a batch whose exact
grids were seen `min_hits` times is captured once and replayed as one launch. Under load that matters twice: an
eager forward releases and takes back the GIL at every one of its ~1,000 launches, waiting each time behind the
front ends' event loop (at 448² on the H200, 175 ms per forward for 37 ms of the runner's own CPU,
docs/benchmarks/overload.md); a replay takes it a few times. Large images (`max_image_patches`) are not launch
bound and stay eager.

Keyed by exact grids (not padded buckets: padding would change attention segments and position tables). Bounded:
`capacity` graphs (LRU), `max_patches`, a bounded sighting table, no captures after one fails. One shared memory
pool and one shared output buffer are safe because graphs replay one at a time and each result is copied out at
once; so the graphs' memory is their static inputs plus one buffer of `max_patches`' tokens, not one per graph.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Protocol

import torch
from torch import Tensor

from mmproc.models.config import VisionConfig
from mmproc.models.device_inputs import DeviceInputs
from mmproc.models.tower_base import RopeTower
from mmproc.types import PackedBatch

logger = logging.getLogger(__name__)

_SIGHTINGS_PER_GRAPH = 8  # keys remembered (with their hit counts) per graph slot


class VisionEncoder(Protocol):
    """What capturing and replaying needs of the encoder: its two forward steps (`prepare` on the host, `run` on
    the device) and a few facts. mmproc/models/vision_encoder.py implements it (and imports this module)."""

    config: VisionConfig
    tower: RopeTower

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def output_dim(self) -> int: ...

    def prepare(self, batch: PackedBatch) -> DeviceInputs: ...

    def run(self, inputs: DeviceInputs, out: Tensor | list[Tensor] | None = None) -> Tensor | None: ...

    def device_pixels(self, pixels: Tensor, batch: PackedBatch) -> Tensor: ...


class CapturedForward:
    """One captured forward: static inputs (the batch's metadata is baked in), the graph, its output."""

    def __init__(self, encoder: VisionEncoder, batch: PackedBatch, pool: tuple, shared_out: Tensor) -> None:
        device = encoder.device
        self.inputs = encoder.prepare(batch)  # ours alone: the graph reads these addresses on every replay
        # The position tables the capture reads live in an LRU cache; holding them keeps them alive past eviction.
        self.pos_tables = encoder.tower.pos_tables(batch.grid_hws)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up outside the capture (kernel choice, Triton compiles, caches)
            encoder.run(self.inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: only this thread is barred from unsafe CUDA calls while capturing (reply copies go on)
        with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
            out = encoder.run(self.inputs)
            assert out is not None
            shared_out[: out.shape[0]].copy_(out)  # the graph's own output is pool memory, reused by later captures
        self.out: Tensor = shared_out[: out.shape[0]]  # (T, text_hidden), overwritten by each replay of any graph

    def replay(self, encoder: VisionEncoder, batch: PackedBatch, out: Tensor | list[Tensor] | None) -> Tensor | None:
        """The forward for `batch` (same grids as captured): pixels into the static input, replay, copy out."""
        if batch.lut is None:
            self.inputs.pixels.copy_(batch.pixel_values, non_blocking=True)  # H2D from pinned memory, cast if needed
        else:  # bytes: upload, then the same normalizing gather as an eager forward
            pixels = batch.pixel_values.to(self.inputs.pixels.device, non_blocking=True)
            self.inputs.pixels.copy_(encoder.device_pixels(pixels, batch))
        self.graph.replay()
        if out is None:
            return self.out.clone()
        if isinstance(out, list):
            start = 0
            for chunk in out:
                chunk.copy_(self.out[start : start + chunk.shape[0]])
                start += chunk.shape[0]
            return None
        return out.copy_(self.out)


class GraphCache:
    """Captured forwards by key, bounded as the module docstring says. Used from the one thread that owns the
    device (the runner), like the encoder itself."""

    def __init__(self, capacity: int, max_patches: int, min_hits: int = 2, max_image_patches: int = 1 << 30) -> None:
        if capacity < 1 or max_patches < 1 or min_hits < 1 or max_image_patches < 1:
            raise ValueError("capacity, max_patches, min_hits and max_image_patches must be >= 1")
        self.capacity, self.max_patches, self.min_hits = capacity, max_patches, min_hits
        self.max_image_patches = max_image_patches
        self.shared_out: Tensor | None = None  # made at the first capture, for the largest batch allowed
        self.graphs: OrderedDict[tuple, CapturedForward] = OrderedDict()
        self.sightings: OrderedDict[tuple, int] = OrderedDict()
        self.disabled = False
        self.pool: tuple | None = None

    def lookup(self, encoder: VisionEncoder, batch: PackedBatch) -> CapturedForward | None:
        """The captured forward for this batch, capturing it now if it has been seen often enough; None: run
        eagerly (not CUDA, too many patches, an image too large, not seen enough, or captures failed)."""
        if self.disabled or encoder.device.type != "cuda" or batch.num_patches > self.max_patches:
            return None
        if batch.max_seqlen > self.max_image_patches:
            return None
        # pixel shape too: a Qwen video slice (3, 2, P, P) and an image (3, P, P) may share grids
        key = (batch.grid_hws, batch.pixel_values.dtype, tuple(batch.pixel_values.shape[1:]), encoder.tower.options)
        captured = self.graphs.get(key)
        if captured is not None:
            self.graphs.move_to_end(key)
            return captured
        if self._sighted(key) < self.min_hits:
            return None
        return self._capture(key, encoder, batch)

    def _sighted(self, key: tuple) -> int:
        hits = self.sightings.pop(key, 0) + 1
        self.sightings[key] = hits
        while len(self.sightings) > _SIGHTINGS_PER_GRAPH * self.capacity:
            self.sightings.popitem(last=False)
        return hits

    def _capture(self, key: tuple, encoder: VisionEncoder, batch: PackedBatch) -> CapturedForward | None:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        if self.shared_out is None:
            kh, kw = encoder.config.merge_kernel_size  # an image's tokens: (h // kh) * (w // kw) <= its patches / kh kw
            rows = self.max_patches // (kh * kw)
            self.shared_out = torch.empty(rows, encoder.output_dim, dtype=encoder.dtype, device=encoder.device)
        try:
            captured = CapturedForward(encoder, batch, self.pool, self.shared_out)
        except Exception:  # an op this build cannot capture: every batch runs eagerly from now on
            logger.warning("CUDA graph capture failed for grids %s; CUDA graphs are off", key[0], exc_info=True)
            self.disabled = True
            self.graphs.clear()
            return None
        self.graphs[key] = captured
        self.sightings.pop(key, None)
        while len(self.graphs) > self.capacity:
            self.graphs.popitem(last=False)
        logger.info("captured a CUDA graph for grids %s (%d held)", key[0], len(self.graphs))
        return captured
