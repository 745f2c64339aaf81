"""The settings of the SGLang encoder front end (service/frontends/sglang/, docs/engines.md): a base of
`ServerSettings` in a file of their own. Off unless `sglang_address` is given; URL fetching off unless asked."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class SglangSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MMPROC_", extra="forbid", frozen=True, protected_namespaces=())

    sglang_address: str = Field(
        "",
        description="Where SGLang's encoder protocol (EPD: /encode, /scheduler_receive_url, /health) listens: "
        "HOST:PORT, the URL a `--language-only` server's --encoder-urls names; empty (default) turns it off. No auth",
    )
    sglang_push_timeout_s: float = Field(
        10.0, gt=0, le=600, description="Longest one ZMQ push to an SGLang receiver may take; then 502, counted"
    )
    sglang_register_wait_s: float = Field(
        30.0, gt=0, le=600, description="How long an /encode waits for the TP ranks' receive URLs; then 504"
    )
    sglang_fetch_hosts: str = Field(
        "",
        description="Comma-separated host names whose http(s) media URLs /encode may fetch; empty (default): "
        "no URL is fetched (data: URIs and base64 only)",
    )
    sglang_fetch_max_mb: int = Field(20, ge=1, le=2047, description="Largest media URL body fetched")
    sglang_fetch_timeout_s: float = Field(10.0, gt=0, le=120, description="Longest one media URL fetch may take")
    sglang_fetch_private: bool = Field(
        False, description="Let allow-listed hosts resolve to loopback/private addresses (tests, trusted networks)"
    )

    @field_validator("sglang_address")
    @classmethod
    def _check_sglang_address(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if value and (not sep or not host.strip("[]") or not port.isdigit() or int(port) > 65535):
            raise ValueError(f"sglang_address must be HOST:PORT or empty, got {value!r}")
        return value

    @property
    def sglang_fetch_host_list(self) -> tuple[str, ...]:
        return tuple(h.strip().lower() for h in self.sglang_fetch_hosts.split(",") if h.strip())
