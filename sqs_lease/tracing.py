"""An optional OpenTelemetry hook: spans from the journal (``pip install 'sqs-lease[otel]'``).

:class:`OtelSpans` is a journal sink (``Journal.add_sink``), like the metrics: the
worker shells sequence nothing new for it. It opens ``sqs_lease.attempt`` at each
claim and ends it at the attempt's end (commit, rejected commit, failure, retry,
park, loss). Its children: ``sqs_lease.claim`` (the conditional claim write and
the lease it set), each tool call (``ctx.effect`` or ``ctx.tool_request``) as
``sqs_lease.tool_call``, and ``sqs_lease.commit`` (the fenced result write and the
message's delete; a rejected one too, outcome ``rejected``). A tool call's span
starts and ends as the journal sees it start and end; the claim and commit spans
end when the journal sees ``job_claimed`` / ``result_committed`` /
``result_rejected`` and start the measured time before (``claim_seconds``,
``commit_seconds``, ``write_seconds``: the flows' own stamps, on the lease clock).
The attempt span also carries them as events (``claimed``, ``committed``,
``commit_rejected``). Attributes are ids, tokens, attempt numbers and outcomes,
never payloads. Only ``opentelemetry-api`` is imported: with no SDK configured,
spans are no-ops.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from ._errors import ConfigError

__all__ = ["OtelSpans"]

_ENDS = {
    "result_committed": "committed",
    "result_rejected": "commit_rejected",
    "job_failed": "failed",
    "job_retry_scheduled": "retry",
    "job_parked": "parked",
    "job_abandoned": "abandoned",
    "result_discarded": "discarded",
    "heartbeat_lost": "lease_lost",
    "job_release_skipped": "release_skipped",
}
_TOOL_ENDS = ("tool_request_finished", "tool_request_failed")
_COMMITS = {"result_committed": "commit_seconds", "result_rejected": "write_seconds"}


class OtelSpans:
    """A journal sink that turns attempts and tool calls into OpenTelemetry spans."""

    def __init__(self, tracer: Any = None) -> None:
        try:
            from opentelemetry import trace
        except ImportError:
            raise ConfigError(
                "tracing needs the opentelemetry-api package: pip install 'sqs-lease[otel]'"
                " (or turn tracing off: SQS_LEASE_OTEL=false)"
            ) from None
        self._trace = trace
        self._tracer = tracer if tracer is not None else trace.get_tracer("sqs_lease")
        self._lock = threading.Lock()
        self._attempts: dict[str, tuple[int | None, Any]] = {}
        self._tools: dict[tuple[str, Any, Any], Any] = {}

    def __call__(self, event: str, fields: Mapping[str, Any]) -> None:
        """Take one journal event (the ``Journal`` sink signature)."""
        job_id = fields.get("job_id")
        if not isinstance(job_id, str):
            if event in ("messages_released", "worker_stopped"):
                self._end_all("released")
            return
        token = fields.get("token")
        with self._lock:
            if event == "job_claimed":
                end = time.time_ns()
                start = end - _nanos(fields.get("claim_seconds"))
                span = self._tracer.start_span(
                    "sqs_lease.attempt",
                    attributes=_attrs(
                        fields, ("job_id", "job_class", "token", "attempt", "reclaimed")
                    ),
                    start_time=start,
                )
                self._child(span, "sqs_lease.claim", fields, start, end, "claimed")
                span.add_event("claimed")
                old = self._attempts.pop(job_id, None)
                if old is not None:
                    old[1].end()
                self._attempts[job_id] = (token if isinstance(token, int) else None, span)
            elif event == "tool_request_started":
                parent = self._attempts.get(job_id)
                context = self._trace.set_span_in_context(parent[1]) if parent is not None else None
                span = self._tracer.start_span(
                    "sqs_lease.tool_call",
                    context=context,
                    attributes=_attrs(fields, ("job_id", "tool", "action", "token", "attempt")),
                )
                self._tools[(job_id, fields.get("key"), fields.get("attempt"))] = span
            elif event in _TOOL_ENDS:
                span = self._tools.pop((job_id, fields.get("key"), fields.get("attempt")), None)
                if span is not None:
                    span.set_attribute("sqs_lease.outcome", event.removeprefix("tool_request_"))
                    if event == "tool_request_failed":
                        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
                    span.end()
            elif event in _ENDS:
                held = self._attempts.get(job_id)
                if held is None or (isinstance(token, int) and held[0] not in (None, token)):
                    return
                del self._attempts[job_id]
                outcome = _ENDS[event]
                if event in _COMMITS:
                    end = time.time_ns()
                    start = end - _nanos(fields.get(_COMMITS[event]))
                    done = "committed" if event == "result_committed" else "rejected"
                    self._child(held[1], "sqs_lease.commit", fields, start, end, done)
                held[1].add_event(outcome)
                held[1].set_attribute("sqs_lease.outcome", outcome)
                held[1].end()

    def _child(
        self, parent: Any, name: str, fields: Mapping[str, Any], start: int, end: int, outcome: str
    ) -> None:
        """A finished child span of ``parent`` from ``start`` to ``end`` (ns, epoch)."""
        span = self._tracer.start_span(
            name,
            context=self._trace.set_span_in_context(parent),
            attributes=_attrs(fields, ("job_id", "token", "attempt")),
            start_time=start,
        )
        span.set_attribute("sqs_lease.outcome", outcome)
        span.end(end_time=end)

    def _end_all(self, outcome: str) -> None:
        with self._lock:
            spans = [s for _, s in self._attempts.values()] + list(self._tools.values())
            self._attempts.clear()
            self._tools.clear()
        for span in spans:
            span.set_attribute("sqs_lease.outcome", outcome)
            span.end()


def _nanos(seconds: Any) -> int:
    """A measured duration in ns (0 when the event carries none)."""
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0:
        return int(seconds * 1e9)
    return 0


def _attrs(fields: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        value = fields.get(name)
        if isinstance(value, str | int | float | bool):
            out[f"sqs_lease.{name}"] = value
    return out
