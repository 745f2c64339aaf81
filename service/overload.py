"""Overload control: refuse at the door, in microseconds, what could not finish in time; bound what waits.

A request is admitted only when the estimated time to finish it — the work already admitted ahead of it plus
its own, at the service rate measured over the recent batches — fits its deadline, and the work ahead of it fits
`max_queue_delay_s` (one bound for every front end, so requests with a long deadline cannot fill the queue for
those with a short one: a target queueing delay, as CoDel's, applied at the door). Otherwise it gets RESOURCE_EXHAUSTED / 429 with a retry-after of the time the excess takes to drain. The
decoded pixels of admitted requests are bounded in bytes (`max_pending_bytes`). Why an admission estimate and
FIFO, and the measurements: docs/reliability.md ("Overload") and docs/benchmarks/overload.md.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from mmproc.errors import ConfigError, ResourceExhaustedError

MiB = 1 << 20
MIN_RETRY_AFTER_S = 0.05
BATCH_SHARE = 0.25  # of max_queue_delay_s that one forward may take


@dataclass(frozen=True)
class OverloadConfig:
    """max_queue_delay_s: the longest estimated wait ahead a request is admitted with, whatever its deadline, once
    the wait has stayed above it for `interval_s` (0: no bound besides the deadline). max_pending_bytes: decoded pixels of admitted requests not yet encoded.
    bytes_per_patch: what one decoded patch holds (3 * P * P float32). decode_workers: parallel decodes."""

    max_queue_delay_s: float = 1.0
    interval_s: float = 0.1  # CoDel's interval: a burst above the bound for less than this is let in
    max_pending_bytes: int = 512 * MiB
    bytes_per_patch: int = 3 * 14 * 14 * 4
    decode_workers: int = 1

    def __post_init__(self) -> None:
        if self.max_queue_delay_s < 0 or self.max_pending_bytes < 1 or self.bytes_per_patch < 1:
            raise ConfigError(f"bad overload config {self}")
        if self.decode_workers < 1:
            raise ConfigError(f"overload: decode_workers must be >= 1, got {self.decode_workers}")


class Ewma:
    """Exponentially weighted mean of seconds per unit (one image's decode). Written by one thread, read by others:
    a float assignment is atomic under the GIL."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.value: float | None = None

    def observe(self, seconds: float, units: int) -> None:
        if units <= 0 or seconds < 0:
            return
        sample = seconds / units
        self.value = sample if self.value is None else self.value + self.alpha * (sample - self.value)


class BatchCost:
    """Seconds a forward takes per patch, as the ratio of the recent batches' weighted mean time to their mean
    patches: big batches weigh in by their size, so a stream of small ones (whose fixed cost is most of their
    time) inflates the rate less than a mean of per-batch ratios would. Conservative on purpose: an estimate
    that is high refuses a little early, one that is low lets work in that then expires in the queue (measured:
    docs/benchmarks/overload.md). Updated on the runner thread; read anywhere."""

    def __init__(self, alpha: float = 0.2) -> None:
        self._seconds = Ewma(alpha)
        self._patches = Ewma(alpha)
        self.per_patch_s = 0.0

    def observe(self, seconds: float, patches: int) -> None:
        if patches <= 0 or seconds < 0:
            return
        self._seconds.observe(seconds, 1)
        self._patches.observe(float(patches), 1)
        self.per_patch_s = (self._seconds.value or 0.0) / (self._patches.value or 1.0)

    def seconds(self, patches: int) -> float:
        return patches * self.per_patch_s


@dataclass
class Ticket:
    """What one admitted request holds until `OverloadGuard.release`."""

    patches: int
    images: int
    pending_bytes: int


class OverloadGuard:
    """Admission by estimated time-to-finish and the pending-bytes budget; all counters under one lock."""

    def __init__(self, config: OverloadConfig) -> None:
        self.config = config
        self.forward = BatchCost()  # measured after warm-up, on the runner thread
        self.decode_s_per_image = Ewma()
        self._lock = threading.Lock()
        self._patches = 0  # of admitted requests, not yet finished (decoding, queued or in a forward)
        self._decoding = 0  # images of admitted requests not yet decoded
        self._pending_bytes = 0
        self._above_since: float | None = None  # when the work ahead went above max_queue_delay_s
        self._below_since: float | None = None  # ... and back below it

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def ahead_s(self) -> float:
        """Seconds of work admitted before a request arriving now: the encoder's, or the decodes', whichever is
        longer (they overlap). 0 when idle or before any measurement."""
        per_image = self.decode_s_per_image.value or 0.0
        decode = self._decoding * per_image / self.config.decode_workers
        return max(decode, self.forward.seconds(self._patches))

    def batch_patches(self) -> int:
        """The next batch's patch budget: a `BATCH_SHARE` of the target delay at the measured rate (a request
        waits for the batch running and then its own; batches far longer than the target would break the bound
        on a slow device). Large where the device is fast; the runner clamps it to its own limits."""
        per_patch = self.forward.per_patch_s
        if not self.config.max_queue_delay_s or per_patch <= 0:
            return 1 << 30
        return int(BATCH_SHARE * self.config.max_queue_delay_s / per_patch)

    def estimate_s(self, patches: int, images: int) -> float:
        """Seconds until a request of `patches` / `images` admitted now would be done: the work ahead, its own
        decode (spread over the workers), its own forward."""
        own_decode = (self.decode_s_per_image.value or 0.0) * -(-images // self.config.decode_workers)
        return self.ahead_s() + own_decode + self.forward.seconds(patches)

    def admit(self, patches: int, images: int, deadline: float | None, now: float | None = None) -> Ticket:
        """A ticket, or ResourceExhaustedError (cause "deadline", "queue_delay" or "pending_bytes")."""
        now = time.monotonic() if now is None else now
        cfg = self.config
        nbytes = patches * cfg.bytes_per_patch
        with self._lock:
            if self._pending_bytes and self._pending_bytes + nbytes > cfg.max_pending_bytes:
                drain = self.forward.seconds(self._pending_bytes // cfg.bytes_per_patch)
                raise ResourceExhaustedError(
                    f"decoded images waiting for the encoder are at their bound ({self._pending_bytes} + {nbytes} "
                    f"bytes, limit {cfg.max_pending_bytes})",
                    retry_after_s=max(MIN_RETRY_AFTER_S, drain),
                    cause="pending_bytes",
                )
            ahead = self.ahead_s()
            estimate = self.estimate_s(patches, images)
            left = None if deadline is None else deadline - now
            # An idle server tries even a request too heavy for its deadline: the deadline checks then end it.
            if left is not None and estimate > left and self._patches:
                raise ResourceExhaustedError(
                    f"cannot finish before the deadline: about {estimate * 1e3:.0f} ms of work ahead and own, "
                    f"{left * 1e3:.0f} ms left",
                    retry_after_s=max(MIN_RETRY_AFTER_S, estimate - left),
                    cause="deadline",
                )
            # CoDel at the door: a standing queue above the target delay (for `interval_s`) is refused, a burst is
            # not; the queue must stay below the target for `interval_s` to count as drained (no overshoot each
            # time a finished batch dips it under).
            if not cfg.max_queue_delay_s or ahead <= cfg.max_queue_delay_s:
                self._below_since = now if self._below_since is None else self._below_since
                if now - self._below_since >= cfg.interval_s:
                    self._above_since = None
            else:
                self._below_since = None
                self._above_since = now if self._above_since is None else self._above_since
            if (
                self._above_since is not None
                and now - self._above_since >= cfg.interval_s
                and ahead > cfg.max_queue_delay_s
            ):
                raise ResourceExhaustedError(
                    f"overloaded: about {ahead * 1e3:.0f} ms of work ahead, bound {cfg.max_queue_delay_s * 1e3:.0f} ms",
                    retry_after_s=max(MIN_RETRY_AFTER_S, ahead - cfg.max_queue_delay_s),
                    cause="queue_delay",
                )
            self._patches += patches
            self._decoding += images
            self._pending_bytes += nbytes
        return Ticket(patches, images, nbytes)

    def decoded(self, ticket: Ticket, patches: int, nbytes: int) -> None:
        """The request's images are decoded: count what they really hold (the headers gave a lower bound)."""
        with self._lock:
            self._decoding -= ticket.images
            ticket.images = 0
            self._patches += patches - ticket.patches
            self._pending_bytes += nbytes - ticket.pending_bytes
            ticket.patches, ticket.pending_bytes = patches, nbytes

    def release(self, ticket: Ticket) -> None:
        """The request is done, failed or gone: its share of the work and of the bytes is returned at once."""
        with self._lock:
            self._decoding -= ticket.images
            self._patches -= ticket.patches
            self._pending_bytes -= ticket.pending_bytes
            ticket.images = ticket.patches = ticket.pending_bytes = 0
