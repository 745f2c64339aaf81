"""A request's priority: the `x-mmproc-priority` header, read before parsing, like a deadline. Batch work is shed
first under overload (docs/reliability.md)."""

from __future__ import annotations

from mmproc.errors import InvalidRequestError, Reason

PRIORITY_HEADER = "x-mmproc-priority"
INTERACTIVE, BATCH = "interactive", "batch"
PRIORITIES = (INTERACTIVE, BATCH)  # interactive: the default, sent as no header at all


def is_batch(value: str | None) -> bool:
    """Whether the header says batch work; anything but the two names is a bad request, not a guess."""
    if value is None:
        return False
    name = value.strip().lower()
    if name not in PRIORITIES:
        raise InvalidRequestError(
            f"{PRIORITY_HEADER} must be one of {PRIORITIES}, got {value!r}", reason=Reason.BAD_REQUEST
        )
    return name == BATCH
