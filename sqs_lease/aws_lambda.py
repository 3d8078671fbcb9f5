"""The Lambda adapter: an SQS event source's batch, run through the attempt flow.

``handler(app)`` returns a Lambda handler for an SQS event source mapping with
``ReportBatchItemFailures`` turned on::

    from sqs_lease import App
    from sqs_lease.aws_lambda import handler

    app = App()
    ...
    lambda_handler = handler(app)   # the function's handler: module.lambda_handler

Or, with no module of your own, set the function's handler to
``sqs_lease.aws_lambda.entry`` and name the app in ``SQS_LEASE_APP``
(``MODULE:OBJECT``); the settings come from the environment
(``Settings.from_env``: ``SQS_LEASE_PREFIX``, ``SQS_LEASE_QUEUE``, ...), as the
CDK's ``LambdaConsumer`` sets them.

It is a shell of :func:`sqs_lease._core.attempt.attempt_flow` like the workers
(sharing with them only ``_shell.ShellBase``: options, tables, the book, the attempt
env, a handler run in the calling thread): for each record in
order it drives ``_core.invocation.record_flow`` (the simulator's Lambda drives the
same), which reads the record (``_core.eventsource.parse_event_record``), checks the
budget (``can_start``: the class's whole ``stage_budget_seconds`` plus a margin
must fit in ``context.get_remaining_time_in_millis()``), sets the record's
visibility to its class's lease (``take_record_flow``: the local lease then
counts from a moment this process measured), and drives the attempt: claim
(token + 1), the handler under a heartbeat thread that extends the record's
visibility with its receipt handle and confirms ownership, a fenced commit.

What it reports: a record is a success only when the attempt's own flows
deleted its message (a fenced end write - commit, fail, park - that DynamoDB
applied, then DeleteMessage; or a poison message copied to the DLQ). Everything
else is in ``batchItemFailures``: a handler failure (its retry backoff is set as
the message's visibility), a rejected commit (the lease was taken over), an
unknown outcome, records not started because an earlier record of their FIFO
message group failed (released: visibility 0) or for the budget (released for the
rest of the invocation, ``not_started_visibility``: not received again into the
same wave of batches).

What it deletes itself, and why: the message of every record it ends, right
after the fenced write, as every worker does. The mapping deletes the successes
only when the invocation returns; a function that times out or crashes after
committing some records returns nothing, and their messages would come back to
meet a terminal record. Deleting at once keeps that window short, and the
mapping's own delete of an already deleted message is harmless. Correctness
never depends on either delete: a redelivered message of a finished job is
recognised at its claim and deleted then.

The sweep. A consumer runs only when messages arrive, so it cannot find a job
that has none: a record a producer wrote and died before sending, a failed send,
an unsent continuation, a job whose message SQS moved to the DLQ. A scheduled
function finds them: ``sweeper(app)`` (or the handler ``sqs_lease.aws_lambda.
sweep_entry`` with ``SQS_LEASE_APP``) answers an EventBridge scheduled event by
running the workers' sweep (``_core.sweeps.sweep_pages_flow``) to the end of the
``unsent`` index and through the DLQ, within the invocation's remaining time. The
consumer does not sweep: its time belongs to its batch (the budget rule), and many
concurrent consumers would race for the same oldest records; the schedule is the
one sweeper (the CDK's ``LambdaConsumer`` deploys it). Concurrent sweeps are safe
all the same: each re-send is won by one conditional write.

At its first invocation it refuses an app with a class (or stage) whose stage budget
can never fit the function's timeout (``_core.deploy.check_lambda_fit``, the rule the
CDK construct checks at synth; journal ``lambda_budget_never_fits``, then every
invocation raises ``JobClassError``). At cold start it warns, once
(``lambda_visibility_too_short``), when the queue's visibility timeout is below
AWS's guidance of 6 x the function timeout (the function timeout is the largest
time left an invocation of this environment started with, ``FunctionTimeout``, so
the check is made again when a later invocation reads more; the mapping's batching
window is not visible from inside the function and is counted as 0).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ._aws import SyncDriver
from ._config import Settings
from ._core.deploy import lambda_visibility_floor
from ._core.env import HandlerRun
from ._core.eventsource import never_fit
from ._core.invocation import (
    BatchEnds,
    FifoBatchWatch,
    FunctionTimeout,
    record_flow,
    release_unstarted_records_flow,
    unfit_problem,
)
from ._core.rounds import heartbeat_tick_flow
from ._core.sweeps import SCHEDULED_DLQ_RECEIVES, sweep_pages_flow
from ._errors import ConfigError, JobClassError
from ._jobs import App
from ._journal import Journal, configure_for_lambda
from ._options import Shell, WorkerOptions
from ._shell import ShellBase
from ._worker import load_app

if TYPE_CHECKING:
    from .metrics import EmfMetrics


class LambdaContext(Protocol):
    """What the adapter reads of Lambda's context object."""

    def get_remaining_time_in_millis(self) -> int: ...


LambdaHandler = Callable[[Mapping[str, Any], LambdaContext], dict[str, Any]]


class LambdaShell(ShellBase):
    """The adapter's state across invocations of one execution environment: a shell of
    its own over the core (``_core.invocation``), with what every shell shares
    (:class:`~sqs_lease._shell.ShellBase`). It receives nothing (the event source hands
    it a batch), runs one record at a time in the invocation's thread, and a heartbeat
    thread while an invocation runs."""

    cannot_await = (
        "the Lambda shell cannot await: make them plain functions, or run the app on "
        "the async worker (sqs-lease worker)"
    )

    # One record at a time, no receive, no sweep thread (the consumer sweeps nothing,
    # the module's doc; a scheduled function calls sweep()): the Lambda shell's own
    # values (``WorkerOptions.for_shell``), refused when given otherwise.
    shell: ClassVar[Shell] = "lambda"

    def _built(self) -> None:
        self.driver = SyncDriver(self.settings, self.journal, self.timeouts, clock=self._clock)
        # Lambda deletes a record's message by not reporting it failed: the attempt
        # must delete at once, and answer whether it did (``AttemptEnd.deleted``; no
        # batching across records).
        self.env.deletes = None
        self._warned = False
        self._checked: int | None = None  # the timeout the visibility was last checked at
        self._refused: int | None = None  # the timeout last journaled as unfit
        self._timeout = FunctionTimeout()
        self._fifo_batches = FifoBatchWatch()
        self._rules = {
            n: (c.stage_budget_seconds, c.lease_seconds) for n, c in self.app.lease_rules()
        }

    def _run_handler(self, run: HandlerRun) -> Any:
        """``Invoke("handler")``, in the invocation's thread."""
        return self._handler_here(run, self.driver.run)

    def function_timeout(self, context: LambdaContext) -> int:
        """The function's timeout, in whole seconds: the largest time left any
        invocation of this environment started with (``FunctionTimeout``: Lambda tells
        a function its timeout no other way, and a late reading falls short)."""
        return self._timeout.read(context.get_remaining_time_in_millis())

    def refuse_unfit(self, context: LambdaContext) -> None:
        """A consumer whose app has a class (or stage) no invocation of this function can
        ever start refuses every invocation (``_core.invocation.unfit_problem``, the
        construct's rule at synth): never started, its records would come back until
        the DLQ, saying nothing. The scheduled sweep runs no job, so it does not ask."""
        timeout = self.function_timeout(context)
        problem = unfit_problem(self._rules, timeout)
        if problem is None:
            return
        if self._refused != timeout:  # once per reading (a later one may be larger)
            self._refused = timeout
            self.journal(
                "lambda_budget_never_fits",
                job_classes=never_fit({n: b for n, (b, _) in self._rules.items()}, timeout),
                function_timeout=timeout,
                fix=problem,
            )
        raise JobClassError(problem)

    def warn_timing(self, context: LambdaContext) -> None:
        """Once per environment: the queue's visibility against 6 x the function timeout,
        checked again whenever the timeout known grows (``FunctionTimeout``: a first
        reading of an environment frozen before it may fall short)."""
        timeout = self.function_timeout(context)
        if self._warned or (self._checked is not None and timeout <= self._checked):
            return
        self._checked = timeout
        attrs = self.driver.clients["sqs"].get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["VisibilityTimeout"]
        )["Attributes"]
        visibility = int(attrs.get("VisibilityTimeout", "30"))
        floor = lambda_visibility_floor(timeout, 0)
        if visibility < floor:
            self._warned = True
            self.journal(
                "lambda_visibility_too_short",
                visibility=visibility,
                function_timeout=timeout,
                floor=floor,
                fix="set the queue's visibility timeout to at least 6 x the function "
                "timeout + the event source's batching window",
            )

    def handle(self, event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
        """Run one event's records in order; report those that did not finish."""
        self.refuse_unfit(context)
        self.warn_timing(context)
        records = event.get("Records")
        if not isinstance(records, list):
            raise ConfigError("event has no Records list: is this an SQS event source's event?")
        told = self._fifo_batches.seen(len(records), self.queue_url)
        if told is not None:
            self.journal(told.event, **told.fields)
        batch = BatchEnds()
        done = threading.Event()
        beat = threading.Thread(target=self._beat_until, args=(done,), daemon=True)
        beat.start()
        try:
            for record in records:
                try:
                    end = self.driver.run(
                        record_flow(
                            self.env, record, batch.groups, context.get_remaining_time_in_millis
                        )
                    )
                except Exception as exc:  # an AWS failure the flow could not handle
                    self.journal("lambda_record_failed", error_code=type(exc).__name__)
                    batch.broke(record)
                    continue
                batch.ended(end)
        finally:
            done.set()
            beat.join(timeout=5)
            if batch.unstarted:
                self.driver.run(
                    release_unstarted_records_flow(
                        self.env, batch.unstarted, context.get_remaining_time_in_millis
                    )
                )
        return {"batchItemFailures": [{"itemIdentifier": m} for m in batch.failures]}

    def sweep(self, event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
        """One scheduled sweep: stranded records to the end of the ``unsent`` index,
        then the DLQ, while the invocation's time lasts; what it did, as JSON."""
        if "Records" in event:
            # Wired to the queue's event source, it would report every record done
            # (no batchItemFailures) and the mapping would delete them unrun.
            raise ConfigError(
                "the sweep got an SQS event (Records): point the event source at "
                "sqs_lease.aws_lambda.entry (or handler(app)) and schedule the sweep "
                "with an EventBridge rule"
            )
        until = self._clock() + context.get_remaining_time_in_millis() / 1000
        run = self.driver.run(
            sweep_pages_flow(
                self.env,
                older_than=self.sweep_grace,
                limit=self.sweep_limit,
                send_id_prefix=uuid.uuid4().hex,
                dlq_receives=SCHEDULED_DLQ_RECEIVES,
                until=until,
            )
        )
        self.journal("lambda_sweep_done", **{k: v for k, v in asdict(run).items() if k != "failed"})
        return {**asdict(run), "failed": list(run.failed)}

    def _beat_until(self, done: threading.Event) -> None:
        """The invocation's heartbeat (its records' leases), every tick until ``done``."""
        while not done.wait(self.tick):
            try:
                self.driver.run(heartbeat_tick_flow(self.env, stopping=False))
            except Exception as exc:  # the heartbeat thread survives anything
                self.journal("heartbeat_error", error_code=type(exc).__name__)


def handler(
    app: App,
    settings: Settings | None = None,
    *,
    journal: Journal | None = None,
    tick: float | None = None,
    metrics: EmfMetrics | None = None,
    options: WorkerOptions | None = None,
) -> LambdaHandler:
    """A Lambda handler ``(event, context) -> {"batchItemFailures": [...]}`` for ``app``.

    ``settings`` default to ``Settings.from_env()`` (the function's environment). The tables
    and queue are found at the first invocation (cold start), once per execution
    environment. Handlers must be plain functions (no ``async def``).

    ``metrics`` (:class:`sqs_lease.metrics.EmfMetrics`) is fed by the journal and
    flushed to stdout at the end of every invocation: Lambda may freeze the
    environment once the handler returns, so nothing is left in a buffer.

    ``options`` (:class:`~sqs_lease.WorkerOptions`; ``tick`` on top) are checked here,
    at import, with the bounds every shell has; the event source decides the
    receive options, which are refused.
    """
    options = _lambda_options(options, tick=tick)
    return _served(app, settings, options, journal, metrics, LambdaShell.handle)


def sweeper(
    app: App,
    settings: Settings | None = None,
    *,
    journal: Journal | None = None,
    metrics: EmfMetrics | None = None,
    older_than: float | None = None,
    options: WorkerOptions | None = None,
) -> LambdaHandler:
    """A scheduled function's handler ``(event, context) -> {...}`` sweeping ``app``'s
    queue and tables: records left without a sent message for ``older_than`` seconds
    are sent again (to the end of the ``unsent`` index), and jobs whose message SQS
    moved to the DLQ are parked, within the invocation's remaining time. Invoke it
    from an EventBridge schedule (every few minutes; the CDK's ``LambdaConsumer``
    deploys one); it returns what it did (``resent``, ``more``, ``dlq_parked``...).
    An SQS event is refused (``ConfigError``): the consumer is ``handler(app)``.
    ``older_than`` is the options' ``sweep_grace`` (default 60 s); both are checked
    here, with the bounds every shell has."""
    options = _lambda_options(options, sweep_grace=older_than)
    return _served(app, settings, options, journal, metrics, LambdaShell.sweep)


def _served(
    app: App,
    settings: Settings | None,
    options: WorkerOptions,
    journal: Journal | None,
    metrics: EmfMetrics | None,
    serve: Callable[[LambdaShell, Mapping[str, Any], LambdaContext], dict[str, Any]],
) -> LambdaHandler:
    """A function handler answering each invocation with ``serve`` on the environment's
    one shell, made at the first invocation (cold start); the metrics flushed at the
    end of every invocation."""
    shells: list[LambdaShell] = []
    journal = journal or Journal()
    if metrics is not None:
        journal.add_sink(metrics)

    def lambda_handler(event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
        try:
            if not shells:
                # At the first invocation: the runtime's (and Powertools') logging is set.
                configure_for_lambda(journal, os.environ)
                shell = LambdaShell(app, settings or Settings.from_env(), options, journal=journal)
                shells.append(shell)
            return serve(shells[0], event, context)
        finally:
            if metrics is not None:
                metrics.flush()

    return lambda_handler


def _lambda_options(options: WorkerOptions | None, **given: Any) -> WorkerOptions:
    """``options`` with the handler's own keywords (non-None) on top, checked now
    (at import, not at the first record) for the Lambda shell."""
    keywords = {k: v for k, v in given.items() if v is not None}
    return WorkerOptions.of(options, **keywords).for_shell("lambda")


_from_env: list[LambdaHandler] = []
_sweep_from_env: list[LambdaHandler] = []


def _env_app(make: Callable[..., LambdaHandler], own: str) -> LambdaHandler:
    """``make(app, journal=..., metrics=...)`` for the app named by ``SQS_LEASE_APP``,
    with the journal's sinks the environment asks for."""
    spec = os.environ.get("SQS_LEASE_APP", "")
    if not spec:
        raise ConfigError(
            "SQS_LEASE_APP is not set: set it to the app as MODULE:OBJECT "
            f"(e.g. myjobs:app), or point the function's handler at your own {own}"
        )
    from .service import WorkerEnv

    env = WorkerEnv.load()
    app = load_app(spec)
    journal = Journal()
    metrics = None
    if env.metrics:
        from .metrics import EmfMetrics as Emf

        metrics = Emf(app, namespace=env.metrics_namespace)
    if env.otel:
        from .tracing import OtelSpans

        journal.add_sink(OtelSpans())
    # The worker's options set in the environment, as for the container's worker; one
    # the Lambda shell decides itself (SQS_LEASE_RECEIVE_WAIT...) is refused at cold start.
    return make(app, journal=journal, metrics=metrics, options=env.options())


def entry(event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The function handler ``sqs_lease.aws_lambda.entry``: the app named by
    ``SQS_LEASE_APP`` (``MODULE:OBJECT``), settings from the environment; loaded
    at the first invocation and kept for the execution environment's life.

    ``SQS_LEASE_METRICS=true`` (namespace ``SQS_LEASE_METRICS_NAMESPACE``) writes
    EMF metrics at the end of every invocation; ``SQS_LEASE_OTEL=true`` adds
    OpenTelemetry spans, as for the worker."""
    if not _from_env:
        _from_env.append(_env_app(handler, "handler(app)"))
    return _from_env[0](event, context)


def sweep_entry(event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The scheduled sweep's function handler ``sqs_lease.aws_lambda.sweep_entry``:
    :func:`sweeper` for the app named by ``SQS_LEASE_APP``, settings from the
    environment, as :func:`entry` loads them. Schedule it (EventBridge, every few
    minutes) next to the consumer; give it the consumer's environment."""
    if not _sweep_from_env:
        _sweep_from_env.append(_env_app(sweeper, "sweeper(app)"))
    return _sweep_from_env[0](event, context)


__all__ = [
    "LambdaContext",
    "LambdaHandler",
    "LambdaShell",
    "entry",
    "handler",
    "sweep_entry",
    "sweeper",
]
