"""The one place that touches NIXL (imported lazily, so that a machine without it imports everything else).

Agents run without NIXL's progress thread (it spins a core with no work: docs/nixl.md) and without its metadata
listener: metadata travels over the gRPC session, so the only endpoint NIXL opens is UCX's, on `net_devices`."""

from __future__ import annotations

import functools
import os
import uuid
from typing import Any

import torch


@functools.cache
def _module() -> Any | None:
    for name in ("nixl_cu13", "nixl_cu12", "nixl"):
        try:
            return __import__(name)
        except Exception:  # ImportError, or a build that cannot load its libraries
            continue
    return None


def unavailable_reason() -> str | None:
    """None when a NIXL agent can be made here, else why not."""
    return None if _module() is not None and hasattr(_module(), "nixl_agent") else "NIXL is not installed"


def make_agent(role: str, net_devices: str = "", ucx_tls: str = "", port_range: str = "") -> Any:
    """A NIXL agent with the UCX backend, named uniquely. UCX reads its interfaces and transports from the
    environment when the agent is made: the configured values are put there first (the consumer keeps its own)."""
    nixl = _module()
    if nixl is None:
        raise RuntimeError("NIXL is not installed")
    for key, value in (("UCX_NET_DEVICES", net_devices), ("UCX_TLS", ucx_tls), ("UCX_TCP_PORT_RANGE", port_range)):
        if value:
            os.environ[key] = value
    config = nixl.nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False, backends=["UCX"])
    return nixl.nixl_agent(f"mmproc-{role}-{uuid.uuid4().hex[:12]}", config)


def memory_kind(tensor: torch.Tensor) -> str:
    return "VRAM" if tensor.is_cuda else "DRAM"


def register(agent: Any, tensor: torch.Tensor) -> Any:
    """Register a contiguous tensor's memory once; returns the descriptors to deregister at close."""
    descs = agent.get_reg_descs([tensor])
    agent.register_memory(descs)
    return descs


def device_id(tensor: torch.Tensor) -> int:
    return (tensor.device.index or 0) if tensor.is_cuda else 0
