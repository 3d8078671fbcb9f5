"""The worker's output for people (``sqs-lease worker --output human``).

The JSON journal stays the machines' format (the default). This module renders
the same events as short readable lines and, on a terminal, keeps one status
line at the bottom (jobs in flight, done, failed, the last event), redrawn as
events arrive and once a second. Events are read from the journal logger, so the
worker knows nothing of how it is shown.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, TextIO

from ._core.inputs import loads as _loads
from ._core.texts import visible
from ._journal import LOGGER_NAME

StatusSource = Callable[[], Mapping[str, int]]
"""Counters for the status line: ``in_flight``, ``committed``, ``failed``, ... ."""

ALERTS = frozenset(
    {
        "heartbeat_lost",
        "heartbeat_error",
        "ownership_unknown",
        "lease_dropped",
        "result_rejected",
        "result_discarded",
        "message_poisoned",
        "job_failed",
        "job_parked",
        "job_record_unreadable",
        "job_write_refused",
        "intent_ambiguous",
        "effect_applied_late",
        "redrive_too_tight",
        "receive_failed",
        "stranded_sweep_failed",
    }
)
"""Events marked ``!`` in the human output: the ones docs/operations.md says to act on."""

QUIET = frozenset({"heartbeat_ok"})
"""Events too frequent to print one line each; they still count as the last event."""

_SKIP = frozenset({"event", "ts", "worker", "job_id"})
_CLEAR = "\r\x1b[2K"

SHORTENED = frozenset(
    {"payload_hash", "message_id", "dlq_message_id", "request_id", "send_id", "previous_owner"}
)
"""Machine identifiers (64-hex hashes, UUIDs) a person matches by their first
characters: shown as their first :data:`SHORT` (``--details`` shows them whole; the
JSON journal always has them whole)."""
SHORT = 8


def render_event(
    record: Mapping[str, Any], *, details: bool = False, width: int | None = None
) -> str:
    """One journal event as one readable line: time, mark, event, job, then fields.

    Without ``details`` the :data:`SHORTENED` identifiers are cut to their first
    characters (``…`` marks the cut); with ``width`` (a terminal's) a longer line is
    cut to fit, ending in ``…``. Every text in it comes from outside (job ids,
    reasons, exception texts) and is shown with its control characters made
    visible: a line can never move the cursor, set the title or reach the
    clipboard."""
    ts = record.get("ts")
    clock = datetime.fromtimestamp(ts).strftime("%H:%M:%S") if isinstance(ts, int | float) else ""
    event = str(record.get("event", "?"))
    mark = "!" if event in ALERTS else " "
    job = record.get("job_id")
    parts = [f"{clock} {mark} {visible(event):<22}"]
    if job is not None:
        parts.append(f"job {visible(job)}")
    for key, value in record.items():
        if key in _SKIP or value is None:
            continue
        shown = _value(value)
        if not details and key in SHORTENED and len(shown) > SHORT + 1:
            shown = shown[:SHORT] + "…"
        parts.append(f"{visible(key)}={shown}")
    line = "  ".join(parts).rstrip()
    if width is not None and len(line) > width:
        line = line[: max(1, width - 1)] + "…"
    return line


def _value(value: Any) -> str:
    if isinstance(value, str) and value and " " not in value and "=" not in value:
        return visible(value)
    # JSON escapes C0 controls but not DEL, C1 or bidi overrides: those are made visible.
    return visible(json.dumps(value, default=str, separators=(",", ":"), ensure_ascii=False))


class HumanConsole(logging.Handler):
    """Journal events as readable lines on ``stream``; with ``live`` (default: the
    stream is a terminal) a status line is kept at the bottom.

    Use as a context manager: it attaches to the journal logger on entry and
    detaches (clearing the status line) on exit. ``watch`` names the counters.
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        live: bool | None = None,
        refresh: float = 1.0,
        clock: Callable[[], float] = time.time,
        details: bool = False,
    ) -> None:
        super().__init__(logging.INFO)
        self.stream = stream
        self.live = _isatty(stream) if live is None else live
        self.details = details  # whole identifiers, lines not cut to the terminal
        self.refresh = refresh
        self.clock = clock
        self._status: StatusSource | None = None
        self._last: tuple[str, str | None, float] | None = None
        self._shown = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._saved: tuple[int, bool, list[logging.Handler]] | None = None

    def watch(self, status: StatusSource) -> None:
        """Where the status line's counters come from (e.g. the worker's)."""
        self._status = status

    # ------------------------------------------------------------- logging

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = _loads(record.getMessage())
        except ValueError:
            data = {"event": "log", "message": record.getMessage()}
        if not isinstance(data, dict):
            data = {"event": "log", "message": str(data)}
        event = str(data.get("event", "?"))
        self._last = (event, data.get("job_id"), self.clock())
        # On a terminal a line fits its width (the journal's JSON has every field);
        # an alert keeps its whole reason, which says what to do
        fit = self.live and not self.details and event not in ALERTS
        width = _columns() - 1 if fit else None
        line = None if event in QUIET else render_event(data, details=self.details, width=width)
        self._write(line)

    def status_line(self) -> str:
        """The status line as it would be drawn now."""
        counts = dict(self._status()) if self._status is not None else {}
        bits = [
            f"in flight {counts.get('in_flight', 0)}",
            f"done {counts.get('committed', 0)}",
            f"failed {counts.get('failed', 0)}",
        ]
        for name in ("retried", "parked", "lost"):
            if counts.get(name):
                bits.append(f"{name} {counts[name]}")
        if self._last is not None:
            event, job, at = self._last
            ago = max(0.0, self.clock() - at)
            said = visible(f"{event}{' ' + str(job) if job else ''}")
            bits.append(f"last: {said} ({ago:.0f}s ago)")
        return " | ".join(bits)

    def _write(self, line: str | None) -> None:
        # Called with the handler's lock held (logging) or taken (the ticker).
        out: list[str] = []
        if self.live and self._shown:
            out.append(_CLEAR)
        if line is not None:
            out.append(line + "\n")
        if self.live:
            out.append(self.status_line()[: max(10, _columns() - 1)])
            self._shown = True
        try:
            self.stream.write("".join(out))
            self.stream.flush()
        except (OSError, ValueError):  # a closed terminal must not stop the worker
            pass

    def _tick(self) -> None:
        while not self._stop.wait(self.refresh):
            self.acquire()
            try:
                self._write(None)
            finally:
                self.release()

    # ------------------------------------------------------------- lifetime

    def __enter__(self) -> HumanConsole:
        logger = logging.getLogger(LOGGER_NAME)
        # This replaces the JSON lines on stderr (configure_stderr's handler) meanwhile.
        json_lines = [h for h in logger.handlers if getattr(h, "_sqs_lease", False)]
        self._saved = (logger.level, logger.propagate, json_lines)
        for h in json_lines:
            logger.removeHandler(h)
        logger.addHandler(self)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        if self.live:
            self._ticker = threading.Thread(target=self._tick, name="status-line", daemon=True)
            self._ticker.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        logger = logging.getLogger(LOGGER_NAME)
        logger.removeHandler(self)
        if self._saved is not None:
            level, propagate, json_lines = self._saved
            logger.setLevel(level)
            logger.propagate = propagate
            for h in json_lines:
                logger.addHandler(h)
        if self.live and self._shown:
            self.acquire()
            try:
                # Leave the last status on screen as the final word, on its own line.
                self.stream.write(_CLEAR + self.status_line() + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            finally:
                self.release()


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _columns() -> int:
    return shutil.get_terminal_size((100, 24)).columns
