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

Levels: each event's level is :data:`EVENT_LEVELS` (failures WARNING or ERROR,
routine events INFO), the one table; an event it does not name is INFO.

How a record carries the event (``merge_fields``): by default its message is the
event as one JSON object (for formatters that print ``%(message)s``: Lambda's text
log format, a plain handler); with ``merge_fields`` its message is the event's name
and every field is an attribute of the record, which formatters that merge a
record's extra attributes put at the top level of their own JSON object (Lambda's
JSON log format, Powertools' Logger): never a JSON string inside a JSON log line.
:func:`merges_fields` picks the way from the runtime's settings unless told.
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

_W, _E = logging.WARNING, logging.ERROR
EVENT_LEVELS: Mapping[str, int] = {
    # A worker cannot go on, or a job's outcome is unknown: someone must act.
    "aws_lost": _E,
    "heartbeat_error": _E,
    "intent_ambiguous": _E,
    "job_record_unreadable": _E,
    "job_write_refused": _E,
    "lambda_budget_never_fits": _E,
    "lambda_record_failed": _E,
    "stranded_sweep_failed": _E,
    "dlq_reconcile_failed": _E,
    "effect_applied_late": _E,
    "idempotency_record_lost": _E,
    # Failures the toolkit handled, that an operator should see.
    "backpressure_on": _W,
    "effect_failed": _W,
    "fence_header_rejected": _W,
    "fence_rejected": _W,
    "heartbeat_lost": _W,
    "idempotency_mismatch": _W,
    "intent_refused": _W,
    "intent_start_refused": _W,
    "job_abandoned": _W,
    "job_class_unknown": _W,
    "job_dead_lettered": _W,
    "job_failed": _W,
    "job_parked": _W,
    "job_reclaimed": _W,
    "job_send_failed": _W,
    "job_submit_flag_unset": _W,
    "lambda_record_not_taken": _W,
    "lambda_record_unreadable": _W,
    "lambda_visibility_too_short": _W,
    "lambda_fifo_batch_too_large": _W,
    "unsent_restamped": _W,  # a clock is off by about ahead_by
    "unsent_restamp_failed": _W,
    "lease_dropped": _W,
    "lease_dropped_late": _W,
    "liveness_failed": _W,
    "loop_blocked": _W,
    "message_delete_failed": _W,
    "message_poisoned": _W,
    "message_stray": _W,
    "ownership_unknown": _W,
    "progress_refused": _W,
    "receive_failed": _W,
    "redrive_too_tight": _W,
    "rejected_result_kept": _W,
    "result_discarded": _W,
    "result_rejected": _W,
    "stage_budget_capped": _W,
    "tool_request_failed": _W,
    "worker_exit_forced": _W,
    "worker_late_charged": _W,
    # Routine: what happened, for the record.
    **dict.fromkeys(
        (
            "backpressure_off",
            "claim_deferred",
            "dlq_reconciled",
            "effect_applied",
            "effect_retryable",
            "fence_mark_reset",
            "group_cancelled",
            "heartbeat_ok",
            "idempotency_in_flight",
            "idempotency_replayed",
            "intent_confirmed",
            "intent_held_elsewhere",
            "intent_prepared",
            "intent_reconciled",
            "intent_replayed",
            "intent_resolution_finished",
            "intent_resolved",
            "intent_started",
            "intent_successor_followed",
            "intent_taken_over",
            "intent_write_retried",
            "job_already_done",
            "job_cancel_noop",
            "job_cancelled",
            "job_claimed",
            "job_parked_skip",
            "job_release_skipped",
            "job_resent",
            "job_resume_skipped",
            "job_resumed",
            "job_retried",
            "job_retry_scheduled",
            "job_send_superseded",
            "job_send_taken",
            "job_submit_duplicate",
            "job_submitted",
            "job_waiting_for_slot",
            "lambda_record_not_started",
            "lambda_record_waits",
            "lambda_sweep_done",
            "loop_unblocked",
            "messages_released",
            "ownership_wait",
            "progress_saved",
            "result_committed",
            "stage_committed",
            "stranded_swept",
            "tool_request_finished",
            "tool_request_started",
            "unsent_entry_cleared",
            "worker_started",
            "worker_stopped",
            "worker_stopping",
        ),
        logging.INFO,
    ),
}
"""Every event's log level, the one table (a test checks it names every event the
code journals). Failures are WARNING or ERROR, so they reach a log whose level is
WARNING (Lambda's default); routine events are INFO."""


def event_level(event: str) -> int:
    """The level ``event`` is logged at: :data:`EVENT_LEVELS`, else INFO (an event a
    user's own code journals)."""
    return EVENT_LEVELS.get(event, logging.INFO)


# Names a log record, Lambda's JSON log format or Powertools' Logger keep for
# themselves: a field of that name is renamed ``journal_<name>`` when fields are
# merged into the record (``message``, say: a submit's duplicate outcome).
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "timestamp",
    "level",
    "logger",
    "location",
    "requestId",
    "tenantId",
    "stackTrace",
    "errorType",
    "errorMessage",
    "aws_request_id",
    "tenant_id",
    "service",
    "xray_trace_id",
    "exception",
    "exception_name",
}


class Journal:
    """Writes events to the ``sqs_lease.journal`` logger as one JSON object each."""

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        include_bodies: bool = False,
        logger: logging.Logger | None = None,
        merge_fields: bool | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.include_bodies = include_bodies
        self.merge_fields = merge_fields
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
        line = json.dumps(record, default=str, separators=(",", ":"))
        level = event_level(event)
        if self.logger.isEnabledFor(level):
            merge = self.merge_fields
            if merge is None:
                merge = merges_fields(self.logger, os.environ)
            if merge:
                # JSON-native values only: Lambda's JSON formatter has no fallback.
                fields_ = {
                    (f"journal_{k}" if k in _RESERVED else k): v for k, v in _loads(line).items()
                }
                self.logger.log(level, event, extra=fields_)
            else:
                self.logger.log(level, line)
        for sink in self.sinks:
            try:
                sink(event, record)
            except Exception:  # a metrics or tracing fault must never stop a worker
                logging.getLogger(__name__).exception("journal sink %r failed", sink)

    def __call__(self, event: str, **fields: Any) -> None:
        self.write(event, fields)


_PLAIN = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
}


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record: a journal event as it was journaled (either way
    ``merge_fields`` chose); other records wrapped as ``{"log": ...}``."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.name == LOGGER_NAME or record.name.startswith(LOGGER_NAME + "."):
            if msg.startswith("{"):
                return msg
            fields = {k: v for k, v in record.__dict__.items() if k not in _PLAIN}
            if fields.get("event") == msg:
                return json.dumps(fields, default=str, separators=(",", ":"))
        return json.dumps({"log": msg, "level": record.levelname, "logger": record.name})


def configure_for_lambda(journal: Journal, environ: Mapping[str, str]) -> None:
    """Make the journal reach a Lambda function's log under the runtime's logging:
    the runtime leaves the root logger at WARNING unless ``AWS_LAMBDA_LOG_LEVEL`` is
    set; then the journal keeps its events at INFO and up (failures are WARNING or
    ERROR either way). A level the operator set (that variable, or one set on the
    journal's logger) is kept. The shape of each record is :func:`merges_fields`'."""
    logger = journal.logger
    if logger.level == logging.NOTSET and not environ.get("AWS_LAMBDA_LOG_LEVEL"):
        logger.setLevel(logging.INFO)


def merges_fields(logger: logging.Logger, environ: Mapping[str, str]) -> bool:
    """Whether a journal that was not told (``merge_fields=None``) merges its fields
    into the record: under Lambda's JSON log format (``AWS_LAMBDA_LOG_FORMAT=JSON``),
    or where a handler its records reach formats with Powertools' Logger (handed to
    the journal's logger by ``copy_config_to_registered_loggers``). Asked at each
    write, so a producer's journal in a function follows the same rule."""
    if environ.get("AWS_LAMBDA_LOG_FORMAT", "").upper() == "JSON":
        return True
    current: logging.Logger | None = logger
    while current is not None:
        for h in current.handlers:
            if type(h.formatter).__module__.startswith("aws_lambda_powertools"):
                return True
        current = current.parent if current.propagate else None
    return False


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
