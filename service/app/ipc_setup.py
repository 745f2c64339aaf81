"""Start-up decision for the IPC transport: create the pool, probe it from a child process, say why not."""

from __future__ import annotations

import logging

from mmproc.errors import ConfigError
from mmproc.transport.cuda_ipc.runtime import ipc_unavailable_reason
from service.app.configs import ipc_pool_config
from service.app.settings import ServerSettings
from service.pipeline.images import Engine

logger = logging.getLogger(__name__)


def setup_ipc(settings: ServerSettings, engine: Engine) -> str:
    """Attach an IPC pool to `engine` when the settings ask for it and it works; returns the status line
    shown in the log and in GetServerInfo. `--transport ipc` that cannot work is a start-up error."""
    if settings.transport == "serialized":
        return "IPC off (--transport serialized): serialized only"
    reason = "the encoder runs on the CPU" if engine.encoder.device.type != "cuda" else ipc_unavailable_reason()
    if reason is None:
        from mmproc.transport.cuda_ipc.pool import IpcPool
        from mmproc.transport.cuda_ipc.probe import probe_pool

        pool = IpcPool(engine.encoder.device, ipc_pool_config(settings))
        reason = probe_pool(pool)
        if reason is None:
            engine.attach_ipc_pool(pool, fallback=settings.ipc_fallback)
            status = (
                f"IPC active: {settings.ipc_pool_mb} MiB pool {pool.identity.pool_id} on {pool.identity.device_uuid}; "
                "consumers on this node and PID namespace"
            )
            logger.info(status)
            return status
        pool.close()
        reason = f"probe failed: {reason}"
    if settings.transport == "ipc":
        raise ConfigError(f"transport: ipc was requested but CUDA IPC cannot work here: {reason}")
    status = f"IPC unavailable ({reason}): serialized only"
    # Expected on a CPU model; a CUDA model that cannot share its pool is worth a warning.
    (logger.info if settings.device == "cpu" else logger.warning)(status)
    return status
