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

REASON_LIMIT = 2000
"""Characters of a reason the toolkit writes into a record (UTF-8: at most 4x bytes)."""

CODE_LIMIT = 100
"""Characters of an error code kept on the record (a handler's own code is cut to it)."""

REASON_ROOM = 4 * (REASON_LIMIT + CODE_LIMIT)
"""Bytes of the longest reason and error code (UTF-8 takes up to 4 bytes a character)."""

REJECTED_CONTENT_LIMIT = 4096
"""UTF-8 bytes of a rejected result's content kept on the job record (the class's
``keep_rejected_results``)."""

REJECTED_ROOM = REJECTED_CONTENT_LIMIT + 512
"""Bytes a rejected result's record takes: its bounded content, and its hash, size,
token, worker and time with their names. A fenced-out attempt writes it onto any
record, running or ended, outside the fence, so it must always fit."""

FIELDS_ROOM = 4 * 1024
"""Bytes of the record's attribute names, ids, names and numbers (each bounded by
``inputs``: about 1.3 KB at every bound)."""

RECORD_ROOM = FIELDS_ROOM + REASON_ROOM + TIMELINE_ROOM + PROGRESS_LIMIT + REJECTED_ROOM
"""Room kept in a job record for everything but the JSON the job brings (payload,
stage checkpoints, stage input, result), each part at its bound: the fields, a
reason and code, the timeline, the progress details and a rejected result.
tests/test_record_size.py builds the largest record each write can make and checks
that it fits."""

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


def record_problem(job_id: str, **parts: str | None) -> str | None:
    """Why a job record holding ``parts`` would break the item limit (None: it fits).

    The one size rule for every write that grows a record (a commit, a stage's
    checkpoint): ``parts`` are the JSON texts the record holds after the write, by
    name (payload, stage log, stage input, result), measured together with the
    room kept for everything else (:data:`RECORD_ROOM`), since DynamoDB counts the
    whole item and not the attribute a write sets.
    """
    sizes = {name: utf8_len(text or "") for name, text in parts.items()}
    total = sum(sizes.values()) + RECORD_ROOM + utf8_len(job_id)
    if total <= ITEM_LIMIT:
        return None
    listed = ", ".join(f"{name.replace('_', ' ')} {n}" for name, n in sizes.items() if n)
    return (
        f"the job record would be about {total} bytes ({listed} bytes, and {RECORD_ROOM} "
        f"kept for its other fields), over DynamoDB's item limit of {ITEM_LIMIT} bytes "
        "(400 KB)"
    )


def result_problem(
    job_id: str,
    payload_json: str | None,
    result_json: str,
    *,
    stage_log: str | None = None,
    stage_input: str | None = None,
) -> str | None:
    """Why committing ``result_json`` would break the item limit (None: it fits): the
    payload, and a staged job's checkpoints and last input (``stage_log``,
    ``stage_input``), stay in the record next to the result."""
    problem = record_problem(
        job_id,
        payload=payload_json,
        stage_log=stage_log,
        stage_input=stage_input,
        result=result_json,
    )
    if problem is None:
        return None
    return (
        f"result is {utf8_len(result_json)} bytes: {problem}; payload and result together "
        "(with a staged job's checkpoints and input) must fit: store large results "
        "elsewhere and return a reference"
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
