"""The runner's settings, torch-free so that the server's settings take their defaults from here."""

from __future__ import annotations

from dataclasses import dataclass

from mmproc.errors import ConfigError
from mmproc.queue_discipline import DISCIPLINES


@dataclass(frozen=True)
class RunnerConfig:
    max_batch_patches: int = 32768  # patch budget of one packed forward
    max_batch_images: int = 64
    max_wait_ms: float = 2.0  # how long the first image of a batch waits for company
    max_queued_images: int = 2048  # more are refused (RESOURCE_EXHAUSTED)
    queue_discipline: str = "fifo"  # mmproc/queue_discipline.py
    lifo_after_ms: float = 100.0  # adaptive_lifo: the oldest image's wait that turns the queue to newest-first

    def __post_init__(self) -> None:
        if self.queue_discipline not in DISCIPLINES:
            raise ConfigError(f"runner: queue_discipline must be one of {DISCIPLINES}, got {self.queue_discipline!r}")
        for name in ("max_batch_patches", "max_batch_images", "max_queued_images"):
            if getattr(self, name) < 1:
                raise ConfigError(f"runner: {name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.max_wait_ms <= 1000:
            raise ConfigError(f"runner: max_wait_ms must be within [0, 1000], got {self.max_wait_ms}")
