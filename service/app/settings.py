"""All settings of `mmproc serve`, in one pydantic-settings model.

Sources, highest priority first: CLI flags, `MMPROC_*` environment variables (e.g. MMPROC_DEVICE=cuda:0,
MMPROC_IPC_POOL_MB=1024), an optional JSON or TOML config file (`--config FILE` / MMPROC_CONFIG_FILE), defaults.
Built once at the edge and passed down as plain frozen dataclasses; nothing below reads the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from mmproc.runner_config import RunnerConfig
from mmproc.transport.pool_config import PoolConfig
from mmproc.units import MiB
from service.app.limit_settings import LimitSettings
from service.pipeline.cache.store import CacheConfig
from service.pipeline.config import EngineConfig
from service.pipeline.decode.config import DecodePoolConfig
from service.pipeline.key_store import KeyStoreConfig
from service.pipeline.overload import OverloadConfig
from service.pipeline.reply_budget import ReplyBudgetConfig
from service.pipeline.request_limits import InflightLimits

CUDA_HOST_MALLOC_REUSE_MB = 1024  # host_malloc_reuse_mb's default with a CUDA encoder
# stream_chunk_mb's default: not gRPC's customary 4, as each message costs a host copy of its own; at 16 a 5 MB image
# is one message (docs/benchmarks/transport.md, session 19)
STREAM_CHUNK_MB = 16

# Defaults come from the core's dataclasses (each written once, there); these modules are torch-free, so that the
# settings alone (`mmproc serve --help`, `mmproc health`, `mmproc config`) load no torch.


def image_sizes(text: str) -> tuple[tuple[int, int], ...]:
    """'448x448,1024x768' -> ((448, 448), (1024, 768)): (width, height) pairs, each side 1..65535."""
    sizes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        width, sep, height = item.lower().partition("x")
        sides = (width, height) if sep else ()
        if not sides or not all(side.isdigit() and 0 < int(side) < 65536 for side in sides):
            raise ValueError(f"image sizes are WxH, comma-separated (e.g. 448x448), got {item!r}")
        sizes.append((int(width), int(height)))
    return tuple(sizes)


def _check_host_port(name: str, value: str, form: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{name} must be {form} with a port in 0..65535, got {value!r}")
    return value


class ServerSettings(LimitSettings):
    """Every setting; the request, media and video limits are declared in `LimitSettings` (limit_settings.py)."""

    # Model
    model_path: Path | None = Field(
        None,
        description="Local Hugging Face checkpoint directory to serve (config.json, *.safetensors); nothing is downloaded",
    )
    model: str = Field("tiny", description="Embedded preset (random weights) served when no --model-path is given")
    device: str = Field("cpu", description="Where the encoder runs: cpu, cuda or cuda:N")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="Weights and activations dtype; float32 on cpu and bfloat16 on cuda when not given"
    )
    cuda_graphs: int = Field(
        8,
        ge=0,
        le=64,
        description="How many CUDA graphs to keep for batches of small images whose exact sizes repeat (0: none)",
    )
    cuda_graph_max_patches: int = Field(
        4096,
        ge=1,
        le=1 << 20,
        description="Largest batch, in patches, captured as a CUDA graph; bigger ones run eagerly (one output "
        "buffer of this many patches' tokens is shared by all graphs)",
    )
    cuda_graph_max_image_patches: int = Field(
        2048,
        ge=1,
        le=1 << 20,
        description="Batches with an image of more patches run eagerly: a large image's forward is bound by the "
        "GPU's math, not by kernel launches (448² is 1,024 patches, 1024² 5,476)",
    )
    cuda_graph_warmup_sizes: str = Field(
        "",
        description="Image sizes WxH, comma-separated (e.g. 448x448), whose batches of 1..n images are captured as "
        "CUDA graphs at start-up (n within cuda_graphs and cuda_graph_max_patches): traffic of those sizes replays "
        "graphs from its first batch, where a capture under load would stall the runner",
    )
    attention_backend: Literal["auto", "flash_attn_cute", "flash_attn", "torch_varlen", "sdpa"] = Field(
        "auto",
        description="Attention kernel: auto tries flash_attn_cute (FlashAttention 4 on Hopper/Blackwell, the fa4 "
        "extra), flash_attn, torch_varlen, then SDPA per image; a named one falls back to SDPA where it cannot run; "
        "the choice is logged at start-up",
    )
    gpu_preprocess: bool = Field(
        True,
        description="With a CUDA model, normalize pixels on the GPU: decode workers ship uint8 bytes, a quarter of "
        "the float32 bytes, and skip their costliest pass (docs/benchmarks/preprocess.md)",
    )
    gpu_decode: Literal["auto", "on", "off"] = Field(
        EngineConfig.gpu_decode,
        description="With a CUDA model and gpu_preprocess, decode JPEGs on the GPU (nvImageCodec; auto: when it "
        "loads, on: refuse to start without it); other images and GPU failures take the decode workers",
    )

    # Addresses
    grpc_address: str = Field(
        "127.0.0.1:50051", description="Where gRPC listens: HOST:PORT (port 0: any free one) or unix:PATH (mode 0600)"
    )
    http_address: str = Field(
        "127.0.0.1:8080", description="Where HTTP (probes, /metrics, /v1/*) listens: HOST:PORT; empty turns HTTP off"
    )

    # Transport
    transport: Literal["auto", "ipc", "serialized"] = Field(
        "auto",
        description="How embeddings reach a client: CUDA IPC on the same node, serialized bytes, or auto (IPC when it works)",
    )
    ipc_pool_mb: int = Field(
        PoolConfig.pool_bytes // MiB,
        ge=1,
        le=1 << 20,
        description="Size of the one GPU pool that IPC replies are written into",
    )
    ipc_word_slots: int = Field(
        PoolConfig.num_word_slots, ge=1, le=1 << 20, description="How many IPC leases may be in flight at once"
    )
    ipc_ttl_s: float = Field(
        PoolConfig.ttl_s, gt=0, description="A lease not acked after this long is reclaimed (a backstop)"
    )
    ipc_fallback: bool = Field(
        True, description="When the pool stays full past the wait, reply serialized instead of RESOURCE_EXHAUSTED"
    )
    key_store_mb: int = Field(
        KeyStoreConfig.max_bytes // MiB,
        ge=0,
        le=1 << 20,
        description="Memory for results kept by key for engines (docs/engines.md); 0 refuses keys",
    )
    key_store_ttl_s: float = Field(
        KeyStoreConfig.ttl_s, gt=0, le=86_400, description="How long a result stays kept under its key"
    )
    key_store_max_keys: int = Field(
        KeyStoreConfig.max_keys, ge=1, le=1 << 20, description="How many keys the key store holds at most"
    )
    cache_mb: int = Field(
        CacheConfig.host_bytes // MiB,
        ge=0,
        le=1 << 20,
        description="Embedding cache for serialized replies, in host memory (docs/cache.md); 0 turns the cache off",
    )
    cache_ipc_mb: int = Field(
        CacheConfig.pool_bytes // MiB,
        ge=0,
        le=1 << 20,
        description="Embedding cache for IPC replies, inside the IPC pool (at most half of it is sensible); "
        "0, the default until its GPU tests pass on the device (docs/cache.md): IPC requests are not cached",
    )
    cache_policy: Literal["s3fifo", "lru"] = Field(
        CacheConfig.policy, description="Eviction policy of the embedding cache"
    )
    cache_hash: Literal["xxh3", "blake3"] = Field(
        CacheConfig.hash,
        description="Hash of the raw bytes; blake3 (cryptographic) when tenants that do not trust each other share a server",
    )
    cache_invalid_ttl_s: float = Field(
        CacheConfig.invalid_ttl_s,
        ge=0,
        le=3600,
        description="How long an invalid image's error is replayed without decoding it again",
    )
    max_message_mb: int = Field(64, ge=1, le=2047, description="Largest gRPC message, received or sent")
    stream_chunk_mb: int | None = Field(
        None,
        ge=1,
        le=64,
        description=f"Chunk size of streamed serialized replies; default: {STREAM_CHUNK_MB}, or max_message_mb - 1 "
        "when that is smaller",
    )
    host_malloc_reuse_mb: int | None = Field(
        None,
        ge=0,
        le=2047,
        description="Freed host memory kept for the next reply instead of returned (glibc); 0: glibc's; default: "
        f"{CUDA_HOST_MALLOC_REUSE_MB} with a CUDA encoder (tens of MB staged per reply), 0 on the CPU",
    )
    malloc_arena_max: int = Field(
        1,
        ge=0,
        le=1024,
        description="Most glibc malloc arenas, each keeping its own freed memory (threads beyond share); "
        "0: glibc's, 8 per core",
    )
    torch_threads: int = Field(
        0,
        ge=0,
        le=1024,
        description="Torch's CPU threads (reply copies, batch packing, a CPU model); 0: torch's default",
    )
    event_loop: Literal["auto", "asyncio", "uvloop"] = Field(
        "auto",
        description="The front ends' event loop: uvloop when installed (auto, as uvicorn picks), or asyncio's own",
    )
    grpc_loop: Literal["own", "shared"] = Field(
        "own",
        description="The gRPC front end's event loop: one of its own in its own thread (takes calls in while HTTP "
        "and the engine keep the main loop busy), or the main loop",
    )

    # Concurrency and batching
    preprocess_workers: int | None = Field(
        None,
        ge=1,
        le=256,
        description="How many images are decoded at once; default: the CPUs this process may use (affinity, cgroup)",
    )
    max_inflight_requests: int = Field(
        InflightLimits.max_requests,
        ge=1,
        le=100_000,
        description="Requests admitted at once; more are refused with RESOURCE_EXHAUSTED",
    )
    max_inflight_patches: int = Field(
        InflightLimits.max_patches,
        ge=1,
        description="Patches (from the headers) of all requests in flight; ~2.4 KB each once decoded (float32), "
        "0.6 KB as bytes where a CUDA model normalizes them (gpu_preprocess)",
    )
    max_batch_patches: int = Field(
        RunnerConfig.max_batch_patches, ge=1, description="Most patches packed into one forward"
    )
    max_batch_images: int = Field(
        RunnerConfig.max_batch_images, ge=1, description="Most images packed into one forward"
    )
    max_wait_ms: float = Field(
        RunnerConfig.max_wait_ms, ge=0, le=1000, description="How long a forward waits for more images to batch"
    )
    max_queued_images: int = Field(
        RunnerConfig.max_queued_images, ge=1, description="Images that may wait for the encoder; more are refused"
    )
    default_deadline_s: float = Field(
        60.0, gt=0, description="Deadline of a request that sets none (gRPC deadline; HTTP header x-mmproc-timeout-ms)"
    )
    max_queue_delay_ms: float = Field(
        OverloadConfig.max_queue_delay_s * 1000, ge=0, le=3_600_000,
        description="Refuse (429) new requests, whatever their deadline, while requests wait longer than this for the "
        "decoders and the encoder (CoDel's target); 0: off",
    )  # fmt: skip
    queue_discipline: Literal["fifo", "adaptive_lifo"] = Field(
        RunnerConfig.queue_discipline, description="Encoder queue order under overload (docs/benchmarks/overload.md)"
    )
    lifo_after_ms: float = Field(
        RunnerConfig.lifo_after_ms,
        ge=0,
        le=60_000,
        description="With adaptive_lifo: newest first once the oldest image waited this long",
    )
    max_pending_mb: int = Field(
        OverloadConfig.max_pending_bytes // MiB,
        ge=1,
        le=1 << 20,
        description="Decoded images waiting for the encoder, in MB; past it requests are refused (429)",
    )
    max_reply_mb: int = Field(
        ReplyBudgetConfig.max_bytes // MiB,
        ge=1,
        le=1 << 20,
        description="Serialized reply bytes staged or being sent at once, in MB; more replies wait, up to their "
        "deadline (one larger reply goes alone)",
    )
    pinned_reply_mb: int | None = Field(
        None,
        ge=0,
        le=1 << 20,
        description="Page-locked reply messages the GPU writes serialized replies into (no host copy), reused, in "
        "MB; 0: off (staged and copied); default: twice max_reply_mb with a CUDA encoder (capacities are powers of "
        "two), 0 on the CPU",
    )

    # Decode isolation (docs/reliability.md): where hostile bytes are decoded
    decode_isolation: Literal["process", "thread"] = Field(
        DecodePoolConfig.isolation,
        description="Decode in worker processes (a crash or runaway allocation ends a worker, not the service) "
        "or in threads",
    )
    decode_worker_memory_mb: int | None = Field(
        None,
        ge=0,
        le=1 << 20,
        description="Address space a decode worker may add; default ~24 B per max pixel; 0: no cap",
    )
    decode_timeout_s: float = Field(
        DecodePoolConfig.timeout_s,
        gt=0,
        le=3600,
        description="Wall-clock time one image may take in a worker before a 400; caps the budget",
    )
    decode_budget_base_s: float = Field(
        DecodePoolConfig.budget_base_s,
        gt=0,
        le=3600,
        description="An image's decode CPU-time budget: this plus --decode-budget-per-mp-s per MP",
    )
    decode_budget_per_mp_s: float = Field(
        DecodePoolConfig.budget_per_mp_s,
        ge=0,
        le=3600,
        description="Budget added per declared megapixel; past the budget: 400 decode_time",
    )

    # Security
    auth_token: SecretStr | None = Field(
        None, description="Shared secret clients send as `authorization: Bearer <token>`; visible in the process list"
    )
    auth_token_file: Path | None = Field(
        None, description="Read the auth token from this file (a mounted secret), keeping it out of the process list"
    )

    # Lifecycle and logs
    grace_period_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="After SIGTERM, the longest the drain (delay included) may take before work is cut off",
    )
    drain_delay_s: float = Field(
        5.0,
        ge=0,
        le=3600,
        description="After SIGTERM, stay reachable answering NOT_SERVING / 503 this long before closing, so that "
        "load balancers drop the endpoint first (within --grace-period-s)",
    )
    max_connection_age_s: float = Field(
        0, ge=0, description="Close gRPC connections after this age so that dns:/// clients find new replicas; 0: never"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Lowest level logged; third-party libraries stay at WARNING"
    )
    log_json: bool = Field(False, description="Log JSON lines (ISO-8601 UTC times, structured fields) instead of text")

    @field_validator("cuda_graph_warmup_sizes")
    @classmethod
    def _image_sizes(cls, value: str) -> str:
        image_sizes(value)
        return value

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if value != "cpu" and value != "cuda" and not (value.startswith("cuda:") and value[5:].isdigit()):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {value!r}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _read_auth_token_file(cls, values: object) -> object:
        if not isinstance(values, dict) or values.get("auth_token_file") in (None, ""):
            return values
        if values.get("auth_token") not in (None, ""):
            raise ValueError("give auth_token or auth_token_file, not both")
        path = Path(str(values["auth_token_file"]))
        try:
            return {**values, "auth_token": path.read_text().strip()}
        except OSError as exc:
            raise ValueError(f"auth_token_file {path}: {exc.strerror or exc}") from None

    @field_validator("auth_token")
    @classmethod
    def _check_auth_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or value.get_secret_value() == "":
            return None  # MMPROC_AUTH_TOKEN="" means no token
        secret = value.get_secret_value()
        if len(secret) < 16 or not secret.isprintable() or secret != secret.strip():
            raise ValueError("auth_token must be at least 16 printable characters without surrounding spaces")
        return value

    @field_validator("grpc_address")
    @classmethod
    def _check_grpc_address(cls, value: str) -> str:
        if value.startswith("unix:") and value.removeprefix("unix:").removeprefix("//"):
            return value
        return _check_host_port("grpc_address", value, "HOST:PORT or unix:PATH")

    @field_validator("http_address")
    @classmethod
    def _check_http_address(cls, value: str) -> str:
        return value if value == "" else _check_host_port("http_address", value, "HOST:PORT or empty")

    @model_validator(mode="after")
    def _check_sizes(self) -> ServerSettings:
        if self.max_image_mb > self.max_request_mb:
            raise ValueError("max_image_mb must not exceed max_request_mb")
        if self.max_request_mb + 1 > self.max_message_mb:
            raise ValueError("max_message_mb must exceed max_request_mb by at least 1 (protobuf framing)")
        if self.max_inflight_patches < self.max_patches_per_request:
            raise ValueError("max_inflight_patches must be at least max_patches_per_request (one request must fit)")
        if self.drain_delay_s > self.grace_period_s:
            raise ValueError("drain_delay_s must not exceed grace_period_s (the delay is part of the drain)")
        if self.cache_ipc_mb >= self.ipc_pool_mb:
            raise ValueError("cache_ipc_mb must be below ipc_pool_mb (requests need pool space of their own)")
        if self.stream_chunk_mb is not None and self.stream_chunk_mb + 1 > self.max_message_mb:
            raise ValueError("max_message_mb must exceed stream_chunk_mb by at least 1 (each chunk carries a header)")
        return self

    # -- derived values (the core's configs are built from these in service/app/configs.py) ------------

    @property
    def stream_chunk_bytes(self) -> int:
        """stream_chunk_mb, or STREAM_CHUNK_MB where a message holds it with its header."""
        mb = self.stream_chunk_mb
        if mb is None:
            mb = min(STREAM_CHUNK_MB, self.max_message_mb - 1)
        return mb * MiB

    @property
    def host_malloc_reuse_bytes(self) -> int:
        """host_malloc_reuse_mb, or its device's default: the reuse pays for staging large replies from a GPU; on the
        CPU machine it only kept the heap's peak (RSS under 3 x overload, cache off: +185 and +193 MB with glibc's
        thresholds, +259 to +541 with 1024 MB kept; docs/benchmarks/overload.md)."""
        mb = self.host_malloc_reuse_mb
        if mb is None:
            mb = 0 if self.device == "cpu" else CUDA_HOST_MALLOC_REUSE_MB
        return mb * MiB

    @property
    def pinned_reply_bytes(self) -> int:
        """pinned_reply_mb, or its device's default: on a GPU, room for the reply budget's bytes in messages
        rounded up to powers of two (docs/benchmarks/transport.md, session 20)."""
        mb = self.pinned_reply_mb
        if mb is None:
            mb = 0 if self.device == "cpu" else 2 * self.max_reply_mb
        return mb * MiB

    @property
    def torch_dtype_name(self) -> str:
        if self.dtype is not None:
            return self.dtype
        return "float32" if self.device == "cpu" else "bfloat16"

    @property
    def decode_workers(self) -> int:
        """preprocess_workers, or one per CPU this process may use (at most 256)."""
        from service.app.cpus import usable_cpus

        return self.preprocess_workers or min(256, usable_cpus())
