"""Start-up of the transports: each one of the table that has a start (a probe and a producer) is started unless
the settings say serialized; the status line says which serve, in the log and in GetServerInfo."""

from __future__ import annotations

import logging

from mmproc.errors import ConfigError
from mmproc.transport.producer import StartContext
from mmproc.wire.transports import Table
from service.app.configs import transport_configs
from service.app.settings import ServerSettings
from service.pipeline.requests import RequestPipeline

logger = logging.getLogger(__name__)


def start_transports(settings: ServerSettings, pipeline: RequestPipeline, table: Table) -> str:
    """Attach a producer of every transport in `table` that starts here; returns the status line. A transport
    asked for by name (`--transport ipc`) that cannot work is a start-up error."""
    if settings.transport == "serialized":
        return "transports: serialized only (--transport serialized)"
    encoder = pipeline.encoder
    context = StartContext(encoder.device, encoder.output_dim, encoder.dtype, transport_configs(settings))
    served, refused = [], []
    for transport in table.ordered:
        if transport.start is None:
            continue
        started = transport.start(context)
        if isinstance(started, str):
            if settings.transport == transport.name:
                raise ConfigError(f"transport: {transport.name} was requested but cannot work here: {started}")
            refused.append(f"{transport.name} unavailable ({started})")
            continue
        pipeline.attach(started, fallback=settings.ipc_fallback)
        served.append(started.status)
    status = "; ".join([*served, *refused, "serialized"])
    # Expected on a CPU model; a CUDA model that cannot share its memory is worth a warning.
    (logger.info if served or settings.device == "cpu" else logger.warning)("transports: %s", status)
    return status
