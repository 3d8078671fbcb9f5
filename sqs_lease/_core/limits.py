"""DynamoDB's size limits, checked before a request is sent (the one rule for every shell).

DynamoDB refuses a whole item over 400 KB (attribute names and values, UTF-8) and a
partition key over 2048 bytes, with a ``ValidationException`` that can never turn
into success by retrying. The sizes the toolkit controls (the job id, the payload,
the result, the intent key, the reasons it writes) are checked here first, with an
error that names the limit, so a job fails with a reason instead of being retried.
"""

from __future__ import annotations

import json
from typing import Any

from .._errors import LimitExceeded, ProgressTooLarge

ITEM_LIMIT = 400 * 1024
"""DynamoDB's item size limit in bytes (names and values together)."""

PARTITION_KEY_LIMIT = 2048
"""DynamoDB's partition key limit in UTF-8 bytes."""

PROGRESS_LIMIT = 2048
"""UTF-8 bytes of a handler's progress details (``ctx.progress(details)``) as JSON."""

TIMELINE_ROOM = 64 * 1024
"""Bytes a job's timeline may take: TIMELINE_LIMIT events of at most
``timeline.EVENT_BYTES`` each (kept in step by a test)."""

RECORD_ROOM = 8 * 1024 + TIMELINE_ROOM + PROGRESS_LIMIT
"""Room kept in a job record for everything but payload and result: the other
attributes' names, ids, numbers, a bounded reason (see REASON_LIMIT), the timeline
and the progress details."""

REASON_LIMIT = 2000
"""Characters of a reason the toolkit writes into a record (UTF-8: at most 4x bytes)."""

ERROR_TEXT_LIMIT = 500
"""Characters of an exception's message kept on the record and in the journal."""


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def progress_text(details: Any) -> str:
    """``details`` as the JSON kept on the record; raise :class:`ProgressTooLarge`
    (naming the limit) over :data:`PROGRESS_LIMIT` bytes, ``TypeError`` for a value
    JSON cannot hold."""
    text = json.dumps(details, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    size = utf8_len(text)
    if size > PROGRESS_LIMIT:
        raise ProgressTooLarge(
            f"progress details are {size} bytes as JSON; the limit is {PROGRESS_LIMIT} "
            "(PROGRESS_LIMIT): keep a resume hint (a cursor, the last page done), not the "
            "work itself: results belong in stages or the job's result"
        )
    return text


def check_key(what: str, key: str) -> None:
    """Raise unless ``key`` is a valid DynamoDB partition key (1..2048 UTF-8 bytes)."""
    size = utf8_len(key)
    if not key or size > PARTITION_KEY_LIMIT:
        raise LimitExceeded(
            f"{what} is {size} bytes in UTF-8; DynamoDB's partition key limit is "
            f"{PARTITION_KEY_LIMIT} bytes (and at least 1): use a shorter {what}"
        )


def check_payload(job_id: str, payload_json: str) -> None:
    """Raise unless a job record with this payload fits DynamoDB's item limit."""
    check_key("job id", job_id)
    room = ITEM_LIMIT - RECORD_ROOM - utf8_len(job_id)
    size = utf8_len(payload_json)
    if size > room:
        raise LimitExceeded(
            f"job {job_id!r}: payload is {size} bytes; a job record holds at most {room} "
            f"bytes of payload (DynamoDB's item limit is {ITEM_LIMIT} bytes, 400 KB, less "
            f"{RECORD_ROOM} for the record's other fields): store large inputs elsewhere "
            "and pass a reference"
        )


def result_problem(job_id: str, payload_json: str | None, result_json: str) -> str | None:
    """Why a record with this payload and result would break the item limit (None: fits).

    The whole item counts: the payload stays in the record next to the result.
    """
    payload = utf8_len(payload_json or "")
    result = utf8_len(result_json)
    total = payload + result + RECORD_ROOM + utf8_len(job_id)
    if total <= ITEM_LIMIT:
        return None
    return (
        f"result is {result} bytes and the payload {payload} bytes: the job record would "
        f"be about {total} bytes, over DynamoDB's item limit of {ITEM_LIMIT} bytes (400 KB) "
        "for payload and result together; store large results elsewhere and return a "
        "reference"
    )


def check_intent(key: str, payload_json: str, response_room: int) -> None:
    """Raise unless an intent with this key and payload fits (the response is bounded)."""
    check_key("intent key", key)
    room = ITEM_LIMIT - RECORD_ROOM - response_room - utf8_len(key)
    size = utf8_len(payload_json)
    if size > room:
        raise LimitExceeded(
            f"intent {key!r}: payload is {size} bytes; an intent holds at most {room} bytes "
            f"of payload (DynamoDB's item limit is {ITEM_LIMIT} bytes, 400 KB, less room for "
            "the stored response and the other fields): send a reference instead"
        )


def bounded(text: str, limit: int = REASON_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, marked when cut."""
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "…"
