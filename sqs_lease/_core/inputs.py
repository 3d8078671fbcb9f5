"""Text from outside: JSON that can fail only as ``ValueError``, and what an id may be.

Everything a worker, a Lambda batch or an operator command reads comes from someone
else: a message body (anyone who may send to the queue), an event record, a job
record (a producer, a hand edit, another version), a DLQ message, a journal line.
None of it may raise anything but a typed refusal of that one input. Two rules,
one place each, for every reader and for submit alike:

- :func:`loads`: ``json.loads`` that raises only :class:`UnreadableJson` (a
  ``ValueError``): nesting deep enough to exhaust the interpreter's recursion
  (``"[" * 2000``: ``RecursionError``, which no ``except ValueError`` catches),
  numbers past Python's digit limit, invalid text. A value nested deeper than
  :data:`JSON_DEPTH_LIMIT` is refused too, so no later recursive walk of a value
  read here (redaction, validation, rendering) can hit the recursion limit.
- :func:`job_id_problem`, :func:`name_problem`, :func:`send_id_problem`: what a
  job id, a job class or stage name, and a send id may be. Submit refuses what
  breaks them (``LimitExceeded`` / ``ConfigError``, naming the limit); a message
  that names one is poison at once, before any request carries it.
"""

from __future__ import annotations

import json
import math
import unicodedata
from typing import Any

JSON_DEPTH_LIMIT = 64
"""Arrays and objects nested in one value read from outside, at most. The toolkit's
own texts nest 3 deep; payloads are validated by their models, never walked deeper."""

JOB_ID_LIMIT = 2048
"""UTF-8 bytes of a job id at most: DynamoDB's partition key limit."""

NAME_LIMIT = 100
"""Characters of a job class or stage name at most."""

NAME_CHARS = "A-Z a-z 0-9 _ . : -"
NAME_RULE = f"1 to {NAME_LIMIT} characters of {NAME_CHARS}"
"""What a job class or stage name may be: it is part of the idempotency keys of the
effects of its stages, and of metric dimensions."""

NAME_PATTERN = rf"^[A-Za-z0-9_.:-]{{1,{NAME_LIMIT}}}$"
""":data:`NAME_RULE` as a regular expression (the job class model's field)."""

SEND_ID_LIMIT = 200
"""Characters of a send id at most (the toolkit's own are under 80)."""

RESERVED_PREFIXES = ("worker#",)
"""Job id prefixes the job table keeps for itself (a worker's liveness record is
``worker#<id>``): a job under one would be overwritten by it."""

_NAME_SET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")


class UnreadableJson(ValueError):
    """A text from outside that is not JSON this toolkit reads; the message says why
    without quoting the text."""


def loads(text: str | bytes | bytearray, *, strict: bool = False) -> Any:
    """``json.loads(text)``, raising only :class:`UnreadableJson` (a ``ValueError``).

    ``strict`` (a request body a service will hash, store and send on): also no
    ``NaN``/``Infinity``, no number that is not a finite float, integers of at most
    :data:`INT_DIGITS_LIMIT` digits whatever the process sets, and no lone surrogate
    in a string or a key (``"\\ud800"`` decodes to text no UTF-8 encoder accepts)."""
    hooks: dict[str, Any] = (
        {"parse_float": _finite, "parse_int": _bounded_int, "parse_constant": _no_constant}
        if strict
        else {}
    )
    try:
        value = json.loads(text, **hooks)
    except RecursionError:
        raise UnreadableJson(f"JSON nested deeper than {JSON_DEPTH_LIMIT} levels") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, UnicodeDecodeError, digits
        raise UnreadableJson(f"not valid JSON ({_why(exc)})") from None
    _check_tree(value, strict)
    return value


INT_DIGITS_LIMIT = 4300
"""Digits of a JSON integer read strictly, at most (Python's own default)."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"a number is too large for a float ({len(text)} characters)")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > INT_DIGITS_LIMIT:
        raise ValueError(f"an integer has more than {INT_DIGITS_LIMIT} digits")
    return int(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _why(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    # Never the text itself: a UnicodeDecodeError or a digit-limit message quotes none,
    # but keep only the class and a bounded message.
    return f"{type(exc).__name__}: {str(exc)[:120]}"


def _check_tree(value: Any, strict: bool) -> None:
    # Iterative, so a deep value cannot exhaust the recursion this check guards.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            if strict and not _encodable(v):
                raise UnreadableJson("a string holds a lone surrogate (\\ud800-\\udfff)")
            continue
        if not isinstance(v, dict | list):
            continue
        if depth > JSON_DEPTH_LIMIT:
            raise UnreadableJson(f"JSON nested deeper than {JSON_DEPTH_LIMIT} levels")
        if isinstance(v, dict):
            if strict:
                stack.extend((k, depth) for k in v)
            stack.extend((c, depth + 1) for c in v.values())
        else:
            stack.extend((c, depth + 1) for c in v)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no store or header can carry it
        return False
    return True


# Cc: C0 (NUL..US, ESC among them), DEL and C1 (0x80-0x9F: 0x9B is a one-byte
# CSI to some terminals). Cf: format characters, the bidi overrides and isolates
# (U+202A-202E, U+2066-2069) that reorder a line as shown, and zero-width ones
# that hide a difference between two ids. Cs: a lone surrogate, which a strict
# UTF-8 terminal stream cannot even encode. Zl/Zp: line and paragraph separators.
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories of the characters no id may hold and no terminal is sent raw
(``texts.visible`` shows them as escapes): one definition for both."""


def hidden(ch: str) -> bool:
    """Whether ``ch`` is a control, format or separator character (:data:`HIDDEN_CATEGORIES`)."""
    return unicodedata.category(ch) in HIDDEN_CATEGORIES


def job_id_problem(job_id: object) -> str | None:
    """Why ``job_id`` cannot be a job id (None: it can). Never quotes the id."""
    if not isinstance(job_id, str) or not job_id:
        return "a job id is a non-empty string"
    if not _encodable(job_id):
        return "a job id is valid Unicode text (it holds a lone surrogate)"
    size = len(job_id.encode("utf-8"))
    if size > JOB_ID_LIMIT:
        return (
            f"a job id is at most {JOB_ID_LIMIT} bytes in UTF-8 (JOB_ID_LIMIT, DynamoDB's "
            f"partition key limit); this one is {size}"
        )
    if any(hidden(ch) for ch in job_id):
        return "a job id holds no control or format characters (NUL, ESC, CR, LF, bidi)"
    for prefix in RESERVED_PREFIXES:
        if job_id.startswith(prefix):
            return f"job ids starting with {prefix!r} are the job table's own (liveness records)"
    return None


def name_problem(what: str, name: object) -> str | None:
    """Why ``name`` cannot be a job class or stage name (None: it can)."""
    if isinstance(name, str) and 0 < len(name) <= NAME_LIMIT and set(name) <= _NAME_SET:
        return None
    return f"a {what} name is {NAME_RULE}"


def valid_name(name: object) -> bool:
    """Whether ``name`` can name a job class or a stage (:data:`NAME_RULE`)."""
    return name_problem("", name) is None


def send_id_problem(send_id: object) -> str | None:
    """Why ``send_id`` cannot be a send id (None: it can)."""
    if not isinstance(send_id, str) or not send_id:
        return "a send id is a non-empty string"
    if len(send_id) > SEND_ID_LIMIT or not _encodable(send_id):
        return f"a send id is valid text of at most {SEND_ID_LIMIT} characters"
    if any(hidden(ch) for ch in send_id):
        return "a send id holds no control or format characters"
    return None


__all__ = [
    "HIDDEN_CATEGORIES",
    "INT_DIGITS_LIMIT",
    "JOB_ID_LIMIT",
    "JSON_DEPTH_LIMIT",
    "NAME_LIMIT",
    "NAME_PATTERN",
    "NAME_RULE",
    "RESERVED_PREFIXES",
    "SEND_ID_LIMIT",
    "UnreadableJson",
    "hidden",
    "job_id_problem",
    "loads",
    "name_problem",
    "send_id_problem",
    "valid_name",
]


def numbers_as_values(value: Any) -> Any:
    """``value`` with every float that is a whole number as an int, everywhere in it:
    a job's payload means one value whatever path produced its JSON (a model's float
    field dumps ``2.0``; the same payload sent without the app, ``2``). Booleans and
    other floats are left as they are."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: numbers_as_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [numbers_as_values(v) for v in value]
    return value


def payload_text(data: Any) -> str:
    """The one JSON text a job's payload is stored, hashed and compared as: canonical
    (keys sorted, no spaces), whole numbers written as ints (:func:`numbers_as_values`)."""
    return json.dumps(
        numbers_as_values(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def same_payload(a: str, b: str) -> bool:
    """Whether two stored payload texts are one payload: equal, or equal once read and
    written again by :func:`payload_text` (a record written before the rule, or by the
    other path, says ``2.0`` where this submission says ``2``)."""
    if a == b:
        return True
    try:
        return payload_text(loads(a)) == payload_text(loads(b))
    except ValueError:
        return False
