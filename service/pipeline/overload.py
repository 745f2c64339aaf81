"""Overload control: refuse at the door, in microseconds, what could not finish in time; bound what waits.

A request is admitted only when the estimated time to finish it — the work already admitted ahead of it plus
its own, at the service rate measured over the recent batches — fits its deadline, and while the wait of a
request arriving now stays within `max_queue_delay_s` (CoDel's target delay applied at the door: one bound for
every front end, so requests with a long deadline cannot fill the queue for those with a short one). That wait is
the longer of the measured sojourn (the decoders' waiting room plus the encoder's queue: a decode stage slower
than the encoder, JPEGs decoded on a GPU the encoder keeps busy, is a queue too) and the modelled time of the
images waiting for the encoder (decoding, or queued for it): the sojourn alone passes the target a full target
after the queue has.
The work ahead counts the requests still decoding by what their headers announce. A request refused gets
RESOURCE_EXHAUSTED / 429 with a retry-after of the time the excess takes to drain. The decoded pixels of admitted
requests are bounded in bytes (`max_pending_bytes`): checked at the door against the headers, held (and checked
again) once decoded. Why an admission estimate and FIFO, and the measurements: docs/reliability.md
("Overload") and docs/benchmarks/overload.md.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median

from mmproc.errors import ConfigError, ResourceExhaustedError
from mmproc.units import MiB

MIN_RETRY_AFTER_S = 0.05
# With the encoder on the CPU a forward's activations are host memory and a batch is no faster per image: shorter
# batches cost nothing and keep the heap's peak down (docs/benchmarks/overload.md, session 17).
CPU_BATCH_SHARE = 0.125
# Of max_queue_delay_s: above this wait, sheddable requests (batch work, `x-mmproc-priority: batch`) are refused
# at once, leaving the rest of the target to interactive ones (Google SRE's "Handling Overload").
SHEDDABLE_SHARE = 0.5


@dataclass(frozen=True)
class OverloadConfig:
    """max_queue_delay_s: the target wait before a forward (the measured sojourn, or the modelled time of the
    images waiting for the encoder): past it for `interval_s`, requests are refused whatever their deadline (0: no
    bound besides the deadline). max_pending_bytes: decoded pixels of admitted requests not yet encoded.
    bytes_per_patch: what one decoded patch holds: 3 * P * P float32, or bytes where the encoder normalizes them.
    max_batch_patches: the runner's own ceiling on a batch (`RunnerConfig.max_batch_patches`): no budget passes it.
    batch_share: of max_queue_delay_s, what one forward may take (`CPU_BATCH_SHARE` with the encoder on the CPU)."""

    max_queue_delay_s: float = 1.0
    interval_s: float = 0.1  # CoDel's interval: a burst above the bound for less than this is let in
    max_pending_bytes: int = 512 * MiB
    bytes_per_patch: int = 3 * 14 * 14 * 4
    max_batch_patches: int = 1 << 30
    batch_share: float = 0.25

    def __post_init__(self) -> None:
        if (
            min(self.max_pending_bytes, self.bytes_per_patch, self.max_batch_patches) < 1
            or self.max_queue_delay_s < 0
            or not 0 < self.batch_share <= 1
        ):
            raise ConfigError(f"bad overload config {self}")


class BatchCost:
    """A forward's time as `fixed + per_patch * patches`, fitted to the last `window` forwards by medians: the
    per-patch cost is the median of the slopes between pairs of forwards, each pair weighted by how far apart
    their sizes are (Theil-Sen, weighted: near sizes say little of a slope); the fixed cost is the median of what
    each forward leaves over. Medians, not least squares: on a loaded CPU one forward in a few takes 5-50x its
    usual time (a thread preempted, a shape not seen before), and a least-squares fit took that as the cost of
    every patch (0.5 ms against 0.06-0.1: the door then saw seconds of work in a queue of one image; sessions 14-15
    in docs/benchmarks/overload.md). Fixed and per-patch kept apart: one rate per patch would charge a small batch's
    fixed cost to every patch (a stream of tiny images then makes one ordinary image look like seconds of work).
    Forwards of one size, or of sizes too near for their noise (a slope not positive, or steeper than the points
    allow: a fixed cost below 0): the median seconds per patch. Also `per_image_s`, the median of a forward's
    time per image it carried: the queue's drain rate in images. Updated on the runner thread; read anywhere."""

    def __init__(self, window: int = 16) -> None:
        self._recent: deque[tuple[int, float, int]] = deque(maxlen=window)  # (patches, seconds, images)
        self.fixed_s = 0.0
        self.per_patch_s = 0.0
        self.per_image_s = 0.0

    def observe(self, seconds: float, patches: int, images: int = 1) -> None:
        if patches <= 0 or images <= 0 or seconds < 0:
            return
        self._recent.append((patches, seconds, images))
        recent = list(self._recent)
        self.per_image_s = median(y / n for _, y, n in recent)
        slopes = sorted(
            ((y1 - y0) / (x1 - x0), abs(x1 - x0))
            for i, (x0, y0, _) in enumerate(recent)
            for x1, y1, _ in recent[i + 1 :]
            if x1 != x0
        )
        slope = _weighted_median(slopes) if slopes else 0.0
        fixed = median(y - slope * x for x, y, _ in recent)
        if slope <= 0 or fixed < 0:  # one size, or sizes too near for their noise: no split
            self.fixed_s, self.per_patch_s = 0.0, median(y / x for x, y, _ in recent)
        else:
            self.fixed_s, self.per_patch_s = fixed, slope

    def seconds(self, patches: int, batches: int = 1) -> float:
        return (batches * self.fixed_s + patches * self.per_patch_s) if patches > 0 else 0.0


def _weighted_median(values: list[tuple[float, int]]) -> float:
    """The value at half the total weight of (value, weight) pairs sorted by value."""
    half, seen = sum(weight for _, weight in values) / 2, 0
    for value, weight in values:
        seen += weight
        if seen >= half:
            return value
    return values[-1][0]


class Overrun:
    """How much longer admitted requests take than the model of `modelled_s` says (decode, delivery and waits for
    the GIL are not in it), exponentially weighted. One sample counts for at most `max_sample_s` either way, so
    one outlier (a first compile, a stalled client) moves it by at most alpha x that. Written on the event loop,
    read anywhere."""

    def __init__(self, alpha: float = 0.05, max_sample_s: float = 1.0) -> None:
        self.alpha, self.max_sample_s = alpha, max_sample_s
        self.seconds = 0.0

    def observe(self, taken_s: float, modelled_s: float) -> None:
        sample = min(self.max_sample_s, max(-self.max_sample_s, taken_s - modelled_s))
        self.seconds += self.alpha * (sample - self.seconds)

    def correction_s(self) -> float:
        """What every estimate adds: never less than the model alone."""
        return max(0.0, self.seconds)


@dataclass(eq=False)  # one per request, kept in a set while decoding: compared by identity
class Ticket:
    """What one admitted request holds until `OverloadGuard.release`: until decoded, the images it decodes and the
    patches its headers announced; then its decoded patches and their bytes. `admitted_at` and `modelled_s` (the
    model's time to finish at admission) are for `OverloadGuard.finished`."""

    patches: int
    images: int
    pending_bytes: int
    announced: int = 0
    items: int = 0  # images (or video chunks) it holds until released: each batch takes at least one
    admitted_at: float = 0.0
    modelled_s: float = 0.0
    on_shed: Callable[[], object] | None = None  # while decoding: ends the decode (set by the decode step)
    shed: bool = False  # shed at the door for a newcomer (service/pipeline/decode/step.py answers 429)


class OverloadGuard:
    """Admission by estimated time-to-finish and the pending-bytes budget; all counters under one lock."""

    def __init__(
        self,
        config: OverloadConfig,
        queue_wait: Callable[[], float] = lambda: 0.0,
        encoder_queue: Callable[[], tuple[int, int]] = lambda: (0, 0),
    ) -> None:
        """queue_wait: the pipeline's sojourn time now (how long a request arriving now would wait in the queues
        before its forward, as measured by their oldest waiters). encoder_queue: (images, patches) waiting in the
        encoder's queue now, not yet in a forward."""
        self.config = config
        self._queue_wait = queue_wait
        self._encoder_queue = encoder_queue
        self.forward = BatchCost()  # measured after warm-up, on the runner thread
        self.overrun = Overrun()  # measured on finished and expired requests
        self._lock = threading.Lock()
        self._patches = 0  # of admitted requests, not yet finished (decoding, queued or in a forward)
        self._decoding = 0  # images of admitted requests not yet decoded
        self._announced = 0  # patches their headers announced
        self._items = 0  # images (or video chunks) of admitted requests not finished
        self._pending_bytes = 0
        self._above_since: float | None = None  # when the wait went above max_queue_delay_s
        self._decoding_tickets: set[Ticket] = set()  # admitted and not yet decoded: who may be shed
        self.shed = 0  # requests shed at the door for newcomers
        self._below_since: float | None = None  # ... and back below it

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def ahead_s(self) -> float:
        """Seconds of encoder work admitted and not finished before a request arriving now (decoded patches, and
        what the headers of requests still decoding announced); 0 when idle or before any measurement. The decode
        itself is left out: images differ too much in decode cost for one rate; a slow decode stage shows in the
        measured sojourn (`queue_wait`)."""
        return self._forwards_s(self._patches + self._announced, self._items)

    def _waiting_s(self) -> float:
        """(under the lock) The modelled encoder time of the images waiting for a forward: still decoding (by
        their headers) or queued for the encoder. What a request arriving now waits for once decoded, known as
        soon as they are admitted (the measured sojourn says it only once they have waited). The lower of two
        estimates that err in opposite ways when those images differ in size from the recent ones: the fit in
        patches extrapolates small forwards to a big image (on the CPU, a queue of one 4k-patch image behind
        forwards of 16-100 patches read 1.6-2.6 s, against 0.3 s; a bomb's header announces the largest image),
        the images' drain rate counts a thumbnail behind big images as a big one."""
        queued_images, queued_patches = self._encoder_queue()
        images, patches = queued_images + self._decoding, queued_patches + self._announced
        return min(self._forwards_s(patches, images), images * self.forward.per_image_s)

    def _forwards_s(self, patches: int, images: int) -> float:
        # As many batches as the patch budget makes, and never more than there are images: when the fitted fixed
        # cost alone passes the budget (a loaded CPU), the budget is one patch and the runner still batches whole
        # images; counting a batch per patch made seconds of work look like minutes and refused everything.
        batches = min(1 + patches // max(1, self.batch_patches()), max(1, images))
        return self.forward.seconds(patches, batches)

    def drain_s(self, share: float) -> float:
        """When about `share` (0..1) of the admitted work will have drained at the measured rate: the retry-after of
        a refusal by a fixed bound (a slot frees as that work finishes)."""
        return max(MIN_RETRY_AFTER_S, share * self.ahead_s())

    def batch_patches(self) -> int:
        """The next batch's patch budget: a `batch_share` of the target delay at the measured rate (a request
        waits for the batch running and then its own; batches far longer than the target would break the bound
        on a slow device). Large where the device is fast, and never past the runner's ceiling: the work ahead is
        counted in the batches the runner will really make (a budget above it counted fewer forwards, and so less
        fixed cost, than would run)."""
        cfg = self.config
        budget_s = cfg.batch_share * cfg.max_queue_delay_s - self.forward.fixed_s
        per_patch = self.forward.per_patch_s
        if not cfg.max_queue_delay_s or per_patch <= 0:
            return cfg.max_batch_patches
        return max(1, min(cfg.max_batch_patches, int(budget_s / per_patch)))

    def modelled_s(self, patches: int) -> float:
        """The model's seconds until a request of `patches` admitted now would be done: the work ahead and its
        own forward."""
        return self.ahead_s() + self.forward.seconds(patches)

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
            modelled = self.modelled_s(patches)
            # What requests measurably took beyond the model: without it, a server whose decode, delivery or
            # event loop adds time admits requests that then expire.
            estimate = modelled + self.overrun.correction_s()
            left = None if deadline is None else deadline - now
            # An idle server tries even a request too heavy for its deadline: the deadline checks then end it.
            if left is not None and estimate > left and (self._patches or self._decoding):
                beyond = (
                    f" ({(estimate - modelled) * 1e3:.0f} ms measured beyond the model)" if estimate > modelled else ""
                )
                raise ResourceExhaustedError(
                    f"cannot finish before the deadline: about {estimate * 1e3:.0f} ms of work ahead and own{beyond}, "
                    f"{left * 1e3:.0f} ms left",
                    retry_after_s=max(MIN_RETRY_AFTER_S, estimate - left),
                    cause="deadline",
                )
            self._refuse_standing_queue(now, self._wait_s())
            # Until decoded, a request's encoder work is what its headers announce: a liar or a bomb is refused by
            # its decode and gives its share back then, within milliseconds.
            self._decoding += images
            self._announced += patches
            self._items += images
            ticket = Ticket(0, images, 0, announced=patches, items=images, admitted_at=now, modelled_s=modelled)
            self._decoding_tickets.add(ticket)
        return ticket

    def check_queue(self, now: float | None = None, *, sheddable: bool = False) -> None:
        """ResourceExhaustedError while the queue stands above the target delay (cause "queue_delay"), or for a
        `sheddable` request (batch work) while requests wait more than `SHEDDABLE_SHARE` of it (cause
        "batch_shed"): refusals that depend on nothing in the request but its priority, so front ends can ask
        before reading its body."""
        now = time.monotonic() if now is None else now
        cfg = self.config
        with self._lock:
            waited = self._wait_s()
            self._refuse_standing_queue(now, waited)
            limit = SHEDDABLE_SHARE * cfg.max_queue_delay_s
            if sheddable and limit and waited > limit:
                raise ResourceExhaustedError(
                    f"overloaded for batch requests: requests wait about {waited * 1e3:.0f} ms, batch requests are "
                    f"taken below {limit * 1e3:.0f} ms",
                    retry_after_s=max(MIN_RETRY_AFTER_S, waited - limit),
                    cause="batch_shed",
                )

    def _wait_s(self) -> float:
        """(under the lock) What a request arriving now would wait before its forward: the longer of the measured
        sojourn and the modelled time of the images waiting for the encoder."""
        return max(self._queue_wait(), self._waiting_s())

    def _without_hog(self, now: float, waited: float) -> float:
        """(under the lock) The wait without the one request still decoding that alone makes the queue stand: its
        images reach the encoder only once all are decoded, a small newcomer (light lane, fair_share.py) first. A
        hog decoding for the target delay already is shed (429 with the reason); a quick big request never is."""
        hog = self._dominant()
        if hog is None:
            return waited
        queued_images, queued_patches = self._encoder_queue()
        images, patches = queued_images + self._decoding - hog.images, queued_patches + self._announced - hog.announced
        without = max(self._queue_wait(), min(self._forwards_s(patches, images), images * self.forward.per_image_s))
        if without > self.config.max_queue_delay_s:
            return waited  # the queue stands without it too
        if now - hog.admitted_at >= self.config.max_queue_delay_s:
            self._shed(hog)
        return without

    def _refuse_standing_queue(self, now: float, waited: float) -> None:
        """(under the lock) CoDel at the door: a standing queue — its wait (`waited`, read by `_wait_s`) above the
        target delay for `interval_s` — is refused, a burst is not; the queue must stay below the target for
        `interval_s` to count as drained (no overshoot each time a finished batch dips it under). The wait is the
        longer of the measured sojourn and the modelled time of the images waiting for the encoder. The sojourn alone
        passes the target a full target after the queue has, and until then requests with a long deadline (HTTP's
        default) poured in: 1.5-3.7 s waits on the CPU at 10 x C (docs/benchmarks/overload.md, session 14). The model
        leaves out the forward running: an idle queue never looks full, whatever the fit reads."""
        cfg = self.config
        if cfg.max_queue_delay_s and waited > cfg.max_queue_delay_s:
            waited = self._without_hog(now, waited)
        if not cfg.max_queue_delay_s or waited <= cfg.max_queue_delay_s:
            self._below_since = now if self._below_since is None else self._below_since
            if now - self._below_since >= cfg.interval_s:
                self._above_since = None
            return
        self._below_since = None
        self._above_since = now if self._above_since is None else self._above_since
        if now - self._above_since >= cfg.interval_s:
            excess = max(self.ahead_s(), waited) - cfg.max_queue_delay_s
            raise ResourceExhaustedError(
                f"overloaded: requests wait about {waited * 1e3:.0f} ms for the decoders and the encoder, target "
                f"{cfg.max_queue_delay_s * 1e3:.0f} ms",
                retry_after_s=max(MIN_RETRY_AFTER_S, excess),
                cause="queue_delay",
            )

    def finished(self, ticket: Ticket, now: float | None = None) -> None:
        """The request ended with its result, or expired (then its time is a lower bound of what it needed): its
        time from admission against the model's, into `overrun`."""
        now = time.monotonic() if now is None else now
        self.overrun.observe(now - ticket.admitted_at, ticket.modelled_s)

    def _dominant(self) -> Ticket | None:
        """(under the lock) The request still decoding that holds most of what waits: at least half of the images
        or of the announced patches still decoding, and two images or more; None if there is no such request."""
        candidates = [t for t in self._decoding_tickets if t.on_shed is not None and not t.shed and t.images > 1]
        if not candidates:
            return None
        hog = max(candidates, key=lambda t: (t.announced, t.images))
        if 2 * hog.announced < self._announced and 2 * hog.images < self._decoding:
            return None
        return hog

    def _shed(self, hog: Ticket) -> None:
        """(under the lock) End the hog's decode (`on_shed`): it is answered 429 with the reason."""
        hog.shed = True
        self.shed += 1
        on_shed, hog.on_shed = hog.on_shed, None
        self._leave_decode(hog)
        if on_shed is not None:
            on_shed()

    def _leave_decode(self, ticket: Ticket) -> None:
        """(under the lock) The ticket is decoded, failed or gone: it no longer counts as decoding."""
        self._decoding_tickets.discard(ticket)
        self._decoding -= ticket.images
        self._announced -= ticket.announced
        ticket.images = ticket.announced = 0

    def decoded(self, ticket: Ticket, patches: int, nbytes: int) -> None:
        """The request's images are decoded: from now on it holds `nbytes` of pixels and `patches` of encoder
        work. ResourceExhaustedError (cause "pending_bytes") when those bytes would pass the bound."""
        cfg = self.config
        with self._lock:
            self._leave_decode(ticket)
            if self._pending_bytes and self._pending_bytes + nbytes > cfg.max_pending_bytes:
                raise ResourceExhaustedError(
                    f"decoded images waiting for the encoder are at their bound ({self._pending_bytes} + {nbytes} "
                    f"bytes, limit {cfg.max_pending_bytes})",
                    retry_after_s=max(MIN_RETRY_AFTER_S, self.forward.seconds(self._patches)),
                    cause="pending_bytes",
                )
            self._patches += patches
            self._pending_bytes += nbytes
            ticket.patches, ticket.pending_bytes = patches, nbytes

    def release(self, ticket: Ticket) -> None:
        """The request is done, failed or gone: its share of the work and of the bytes is returned at once."""
        with self._lock:
            self._leave_decode(ticket)
            self._patches -= ticket.patches
            self._pending_bytes -= ticket.pending_bytes
            self._items -= ticket.items
            ticket.images = ticket.patches = ticket.pending_bytes = ticket.items = 0
