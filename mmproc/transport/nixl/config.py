"""The NIXL transport's settings, torch-free so that the server's settings take their defaults from here."""

from __future__ import annotations

from dataclasses import dataclass

NAME = "nixl"  # its name in the table, the CLI and the client


@dataclass(frozen=True)
class NixlConfig:
    enabled: bool = False  # the transfer endpoint exists only where configured
    net_devices: str = "lo"  # UCX_NET_DEVICES: the interfaces UCX listens and connects on (loopback by default)
    ucx_tls: str = ""  # UCX_TLS: "" lets UCX choose (RDMA where present); "tcp" forces TCP
    port_range: str = ""  # UCX_TCP_PORT_RANGE, "40000-40063": the ports a NetworkPolicy opens ("": any)
    pool_bytes: int = 256 << 20
    alignment: int = 4096
    max_leases: int = 1024  # bound on leases in flight
    ttl_s: float = 60.0  # a lease never read is reclaimed after this long
    transfer_timeout_s: float = 10.0  # a write to a consumer that does not complete in time is dropped
    max_sessions: int = 256

    def __post_init__(self) -> None:
        if self.pool_bytes < self.alignment:
            raise ValueError(f"nixl pool of {self.pool_bytes} bytes is smaller than one slice")
        if not 0 < self.transfer_timeout_s < self.ttl_s:
            raise ValueError("nixl transfer_timeout_s must be positive and below ttl_s (a write outlives no lease)")
