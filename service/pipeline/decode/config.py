"""The decode pool's settings (service/pipeline/decode/pool.py), torch-free so that the server's settings take their
defaults from here (service/app/settings.py): each default is written once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from mmproc.errors import ConfigError

if TYPE_CHECKING:  # the decode worker needs torch
    from service.pipeline.decode.worker import DecodeBudget

Isolation = Literal["process", "thread"]


@dataclass(frozen=True)
class DecodePoolConfig:
    """isolation: "process" (crash/memory isolation) or "thread". workers: parallel decodes.
    worker_memory_mb: address space a process worker may add after start-up (0: no cap).
    worker_recycle_mb: a process worker whose resident size is over this after a task is replaced (0: never);
    an idle worker holds ~150 MB (torch, Pillow, PyAV imported).
    timeout_s: the most wall-clock time one process worker may spend on one image (also caps its budget).
    budget_base_s, budget_per_mp_s: one image's CPU time budget, base + per declared megapixel (process mode).
    request_cpu_s: one request's decode CPU time over all its images (process mode; 0: the images' own only).
    request_megapixels: megapixels one request's image headers may declare in all (0: no bound).
    heavy_s: an image whose own budget is over this is heavy: heavy items hold at most workers - 1 slots.
    log_level, log_json: how process workers log (to the inherited stderr), as the server does.
    normalize: normalize the patches here (a CPU encoder); False leaves the uint8 bytes to the device (a CUDA
    encoder: a quarter of the bytes to hold and ship, and the CPU's most expensive pass moved to the GPU)."""

    isolation: Isolation = "process"
    workers: int = 2
    worker_memory_mb: int = 1024
    worker_recycle_mb: int = 512
    timeout_s: float = 30.0
    budget_base_s: float = 0.5
    budget_per_mp_s: float = 0.2
    request_cpu_s: float = 16.0
    request_megapixels: float = 320.0
    heavy_s: float = 1.0
    log_level: str = "WARNING"
    log_json: bool = False
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.isolation not in ("process", "thread"):
            raise ConfigError(f"decode_isolation must be 'process' or 'thread', got {self.isolation!r}")
        if self.workers < 1 or self.worker_memory_mb < 0 or self.worker_recycle_mb < 0 or not self.timeout_s > 0:
            raise ConfigError(f"bad decode pool config {self}")
        if not self.budget_base_s > 0 or not self.budget_per_mp_s >= 0 or min(self.request_cpu_s, self.heavy_s) < 0:
            raise ConfigError(f"bad decode time budget in {self}")

    @property
    def budget(self) -> DecodeBudget:
        from service.pipeline.decode.worker import DecodeBudget

        return DecodeBudget(self.budget_base_s, self.budget_per_mp_s, self.timeout_s)
