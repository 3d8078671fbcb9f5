"""Metrics an operator can alarm on, in CloudWatch Embedded Metric Format (EMF).

A journal sink: :class:`EmfMetrics` is fed every journal event (``Journal.add_sink``)
and derives every figure from them, so the worker shells sequence nothing new.
:meth:`EmfMetrics.flush` writes one EMF document per dimension set (job class, and
the class's declared ``model``/``provider``) to a stream, stdout by default: in
ECS with the ``awslogs`` driver, and in Lambda, CloudWatch Logs extracts the
metrics from those lines. The documents are built and serialised by
``aws-embedded-metrics`` (``MetricsContext`` + ``LogSerializer``: the format, the
100-metrics and 100-values limits). Its ``MetricsLogger`` is not used: its
environment detection probes the EC2 metadata address and otherwise defaults to a
TCP agent, and it adds ``LogGroup``/``ServiceName``/``ServiceType`` to every
dimension set. Install with ``pip install 'sqs-lease[metrics]'``.

Only names, counts and durations are written: never payloads, results, reasons
or job ids (the journal has dropped bodies before a sink sees an event).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from ._core.inputs import loads as _loads
from ._errors import ConfigError
from ._jobs import App, JobClass

__all__ = [
    "DEFAULT_NAMESPACE",
    "METRICS",
    "EmfMetrics",
    "MetricSpec",
    "MetricsFlusher",
    "dimensions_of",
]

DEFAULT_NAMESPACE = "SqsLease"

Unit = Literal["Seconds", "Count"]
Kind = Literal["counter", "gauge", "values"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its CloudWatch name, unit, kind and what it is derived from."""

    name: str
    unit: Unit
    kind: Kind
    source: str
    meaning: str


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "LastHeartbeatAge",
        "Seconds",
        "gauge",
        "`job_claimed`, `heartbeat_ok` (at each flush)",
        "the oldest confirmation among the jobs held: seconds since the claim or the "
        "last heartbeat that extended and confirmed the lease",
    ),
    MetricSpec(
        "LeaseTimeLeft",
        "Seconds",
        "gauge",
        "`job_claimed`, `heartbeat_ok` (at each flush)",
        "the least lease time left among the jobs held, on the worker's clock",
    ),
    MetricSpec(
        "ExpiredLeases",
        "Count",
        "counter",
        "`lease_dropped` with `reason` `lease_reserve_spent`; `lease_dropped_late`",
        "leases the heartbeat could not extend before their reserve ran out",
    ),
    MetricSpec(
        "LostLeases",
        "Count",
        "counter",
        "`heartbeat_lost`",
        "attempts whose lease another claim (or a cancel) took",
    ),
    MetricSpec(
        "ExtensionFailures",
        "Count",
        "counter",
        "`ownership_unknown`",
        "heartbeat rounds that could not extend and confirm a job's lease",
    ),
    MetricSpec(
        "ReclaimedJobs",
        "Count",
        "counter",
        "`job_reclaimed`",
        "claims that took a job from a running owner whose heartbeat stopped (a lapsed lease)",
    ),
    MetricSpec(
        "RejectedResults",
        "Count",
        "counter",
        "`result_rejected`",
        "commits refused because the token had moved (a stale owner)",
    ),
    MetricSpec(
        "AmbiguousIntents",
        "Count",
        "counter",
        "`intent_ambiguous`",
        "effects whose outcome nobody can tell: an operator must resolve them",
    ),
    MetricSpec(
        "LateEffects",
        "Count",
        "counter",
        "`effect_applied_late`",
        "effects whose own answer came after a later attempt started or an operator "
        "settled the intent otherwise: look for a second effect",
    ),
    MetricSpec(
        "ParkedJobs",
        "Count",
        "counter",
        "`job_parked`, `job_dead_lettered`",
        "jobs parked for an operator",
    ),
    MetricSpec("JobsClaimed", "Count", "counter", "`job_claimed`", "attempts started"),
    MetricSpec("JobsSucceeded", "Count", "counter", "`result_committed`", "results committed"),
    MetricSpec("JobsFailed", "Count", "counter", "`job_failed`", "jobs ended `failed`"),
    MetricSpec(
        "JobsRetried", "Count", "counter", "`job_retry_scheduled`", "attempts ended for a retry"
    ),
    MetricSpec(
        "JobDuration",
        "Seconds",
        "values",
        "`result_committed` `duration`",
        "the handler's time of each committed attempt",
    ),
    MetricSpec(
        "Attempts",
        "Count",
        "values",
        "`result_committed` `attempt`",
        "the attempt that succeeded (1: first try)",
    ),
)
"""Every metric :class:`EmfMetrics` writes (docs/operations.md lists them; a test checks)."""

_COUNTER_OF: dict[str, str] = {
    "heartbeat_lost": "LostLeases",
    "ownership_unknown": "ExtensionFailures",
    "job_reclaimed": "ReclaimedJobs",
    "result_rejected": "RejectedResults",
    "intent_ambiguous": "AmbiguousIntents",
    "effect_applied_late": "LateEffects",
    "job_parked": "ParkedJobs",
    "job_dead_lettered": "ParkedJobs",  # a DLQ reconciliation parked it
    "job_claimed": "JobsClaimed",
    "result_committed": "JobsSucceeded",
    "job_failed": "JobsFailed",
    "job_retry_scheduled": "JobsRetried",
}
# Events that end the attempt they name (its lease is no longer held here).
_ENDS_ATTEMPT = frozenset(
    {
        "result_committed",
        "result_rejected",
        "job_failed",
        "job_retry_scheduled",
        "job_parked",
        "job_abandoned",
        "result_discarded",
        "heartbeat_lost",
        "job_release_skipped",
    }
)
_SPECS = {m.name: m for m in METRICS}

Dimensions = tuple[tuple[str, str], ...]


@dataclass
class _Held:
    job_class: str
    token: int | None
    confirmed_at: float  # the claim or the last heartbeat_ok, on this process's clock
    lease_left: float | None  # at confirmed_at


@dataclass
class _Bucket:
    counters: dict[str, int] = field(default_factory=dict)
    values: dict[str, list[float]] = field(default_factory=dict)


class EmfMetrics:
    """A journal sink that turns events into CloudWatch EMF documents.

    ``app`` gives the job classes (every class gets its counters, zero included, so
    alarms see data) and their declared ``model``/``provider`` dimensions.
    Thread-safe: events come from every job thread and the heartbeat thread.
    """

    def __init__(
        self,
        app: App | None = None,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        try:
            from aws_embedded_metrics.validator import validate_namespace
        except ImportError:
            raise ConfigError(
                "metrics need the aws-embedded-metrics package: pip install 'sqs-lease[metrics]'"
                " (or turn metrics off: SQS_LEASE_METRICS=false)"
            ) from None
        try:
            validate_namespace(namespace)
        except Exception as exc:
            raise ConfigError(
                f"metrics namespace {namespace!r}: {exc}; choose 1-255 characters of "
                "letters, digits and .-_/#:"
            ) from None
        self.namespace = namespace
        self._stream = stream
        self._clock = clock
        self._lock = threading.Lock()
        self._dims: dict[str, Dimensions] = {}
        for name, reg in (app.classes if app is not None else {}).items():
            self._dims[name] = tuple(dimensions_of(reg.job_class).items())
        self._held: dict[str, _Held] = {}
        self._buckets: dict[Dimensions, _Bucket] = {}

    def __call__(self, event: str, fields: Mapping[str, Any]) -> None:
        """Take one journal event (the ``Journal`` sink signature)."""
        now = self._clock()
        job_id = fields.get("job_id")
        with self._lock:
            held = self._held.get(job_id) if isinstance(job_id, str) else None
            job_class = fields.get("job_class")
            if not isinstance(job_class, str):
                job_class = held.job_class if held is not None else None
            counter = _COUNTER_OF.get(event)
            if (
                event == "lease_dropped" and fields.get("reason") == "lease_reserve_spent"
            ) or event == "lease_dropped_late":
                counter = "ExpiredLeases"
            if counter is not None:
                bucket = self._buckets.setdefault(self._dims_of(job_class), _Bucket())
                bucket.counters[counter] = bucket.counters.get(counter, 0) + 1
                if event == "result_committed":
                    _add(bucket, "JobDuration", _number(fields, "duration"))
                    _add(bucket, "Attempts", _number(fields, "attempt"))
            if not isinstance(job_id, str):
                if event in ("messages_released", "worker_stopped"):
                    # A shutdown hand-back names no job: everything held is given back.
                    self._held.clear()
                return
            token = fields.get("token")
            token = token if isinstance(token, int) else None
            if event == "job_claimed" and job_class is not None:
                self._held[job_id] = _Held(job_class, token, now, _number(fields, "lease_seconds"))
            elif event == "heartbeat_ok" and held is not None and token == held.token:
                held.confirmed_at = now
                held.lease_left = _number(fields, "lease_left")
            elif (
                event in _ENDS_ATTEMPT
                and held is not None
                and (token is None or held.token is None or token == held.token)
            ):
                del self._held[job_id]

    def _dims_of(self, job_class: str | None) -> Dimensions:
        name = job_class or "unknown"
        if name not in self._dims:
            self._dims[name] = _dimensions(name, None, None)
        return self._dims[name]

    def documents(self) -> list[dict[str, Any]]:
        """Take what was counted since the last call, as EMF documents (parsed JSON)."""

        return [_loads(line) for line in self._serialize()]

    def flush(self) -> int:
        """Write what was counted since the last flush; return the number of documents."""
        lines = self._serialize()
        stream = self._stream or sys.stdout
        for line in lines:
            stream.write(line + "\n")
        stream.flush()
        return len(lines)

    def _serialize(self) -> list[str]:
        from aws_embedded_metrics.logger.metrics_context import MetricsContext
        from aws_embedded_metrics.serializers.log_serializer import LogSerializer

        now = self._clock()
        with self._lock:
            buckets, self._buckets = self._buckets, {}
            for dims in self._dims.values():
                buckets.setdefault(dims, _Bucket())
            gauges: dict[Dimensions, dict[str, float]] = {}
            for held in self._held.values():
                g = gauges.setdefault(self._dims_of(held.job_class), {})
                age = now - held.confirmed_at
                g["LastHeartbeatAge"] = max(g.get("LastHeartbeatAge", 0.0), age)
                if held.lease_left is not None:
                    left = held.lease_left - age
                    g["LeaseTimeLeft"] = min(g.get("LeaseTimeLeft", left), left)
        lines: list[str] = []
        for dims in sorted(set(buckets) | set(gauges)):
            ctx = MetricsContext.empty()
            ctx.namespace = self.namespace
            ctx.set_dimensions([dict(dims)], use_default=False)
            bucket = buckets.get(dims, _Bucket())
            for spec in METRICS:
                if spec.kind == "counter":
                    ctx.put_metric(spec.name, bucket.counters.get(spec.name, 0), spec.unit)
                elif spec.kind == "values":
                    for v in bucket.values.get(spec.name, []):
                        ctx.put_metric(spec.name, v, spec.unit)
            for name, value in sorted(gauges.get(dims, {}).items()):
                ctx.put_metric(name, round(value, 3), _SPECS[name].unit)
            lines.extend(LogSerializer.serialize(ctx))
        return lines


class MetricsFlusher:
    """Flushes an :class:`EmfMetrics` every ``interval`` seconds on a daemon thread,
    and once more at :meth:`stop`."""

    def __init__(self, metrics: EmfMetrics, interval: float) -> None:
        if not interval > 0:
            raise ConfigError(f"metrics interval={interval}: give seconds > 0")
        self.metrics = metrics
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.metrics.flush()

    def stop(self) -> None:
        """Stop the thread and write the last figures."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.metrics.flush()


def dimensions_of(job_class: JobClass) -> dict[str, str]:
    """The one dimension set a job class's metrics are written with (``JobClass``, and
    ``Model``/``Provider`` when the class declares them): an alarm must name exactly
    these to see them (the CDK's ``LeaseMonitoring`` does)."""
    return dict(_dimensions(job_class.name, job_class.model, job_class.provider))


def _dimensions(job_class: str, model: str | None, provider: str | None) -> Dimensions:
    dims = [("JobClass", job_class)]
    if model is not None:
        dims.append(("Model", model))
    if provider is not None:
        dims.append(("Provider", provider))
    return tuple(dims)


def _number(fields: Mapping[str, Any], name: str) -> float | None:
    value = fields.get(name)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _add(bucket: _Bucket, name: str, value: float | None) -> None:
    if value is not None:
        bucket.values.setdefault(name, []).append(value)
