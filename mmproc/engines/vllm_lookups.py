"""The vLLM connector's scheduler side, without vLLM: is each item of a request held by mmproc, with vLLM's row count?

The scheduler asks `check` every step; lookups run on a small thread pool, so the scheduler never waits on the
network. A request's verdict is kept once known: ready (every item held, or encoded by vLLM itself under the
opt-in fallback), or failed with a reason (the connector hands it to vLLM, which fails just that request).
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter, OrderedDict
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from mmproc.errors import DeadlineExceededError, MmprocError, UnavailableError, UnknownKeyError

logger = logging.getLogger(__name__)

# vLLM's own mm_hash of an item without a uuid: a blake3 / sha256 (64 hex) or sha512 (128 hex) digest
_VLLM_HASH = re.compile(r"(?:^|:)(?:[0-9a-f]{64}){1,2}$")
NO_UUID_HINT = (
    "the request carries no multi_modal_uuids (vLLM hashed the image itself); keep the image in mmproc first and "
    "send its key as the item's uuid (mmproc.engines.vllm.keep_images, or the OpenAI proxy mmproc.engines.vllm_proxy)"
)

# vLLM's encoder cache keeps the zero rows the worker wrote for a failed fetch and may hand them to a later request
POISONED = "an earlier fetch of this key failed and vLLM may still cache zero rows under it: send it under a new key"


class Failure(str, Enum):
    """Why an item is not loaded from mmproc: the label of the connector's failure counter."""

    NO_UUID = "no_uuid"
    MISSING_KEY = "missing_key"
    UNREACHABLE = "unreachable"
    COUNT_MISMATCH = "count_mismatch"
    FETCH = "fetch"
    ERROR = "error"


@dataclass(frozen=True)
class ConnectorConfig:
    """`ec_connector_extra_config` keys. transport: "auto" | "ipc" | "serialized" (worker side).
    fallback_to_vllm: when mmproc is unreachable, vLLM runs its own vision tower for the request (counted)."""

    target: str = "127.0.0.1:50051"
    transport: str = "auto"
    token: str | None = None
    lookup_threads: int = 4
    lookup_timeout_s: float = 2.0  # one lookup RPC, retries included: how long "unreachable" takes to decide
    lookup_wait_s: float = 0.0  # a key not kept yet is asked again until then (a front end that keeps concurrently)
    down_retry_s: float = 5.0  # after "unreachable", new lookups answer so at once for this long
    fetch_timeout_s: float = 30.0
    max_tracked_keys: int = 65_536
    fallback_to_vllm: bool = False
    stats_log_interval_s: float = 60.0  # a counters line in the log at most this often (0: never)

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> ConnectorConfig:
        unknown = sorted(set(extra) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown ec_connector_extra_config keys for MmprocECConnector: {unknown}")
        config = cls(**extra)
        if config.lookup_threads < 1 or config.max_tracked_keys < 1 or config.lookup_timeout_s <= 0:
            raise ValueError("lookup_threads, max_tracked_keys and lookup_timeout_s must be positive")
        return config


class KeyClient(Protocol):
    def lookup(self, keys: list[str], *, timeout: float | None = None) -> list[Any]: ...


@dataclass(frozen=True)
class Answer:
    rows: int | None  # rows mmproc holds under the key; None on failure
    failure: Failure | None = None
    reason: str = ""


class Verdict(Enum):
    READY = "ready"
    PENDING = "pending"
    FAILED = "failed"


class Lookups:
    """Per-key lookups and per-request verdicts. `counts` is cumulative: items looked up, loaded from mmproc,
    encoded by vLLM (fallback), and failures by `Failure` value."""

    def __init__(self, config: ConnectorConfig, client: KeyClient, pool: Executor) -> None:
        self.config = config
        self._client = client
        self._pool = pool
        self._lookups: dict[str, tuple[Future[Answer], set[str]]] = {}  # key -> (answer, requests asking)
        self._verdicts: dict[str, Verdict] = {}  # request id -> READY or FAILED, once known
        self._local: dict[str, set[str]] = {}  # keys vLLM encodes itself (fallback) -> requests, until they finish
        self._failed: dict[str, str] = {}  # request id -> reason, until the scheduler takes it
        self._poisoned: OrderedDict[str, None] = OrderedDict()  # keys whose fetch failed: vLLM holds zeros under them
        self._down_until = 0.0
        self.counts: Counter[str] = Counter()

    def check(self, request_id: str, items: list[tuple[str, int]]) -> Verdict:
        """items: (key, rows vLLM's prompt has for it) per multimodal item of the request."""
        known = self._verdicts.get(request_id)
        if known is not None:
            return known
        pending = False
        local: list[str] = []
        for index, (key, expected) in enumerate(items):
            if key in self._poisoned:
                reason = f"item {index} (key {key!r}): {POISONED}"
                self.fail(request_id, Failure.FETCH, reason)
                return Verdict.FAILED
            answer = self._ask(key, request_id)
            if answer is None:
                pending = True
                continue
            failure, reason = answer.failure, answer.reason
            if failure is None and answer.rows != expected:
                failure = Failure.COUNT_MISMATCH
                reason = f"mmproc holds {answer.rows} rows, vLLM's prompt has {expected} placeholders"
            if failure is Failure.UNREACHABLE and self.config.fallback_to_vllm:
                local.append(key)
                continue
            if failure is not None:
                self._forget_failed(key)  # a later request asks again
                self.fail(request_id, failure, f"item {index} (key {key!r}): {reason}")
                return Verdict.FAILED
        if pending:
            return Verdict.PENDING
        for key in local:
            self._local.setdefault(key, set()).add(request_id)
            self._forget_failed(key)
        if local:
            self.counts["fallback"] += len(local)
            logger.warning("request %s: vLLM encodes %d item(s) itself (mmproc unreachable)", request_id, len(local))
        self.counts["lookups"] += len(items)
        self._verdicts[request_id] = Verdict.READY
        return Verdict.READY

    def held(self, key: str) -> bool:
        """mmproc holds `key` (vLLM loads it instead of encoding); False for keys under the fallback."""
        if key in self._local:
            return False
        entry = self._lookups.get(key)
        if entry is None or not entry[0].done():
            return False
        return entry[0].result().failure is None

    def fail(self, request_id: str, failure: Failure, reason: str) -> None:
        if self._verdicts.get(request_id) is Verdict.FAILED:
            return  # counted and handed to the scheduler once
        logger.error("request %s fails: %s", request_id, reason)
        self.counts[failure.value] += 1
        self._failed[request_id] = reason
        self._verdicts[request_id] = Verdict.FAILED

    def fetch_failed(self, key: str, reason: str) -> None:
        """The worker could not fetch `key` after its lookup succeeded: every request waiting on it fails."""
        entry = self._lookups.pop(key, None)
        self._poisoned[key] = None
        while len(self._poisoned) > self.config.max_tracked_keys:
            self._poisoned.popitem(last=False)
        for request_id in sorted(entry[1] if entry is not None else ()):
            self.fail(request_id, Failure.FETCH, f"key {key!r}: fetch failed: {reason}")

    def take_failed(self) -> dict[str, str]:
        failed, self._failed = self._failed, {}
        return failed

    def finished(self, request_id: str, keys: list[str]) -> None:
        self._verdicts.pop(request_id, None)
        self._failed.pop(request_id, None)
        for key in keys:
            entry = self._lookups.get(key)
            if entry is not None:
                entry[1].discard(request_id)
                if not entry[1] and entry[0].done():
                    del self._lookups[key]
            users = self._local.get(key)
            if users is not None:
                users.discard(request_id)
                if not users:
                    del self._local[key]

    def _ask(self, key: str, request_id: str) -> Answer | None:
        entry = self._lookups.get(key)
        if entry is None:
            if len(self._lookups) >= self.config.max_tracked_keys:
                return Answer(None, Failure.ERROR, f"over {self.config.max_tracked_keys} keys tracked at once")
            if time.monotonic() < self._down_until:
                return Answer(None, Failure.UNREACHABLE, f"mmproc at {self.config.target} is unreachable")
            entry = self._lookups[key] = (self._pool.submit(self._lookup, key), set())
        entry[1].add(request_id)
        return entry[0].result() if entry[0].done() else None

    def _forget_failed(self, key: str) -> None:
        entry = self._lookups.get(key)
        if entry is not None and entry[0].done() and entry[0].result().failure is not None:
            del self._lookups[key]

    def _lookup(self, key: str) -> Answer:
        """Pool thread: one key's answer. Never raises."""
        give_up = time.monotonic() + self.config.lookup_wait_s
        while True:
            try:
                return Answer(self._client.lookup([key], timeout=self.config.lookup_timeout_s)[0].num_tokens)
            except UnknownKeyError:
                if _VLLM_HASH.search(key):  # no uuid: waiting cannot help
                    return Answer(None, Failure.NO_UUID, NO_UUID_HINT)
                if time.monotonic() >= give_up:
                    reason = "mmproc holds no result under this key (never kept, expired or evicted)"
                    return Answer(None, Failure.MISSING_KEY, reason)
                time.sleep(0.05)
            except (UnavailableError, DeadlineExceededError) as exc:
                self._down_until = time.monotonic() + self.config.down_retry_s
                return Answer(None, Failure.UNREACHABLE, f"mmproc at {self.config.target} is unreachable: {exc}")
            except MmprocError as exc:
                return Answer(None, Failure.ERROR, f"mmproc at {self.config.target} failed: {exc}")
            except Exception as exc:  # a bug must fail the request, not the scheduler
                logger.exception("mmproc lookup of %r failed", key)
                return Answer(None, Failure.ERROR, f"lookup failed: {type(exc).__name__}")
