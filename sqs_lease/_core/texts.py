"""Outside text made fit for the people who read it: on a terminal, in a reason, in a log.

Job ids (from producers), exception texts (from handlers and tools), DLQ bodies
(from anyone who can send) and responses are written by others. Three rules,
each in one function here, so every path that shows or keeps such text applies
the same one:

- :func:`visible`: control characters made visible before text reaches a
  terminal (an ESC, an OSC sequence, a carriage return or a bidi override
  must not move the cursor, set the title, write the clipboard or reorder a
  line). JSON output needs nothing: JSON escapes them itself.
- :func:`without_urls`: every URL cut to its scheme and host (a webhook's
  secret path and its ``?token=`` stay out of reasons, journals and logs).
- :func:`without_payload` and :func:`validation_text`: no input value in a
  reason (the payload's strings, the numbers in them, and any stretch copied
  from them; pydantic errors are said without their ``input_value``).

Pure (no I/O): the shells and the command line import these from here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Final

from .inputs import hidden, loads

_NAMED: Final = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\x1b": "\\x1b"}


def _shown(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def visible(text: object) -> str:
    """``text`` (``str()`` of it) with every control character shown as an escape
    (``\\x1b``, ``\\r``, ``\\n``, ``\\u202e``), for a terminal. Printable text,
    other scripts and emoji pass unchanged; so does a backslash."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():  # the common case, in C: nothing to do
        return s
    return "".join(_shown(ch) if hidden(ch) else ch for ch in s)


def visible_lines(text: str) -> str:
    """:func:`visible` for each line of a text whose line breaks are ours (an
    indented JSON dump: its strings' own breaks are already escaped)."""
    return "\n".join(visible(line) for line in text.split("\n"))


# A URL as a text quotes it: a scheme, ``://``, then everything up to a space or a
# quote. Its authority ends at the first ``/``, ``?`` or ``#``; user info before an
# ``@`` is dropped with the rest.
_URL: Final = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*)://([^\s/?#'\"<>]*)[^\s'\"<>]*")


def _origin(m: re.Match[str]) -> str:
    host = m.group(2).rpartition("@")[2]
    return f"{m.group(1)}://{host}"


def without_urls(text: str) -> str:
    """``text`` with every URL in it cut to scheme and host (and port): a webhook's
    secret path, query (``?token=``), fragment and user info never stay."""
    return _URL.sub(_origin, text) if "://" in text else text


def url_origin(url: str) -> str:
    """One URL cut to scheme and host: what an error about calling it may say."""
    return without_urls(url)


MIN_REDACTED: Final = 4
"""Payload strings (and words with a digit) shorter than this are too common in
ordinary text to take out."""
COPIED_STRETCH: Final = 12
"""A stretch this long copied from a payload string is payload, wherever it was
cut (pydantic's ``input_value`` excerpt, a library's ``near '...'``)."""
REDACTED: Final = "<payload>"
MESSAGE_READ: Final = 20_000
"""Characters of a message read for redaction (kept texts are cut far shorter)."""

_WORD: Final = re.compile(r"\w[\w.\-/+@]*\w|\w")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():  # field names are the model's, not the payload's
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def without_payload(message: str, payload_json: str | None) -> str:
    """``message`` with the payload's text taken out, as ``<payload>``:

    - every string of the payload (and the whole payload) of 4+ characters;
    - every word of 4+ characters with a digit in it found in a payload string
      (a card number, an account, a phone number inside a longer note);
    - every stretch of 12+ characters copied from a payload string, wherever it
      starts and ends (a cut excerpt of a prompt).
    """
    if not payload_json or not message:
        return message
    message = message[:MESSAGE_READ]
    try:
        data = loads(payload_json)  # depth-bounded: _strings recurses
    except ValueError:
        data = payload_json
    strings = [payload_json, *_strings(data)]
    needles = {s for s in strings if len(s) >= MIN_REDACTED}
    for s in strings:
        for word in _WORD.findall(s):
            if len(word) >= MIN_REDACTED and any(c.isdigit() for c in word):
                needles.add(word)
    for needle in sorted(needles, key=len, reverse=True):
        message = message.replace(needle, REDACTED)
    return _without_stretches(message, strings)


def _without_stretches(message: str, strings: list[str]) -> str:
    n = COPIED_STRETCH
    if len(message) < n:
        return message
    # Hashes, not the slices themselves: a 400 KB payload gives 400,000 windows.
    grams = {hash(s[i : i + n]) for s in strings[1:] if len(s) >= n for i in range(len(s) - n + 1)}
    if not grams:
        return message
    out: list[str] = []
    i = 0
    while i < len(message):
        if hash(message[i : i + n]) in grams:
            end = i + n
            # Grow the stretch while each next window is copied too.
            while end < len(message) and hash(message[end - n + 1 : end + 1]) in grams:
                end += 1
            out.append(REDACTED)
            i = end
        else:
            out.append(message[i])
            i += 1
    return "".join(out)


def validation_text(error: Any) -> str | None:
    """A pydantic ``ValidationError`` said without the input it refused: ``N
    validation error(s) for Model: field: message; ...``. None for any other
    exception. Read by shape (``errors(include_input=...)``), so the core needs no
    pydantic: the value pydantic quotes (``input_value='...'``, cut in the middle)
    is exactly what must not reach a reason."""
    errors = getattr(error, "errors", None)
    title = getattr(error, "title", None)
    if not callable(errors) or not isinstance(title, str):
        return None
    try:
        items = errors(include_input=False, include_url=False, include_context=False)
    except TypeError:
        return None
    parts: list[str] = []
    for item in list(items)[:5]:
        if not isinstance(item, dict):
            return None
        loc = ".".join(str(p) for p in item.get("loc", ())) or "<value>"
        parts.append(f"{loc}: {item.get('msg', '')}")
    count = len(items)
    more = f"; and {count - 5} more" if count > 5 else ""
    return f"{count} validation error(s) for {title}: {'; '.join(parts)}{more}"


def outside_text(message: str, payload_json: str | None = None) -> str:
    """What may be kept of a text from outside (an exception's message) in a
    reason, a journal event or an attempt log: URLs cut to scheme and host, the
    payload's text taken out."""
    return without_payload(without_urls(message), payload_json)


def message_of(error: BaseException, payload_json: str | None = None) -> str:
    """An exception's message as it may be kept (:func:`outside_text`; a pydantic
    error without its input values)."""
    said = validation_text(error)
    return outside_text(str(error) if said is None else said, payload_json)
