"""A request's priority, as clients send it and both front ends read it: the `x-mmproc-priority` header (gRPC
metadata, HTTP header). Like a deadline it is an attribute of the call, not of its content, so the server reads it
before parsing the request. Batch work is shed first under overload (docs/reliability.md, "Overload")."""

from __future__ import annotations

from mmproc.errors import InvalidRequestError, Reason

PRIORITY_HEADER = "x-mmproc-priority"
INTERACTIVE, BATCH = "interactive", "batch"
PRIORITIES = (INTERACTIVE, BATCH)  # interactive: the default, sent as no header at all


def is_batch(value: str | None) -> bool:
    """The server's reading of the header: whether it says batch work. Anything but the two names is a bad
    request, not a guess."""
    if value is None:
        return False
    name = value.strip().lower()
    if name not in PRIORITIES:
        raise InvalidRequestError(
            f"{PRIORITY_HEADER} must be one of {PRIORITIES}, got {value!r}", reason=Reason.BAD_REQUEST
        )
    return name == BATCH
