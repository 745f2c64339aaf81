"""Request-level checks that need no decoding: the patch budget, estimated from the images' headers.

`mmproc.media` already reads each format's declared size without Pillow; `mmproc.preprocess.target_grid`
turns a size into the exact grid `preprocess_image` will produce. Summing those lets a request that asks for
more than `max_patches` be refused before a single raster is decoded. The estimate never refuses more than
the exact check after decoding would: an image whose header cannot be read counts 0 here, and EXIF orientation
is covered by taking the smaller grid of the two orientations. Nothing unknown stays at 0: once decoded, the
admission counts every patch the headers did not announce against both budgets (the request's, exactly, and the
in-flight one, `Admission.decoded`) before any patch reaches the runner.

`Admission` is the pipeline's door (service/pipeline/requests.py): ready/draining, the request limits, the in-flight
counters, the runner-queue reservation and the overload guard's early refusal, for images and videos alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from mmproc.errors import (
    DeadlineExceededError,
    InvalidMediaError,
    InvalidRequestError,
    Reason,
    ResourceExhaustedError,
    UnavailableError,
)
from mmproc.media.formats import peek_size, sniff_format
from mmproc.preprocess import PreprocessConfig, target_grid
from mmproc.transport.leases.records import MAX_READERS
from mmproc.types import PreprocessedImage
from service.pipeline.overload import OverloadGuard, Ticket
from service.pipeline.request_limits import InflightLimits, RequestLimits


def header_patches(data: bytes, config: PreprocessConfig) -> int:
    """Patches `data` will need according to its header; 0 when the header does not say (or is refused)."""
    fmt = sniff_format(data)
    size = None if fmt is None else peek_size(fmt, data)
    if size is None:
        return 0
    width, height = size
    try:
        grids = [target_grid(width, height, config), target_grid(height, width, config)]
    except InvalidMediaError:  # too small, sliver ...: the decode refuses it with its own reason
        return 0
    return min(gh * gw for gh, gw in grids)


def check_patch_budget(images: Sequence[bytes], config: PreprocessConfig, max_patches: int) -> int:
    """TOO_MANY_PATCHES when the headers alone already ask for more than `max_patches` in total; else the total
    (a lower bound of the patches the request will need)."""
    total = 0
    for data in images:
        total += header_patches(data, config)
        if total > max_patches:
            raise InvalidRequestError(
                f"request needs at least {total} patches (from the image headers), limit {max_patches}",
                reason=Reason.TOO_MANY_PATCHES,
            )
    return total


def check_deadline(deadline: float | None, where: str) -> None:
    """DEADLINE_EXCEEDED when `deadline` (time.monotonic()) has passed: work for it would be thrown away."""
    if deadline is not None and time.monotonic() >= deadline:
        raise DeadlineExceededError(f"deadline passed {where}")


def check_readers(readers: int) -> None:
    """A request's reader count (1 unless it fans out to tensor-parallel ranks) must be in 1..MAX_READERS."""
    if not 1 <= readers <= MAX_READERS:
        raise InvalidRequestError(f"readers must be in 1..{MAX_READERS}, got {readers}", reason=Reason.BAD_REQUEST)


@dataclass
class Admitted:
    """One admitted request's share: the patches counted in flight, the queue slots it reserved until decoded,
    its overload ticket, and whether it is still on its way to the runner (a batch waits only for those)."""

    patches: int
    reserved: int
    ticket: Ticket
    arriving: bool = True


class Admission:
    """The door of the pipeline and the counters of what passed it. Event loop only (the runner reads
    `arriving` and `queued_images` from its thread: int reads)."""

    def __init__(
        self,
        limits: RequestLimits,
        inflight: InflightLimits,
        preprocess: PreprocessConfig,
        overload: OverloadGuard,
        *,
        max_queued_images: int,
        queued_images: Callable[[], int],
    ) -> None:
        self.limits = limits
        self.inflight_limits = inflight
        self.overload = overload
        self._preprocess = preprocess
        self._max_queued_images = max_queued_images
        self._queued_images = queued_images
        self.ready = False
        self.draining = False
        self.inflight = 0  # requests admitted and not finished
        self.inflight_patches = 0  # their patches (from the headers, then as decoded): bounds the pixels held at once
        self.decoding_images = 0  # admitted, not yet queued: counted against the runner queue's limit
        self.arriving = 0  # requests admitted and not yet handed to the runner
        self.cached_requests = 0  # requests in the cache's path (a pure hit never enters `inflight`)

    def check_open(self) -> None:
        if not self.ready or self.draining:
            raise UnavailableError("server is draining" if self.draining else "server is not ready")

    def check_image_count(self, count: int) -> None:
        if count == 0:
            raise InvalidRequestError("request has no images", reason=Reason.BAD_REQUEST)
        if count > self.limits.max_images:
            raise InvalidRequestError(
                f"{count} images in one request, limit {self.limits.max_images}", reason=Reason.TOO_MANY_IMAGES
            )

    def check_request(self, images: list[bytes]) -> int:
        """Request-level limits, checked before any image is decoded; returns the patches the headers ask for."""
        self.check_image_count(len(images))
        total = sum(len(data) for data in images)
        if total > self.limits.max_request_bytes:
            raise InvalidRequestError(
                f"request carries {total} bytes of images, limit {self.limits.max_request_bytes}",
                reason=Reason.REQUEST_TOO_LARGE,
            )
        return check_patch_budget(images, self._preprocess, self.limits.max_patches)

    def check_door(self, *, sheddable: bool = False) -> None:
        """The door's refusals that depend on nothing in the request but its priority: closed (starting or
        draining), requests in flight at their limit, a standing queue, and for a `sheddable` request (batch work)
        a queue past half the target (OverloadGuard.check_queue). A front end asks before it reads or parses a
        request (HTTP: before its body), so that a refused request costs it no parse; `admit` checks all but the
        last again."""
        self.check_open()
        self._check_inflight_requests()
        self.overload.check_queue(sheddable=sheddable)

    def _check_inflight_requests(self) -> None:
        limit = self.inflight_limits.max_requests
        # Retry-after of a fixed bound: when enough of the admitted work has drained for this request to fit.
        if self.inflight >= limit:
            raise ResourceExhaustedError(
                f"too many requests in flight (limit {limit})",
                cause="inflight_requests",
                retry_after_s=self.overload.drain_s((self.inflight + 1 - limit) / self.inflight),
            )

    @contextmanager
    def admit(self, patches: int, items: int, deadline: float | None, *, reserve: int) -> Iterator[Admitted]:
        """Admit a request whose headers announce `patches` over `items` images or videos, reserving `reserve`
        runner-queue slots until decoded; RESOURCE_EXHAUSTED (before any work) when it cannot be taken. Its
        share is given back when the block ends, however it ends."""
        self.check_open()
        check_deadline(deadline, "before admission")
        self._check_inflight_requests()
        limit = self.inflight_limits
        excess = self.inflight_patches + patches - limit.max_patches
        if self.inflight_patches and excess > 0:
            raise ResourceExhaustedError(
                f"too many patches in flight ({self.inflight_patches} + {patches}, limit {limit.max_patches})",
                cause="inflight_patches",
                retry_after_s=self.overload.drain_s(min(1.0, excess / self.inflight_patches)),
            )
        ticket = self.overload.admit(patches, items, deadline)  # early refusal, before any work
        try:
            self._reserve_queue(reserve)
        except BaseException:
            self.overload.release(ticket)
            raise
        admitted = Admitted(patches, reserve, ticket)
        self.inflight += 1
        self.inflight_patches += patches
        self.arriving += 1
        try:
            yield admitted
        except BaseException:
            if deadline is not None and time.monotonic() >= deadline:  # expired, however that surfaced
                self.overload.finished(ticket)  # how long it had: a lower bound of what it needed
            raise
        else:
            self.overload.finished(ticket)
        finally:
            self.handed_over(admitted)
            self.unreserve(admitted)
            self.inflight -= 1
            self.inflight_patches -= admitted.patches
            self.overload.release(ticket)

    def _reserve_queue(self, count: int) -> None:
        """Refuse before decoding when the runner queue could not take the images anyway (fast 429), counting
        images still being decoded for admitted requests."""
        queued = self._queued_images() + self.decoding_images
        if count and queued + count > self._max_queued_images:
            limit = self._max_queued_images
            raise ResourceExhaustedError(
                f"encoder queue full ({queued} images queued or decoding, limit {limit})",
                cause="queue_full",
                retry_after_s=self.overload.drain_s(min(1.0, (queued + count - limit) / max(1, queued))),
            )
        self.decoding_images += count

    def unreserve(self, admitted: Admitted) -> None:
        """The request's images are decoded (or failed): they no longer count as on their way to the queue."""
        self.decoding_images -= admitted.reserved
        admitted.reserved = 0

    def decoded(self, admitted: Admitted, prepared: list[PreprocessedImage]) -> None:
        """The request is decoded: its exact patches against the request's limit, those the headers did not
        announce (a header the peek could not size, or one that lied) against the in-flight bound, and its pixels
        against the overload guard's byte bound, before any of them reaches the runner."""
        total = sum(p.num_patches for p in prepared)
        if total > self.limits.max_patches:
            raise InvalidRequestError(
                f"request needs {total} patches, limit {self.limits.max_patches}", reason=Reason.TOO_MANY_PATCHES
            )
        extra = total - admitted.patches
        if extra > 0:
            limit = self.inflight_limits.max_patches
            if self.inflight_patches + extra > limit:
                raise ResourceExhaustedError(
                    f"too many patches in flight ({self.inflight_patches} + {extra} found by decoding, limit {limit})",
                    cause="inflight_patches",
                )
            self.inflight_patches += extra
            admitted.patches += extra
        self.overload.decoded(admitted.ticket, total, sum(p.patches.nbytes for p in prepared))

    def handed_over(self, admitted: Admitted) -> None:
        """The request reaches the runner next, with no await in between: a batch stops waiting for it."""
        if admitted.arriving:
            admitted.arriving = False
            self.arriving -= 1

    @contextmanager
    def cached(self) -> Iterator[None]:
        """Counts a request in the cache's path, for `idle` waits (a pure hit never enters `inflight`)."""
        self.cached_requests += 1
        try:
            yield
        finally:
            self.cached_requests -= 1
