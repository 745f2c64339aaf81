"""The one rule for a client's request id, whatever carried it: the `x-request-id` header (HTTP) or metadata (gRPC),
the JSON body's `request_id` or the proto's `request_id` field.

A sane id is 1..128 characters of visible ASCII (0x21-0x7e): it goes back as a header or trailer and into every log
line unchanged. Anything else (empty is "not sent") is replaced by a new id of ours, and the replacement is logged
at WARNING under the new id with the refused one cut and escaped: an id can break neither a reply (non-latin-1 or
CR/LF in a header, a 1 MiB trailer) nor a log line. docs/reliability.md#request-ids says why replace, not refuse.
"""

from __future__ import annotations

import logging

from service.observe.logs import new_request_id

MAX_REQUEST_ID = 128
SHOWN_CHARS = 40  # of a refused id, in the log line that says it was replaced

log = logging.getLogger(__name__)


def is_sane_request_id(value: str) -> bool:
    """1..MAX_REQUEST_ID characters, each visible ASCII (no space, no control character)."""
    # the length first: a 1 MiB id costs nothing more
    return 0 < len(value) <= MAX_REQUEST_ID and value.isascii() and value.isprintable() and " " not in value


def request_id_from(field: str | None = None, header: str | None = None) -> str:
    """The request's id: the body's or proto's field when set, else the header's, else a new one. A set one that
    breaks the rule is replaced by a new one, and that is logged."""
    for source, value in (("field", field), ("header", header)):
        if not value:
            continue
        if is_sane_request_id(value):
            return value
        replaced = new_request_id()
        log.warning(
            "the client's request id (%s, %d chars: %r%s) is not 1..%d visible ASCII characters: replaced by %s",
            source, len(value), value[:SHOWN_CHARS], "..." if len(value) > SHOWN_CHARS else "", MAX_REQUEST_ID,
            replaced, extra={"request_id": replaced},
        )  # fmt: skip
        return replaced
    return new_request_id()
