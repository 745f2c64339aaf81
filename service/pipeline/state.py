"""What the front ends serve: metrics from the start, the pipeline and its ServerInfo once warmed up (until
`publish`, requests that need the model get UNAVAILABLE)."""

from __future__ import annotations

from mmproc.errors import UnavailableError
from mmproc.v1 import encoder_pb2 as pb
from service.observe.metrics import Metrics
from service.pipeline.requests import RequestPipeline


class ServingState:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._pipeline: RequestPipeline | None = None
        self._info: pb.ServerInfo | None = None
        self.draining = False  # set first thing on SIGTERM, also while the model is still loading

    def publish(self, pipeline: RequestPipeline, info: pb.ServerInfo) -> None:
        self._pipeline, self._info = pipeline, info

    @property
    def loaded(self) -> bool:
        return self._pipeline is not None

    @property
    def current(self) -> RequestPipeline | None:
        """The pipeline if loaded, else None (for the lifecycle code; front ends use `pipeline()`)."""
        return self._pipeline

    def pipeline(self) -> RequestPipeline:
        """The warmed-up pipeline; UnavailableError while the model is still loading."""
        if self._pipeline is None:
            raise UnavailableError("server is starting: the model is not loaded yet")
        return self._pipeline

    def info(self) -> pb.ServerInfo:
        if self._info is None:
            raise UnavailableError("server is starting: the model is not loaded yet")
        return self._info

    @property
    def status(self) -> str:
        """starting | ready | draining — what /readyz reports."""
        pipeline = self._pipeline
        if self.draining or (pipeline is not None and pipeline.draining):
            return "draining"
        return "ready" if pipeline is not None and pipeline.ready else "starting"
