"""One request's decode budget (process mode): CPU seconds over all its images, below the sum of their own budgets,
and megapixels declared by their headers. Why and the figures: docs/reliability.md, "Per-request budgets"."""

from __future__ import annotations

import threading

from mmproc.errors import InvalidMediaError, Reason

MIN_GRANT_S = 0.05  # less than this left: the image is refused rather than started to be cut at once


class RequestSpend:
    """CPU seconds a request may still use: each image is granted min(its own budget, what its request has not
    spent) when it goes to a worker (the worker's timer is set to that), and charged what it used when it comes
    back. Images in flight at once are not reserved against each other: a request overspends by at most its
    images in flight (one per worker), and none of them is refused for what another might use. Any thread."""

    def __init__(self, cpu_s: float) -> None:
        self._lock = threading.Lock()
        self.budget_s = cpu_s
        self.spent_s = 0.0

    def grant(self, image_s: float) -> float:
        """The seconds granted to an image whose own budget is `image_s`; DECODE_TIME when the request's are spent."""
        with self._lock:
            grant = min(image_s, self.budget_s - self.spent_s)
            if grant < min(image_s, MIN_GRANT_S):
                raise InvalidMediaError(
                    f"the request's decode budget of {self.budget_s:g} s of CPU time is spent by its earlier images",
                    reason=Reason.DECODE_TIME,
                )
            return grant

    def charge(self, used_s: float) -> None:
        """An image came back having used `used_s` of CPU time."""
        with self._lock:
            self.spent_s += used_s


def check_megapixels(pixels: list[int], limit_mp: float) -> None:
    """DECODE_COST when the images' headers declare more than `limit_mp` megapixels in all (before any decode)."""
    total = sum(pixels)
    if limit_mp and total > limit_mp * 1e6:
        raise InvalidMediaError(
            f"the images declare {total / 1e6:.0f} MP in all, over the request's decode budget of {limit_mp:g} MP",
            reason=Reason.DECODE_COST,
        )
