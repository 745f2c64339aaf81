"""What the gRPC and HTTP front ends serve: the Service's metrics from the start, and the engine with its
ServerInfo once the model is loaded and warmed up.

The front ends come up (and answer health, /readyz, /metrics) before the model loads; until `publish`,
every request that needs the model gets UNAVAILABLE, so clients retry elsewhere or later.
"""

from __future__ import annotations

from mmproc.errors import UnavailableError
from mmproc.v1 import encoder_pb2 as pb
from service.observe.metrics import Metrics
from service.pipeline.images import Engine


class ServingState:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._engine: Engine | None = None
        self._info: pb.ServerInfo | None = None
        self.draining = False  # set first thing on SIGTERM, also while the model is still loading

    def publish(self, engine: Engine, info: pb.ServerInfo) -> None:
        self._engine, self._info = engine, info

    @property
    def loaded(self) -> bool:
        return self._engine is not None

    @property
    def current(self) -> Engine | None:
        """The engine if loaded, else None (for the lifecycle code; front ends use `engine()`)."""
        return self._engine

    def engine(self) -> Engine:
        """The warmed-up engine; UnavailableError while the model is still loading."""
        if self._engine is None:
            raise UnavailableError("server is starting: the model is not loaded yet")
        return self._engine

    def info(self) -> pb.ServerInfo:
        if self._info is None:
            raise UnavailableError("server is starting: the model is not loaded yet")
        return self._info

    @property
    def status(self) -> str:
        """starting | ready | draining — what /readyz reports."""
        engine = self._engine
        if self.draining or (engine is not None and engine.draining):
            return "draining"
        return "ready" if engine is not None and engine.ready else "starting"
