"""SGLang's encoder protocol (service/frontends/sglang/) on its own port: its config from the settings, its
uvicorn server in the service's event loop. Started by `Service.start` when `sglang_address` is set."""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass

import uvicorn

from mmproc.errors import ConfigError
from mmproc.units import MiB
from service.app.settings import ServerSettings
from service.pipeline.state import ServingState

logger = logging.getLogger(__name__)


@dataclass
class SglangServer:
    server: uvicorn.Server
    task: asyncio.Task
    encoder: object  # service.frontends.sglang.app.SglangEncoder
    port: int

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task
        self.encoder.pusher.close()  # type: ignore[attr-defined]


async def start_sglang(
    s: ServerSettings,
    state: ServingState,
    server_class: type[uvicorn.Server],
    sock: socket.socket,
) -> SglangServer:
    """Serve on `sock` (bound by `Service.start` with the other listeners, so a bad address fails before any)."""
    try:
        from service.frontends.sglang.app import SglangConfig, create_sglang_app
        from service.frontends.sglang.media import FetchConfig
    except ImportError as exc:  # pyzmq: the [sglang] extra
        sock.close()
        raise ConfigError(
            f"--sglang-address needs pyzmq (pip install pyzmq, or -e '.[sglang]' from a checkout): {exc}"
        ) from None
    fetch = FetchConfig(
        enabled=bool(s.sglang_fetch_host_list), allow_hosts=s.sglang_fetch_host_list,
        max_bytes=s.sglang_fetch_max_mb * MiB, timeout_s=s.sglang_fetch_timeout_s, allow_private=s.sglang_fetch_private,
    )  # fmt: skip
    config = SglangConfig(
        push_timeout_s=s.sglang_push_timeout_s, register_wait_s=s.sglang_register_wait_s,
        deadline_s=s.default_deadline_s, max_body_bytes=s.max_message_mb * MiB, fetch=fetch,
    )  # fmt: skip
    port = sock.getsockname()[1]
    app, encoder = create_sglang_app(state, config)
    server = server_class(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False, log_config=None))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.005)
    host = s.sglang_address.rpartition(":")[0]
    logger.info("SGLang encoder protocol (EPD) on %s:%d", host, port)
    return SglangServer(server, task, encoder, port)
