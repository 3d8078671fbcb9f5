"""The journal: structured JSON events through stdlib logging, never payloads.

Events have stable names (``job_claimed``, ``heartbeat_ok``, ``heartbeat_lost``,
``ownership_unknown``, ``result_committed``, ``result_rejected``, ...). Fields
carry ids, tokens, hashes, durations and error codes. Payloads, results, prompts
and tool responses are dropped here as a last line of defence, whatever a caller
passes, unless ``include_bodies`` was chosen explicitly; a dropped field is named
in the event's ``dropped`` list, never silently lost. An external request id
goes in ``request_id`` (kept: it is an id, not a body; ``request`` is a body).
Wall-clock times a person reads (``last_confirmed_at``) also get a ``..._utc``
ISO 8601 twin.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ._core.inputs import loads as _loads

LOGGER_NAME = "sqs_lease.journal"
_WALL_FIELDS = frozenset({"last_confirmed_at"})

Sink = Callable[[str, Mapping[str, Any]], None]
"""A listener fed every event (name, fields) after bodies were dropped: metrics,
traces. It runs on the thread that journaled the event and must not block."""
_BODY_FIELDS = frozenset(
    {"payload", "result", "prompt", "response", "body", "request", "tool_response", "args"}
)


class Journal:
    """Writes events to the ``sqs_lease.journal`` logger as one JSON object each."""

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        include_bodies: bool = False,
        logger: logging.Logger | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.include_bodies = include_bodies
        self.logger = logger or logging.getLogger(LOGGER_NAME)
        self.sinks: list[Sink] = []

    def add_sink(self, sink: Sink) -> None:
        """Feed every later event to ``sink`` too (after bodies were dropped)."""
        self.sinks.append(sink)

    def write(self, event: str, fields: Mapping[str, Any] | None = None) -> None:
        record: dict[str, Any] = {"event": event, "ts": round(time.time(), 3)}
        if self.worker_id:
            record["worker"] = self.worker_id
        dropped: list[str] = []
        for key, value in (fields or {}).items():
            if key in _BODY_FIELDS and not self.include_bodies:
                dropped.append(key)
                continue
            record[key] = value
            if key in _WALL_FIELDS and isinstance(value, (int, float)):
                stamp = datetime.fromtimestamp(value, UTC).isoformat(timespec="milliseconds")
                record[f"{key}_utc"] = stamp
        if dropped:
            record["dropped"] = sorted(dropped)
        self.logger.info(json.dumps(record, default=str, separators=(",", ":")))
        for sink in self.sinks:
            try:
                sink(event, record)
            except Exception:  # a metrics or tracing fault must never stop a worker
                logging.getLogger(__name__).exception("journal sink %r failed", sink)

    def __call__(self, event: str, **fields: Any) -> None:
        self.write(event, fields)


class JsonLineFormatter(logging.Formatter):
    """Journal records are already JSON; other records are wrapped as ``{"log": ...}``."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.name == LOGGER_NAME:
            return msg
        return json.dumps({"log": msg, "level": record.levelname, "logger": record.name})


def read_journal(*paths: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The journal events (JSON objects with an ``event``) of files written by the
    JSON formatter, in file order. Other lines, a half line a killed process left,
    and missing files are skipped."""
    out: list[dict[str, Any]] = []
    for path in paths:
        p = Path(path)
        if not p.exists():
            continue
        for line in p.read_text(errors="replace").splitlines():
            try:
                ev = _loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and "event" in ev:
                out.append(ev)
    return out


def configure_stderr(level: int = logging.INFO) -> None:
    """Send journal lines to stderr, one JSON object per line (idempotent)."""
    logger = logging.getLogger(LOGGER_NAME)
    for h in logger.handlers:
        if getattr(h, "_sqs_lease", False) and isinstance(h, logging.StreamHandler):
            h.setStream(sys.stderr)  # stderr may have been swapped since the first call
            break
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLineFormatter())
        handler._sqs_lease = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
