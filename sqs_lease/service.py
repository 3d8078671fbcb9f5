"""The long-running worker as a container entry point (ECS): settings, exit codes, run.

``sqs-lease worker`` (or ``python -m sqs_lease worker``) reads its settings from
command-line options, else from ``SQS_LEASE_*`` environment variables
(:class:`WorkerEnv`), else the defaults (``sqs_lease._config.layered``, the rule
``Settings.from_env`` follows too); where AWS is comes from
:class:`~sqs_lease.Settings` (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ...). The
options among them are a :class:`~sqs_lease.WorkerOptions` (their bounds).
:func:`env_table` is the one table of every variable (docs/operations.md holds
it; a test compares the two).

On SIGTERM (what ECS sends before SIGKILL at ``stopTimeout``) the worker stops
receiving, hands back messages it has not started, tells running handlers to
stop, and releases whatever is still held after ``shutdown_grace``: every claimed
job is committed, failed, retried, parked or released before the process exits.
With ``SQS_LEASE_STOP_TIMEOUT`` set to the task's ``stopTimeout`` the grace is
checked (or, unset, chosen) to fit: ``receive_wait + shutdown_grace +
STOP_RESERVE_SECONDS <= stop_timeout``.

The process ends with an :class:`ExitCode` a scheduler can act on.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import botocore.exceptions
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ._config import ENV_VARIABLES, Settings, layered
from ._core.calls import Call, Err, ErrorKind, Outcome
from ._core.claiming import UNKNOWN_CLASS_RECEIVES
from ._core.deploy import ECS_EXIT_MARGIN_SECONDS, ecs_exit_after
from ._core.messages import UNSENT_GRACE_SECONDS
from ._errors import (
    AwsCallFailed,
    AwsUnavailable,
    ConfigError,
    OptionError,
    ResourceMissing,
    SqsLeaseError,
)
from ._jobs import App
from ._journal import LOGGER_NAME, Journal
from ._options import Shell, WorkerOptions
from ._shell import WorkerStats, async_handlers
from ._worker import Worker, load_app

__all__ = [
    "ENV_PREFIX",
    "EXIT_MARGIN_SECONDS",
    "STOP_RESERVE_SECONDS",
    "ExitCode",
    "ServiceResult",
    "WorkerEnv",
    "app_of",
    "env_table",
    "run_worker",
]

ENV_PREFIX = "SQS_LEASE_"

EXIT_MARGIN_SECONDS = ECS_EXIT_MARGIN_SECONDS
"""The worker has exited this long before ``stop_timeout`` after SIGTERM, whatever
its handlers do (``sqs_lease._core.deploy.ecs_exit_after``)."""

STOP_RESERVE_SECONDS = 5.0
"""Kept below ``stopTimeout`` after the grace: the hand-back writes (one conditional
UpdateItem per job, visibility 0 in batches of 10) and the last metrics flush."""


class ExitCode(IntEnum):
    """How the worker process ends; docs/operations.md tells a scheduler what to do."""

    OK = 0
    """Stopped cleanly (SIGTERM/SIGINT, ``idle_exit``, ``max_messages``): every claimed
    job was committed, failed, retried, parked or handed back."""
    CRASH = 1
    """An unexpected error (a bug): a traceback on stderr. Restart, and report it."""
    CONFIG = 2
    """A setting is wrong (an option or ``SQS_LEASE_*`` variable, a grace that does
    not fit ``stopTimeout``): the message names it. Restarting will not help."""
    APP_IMPORT = 3
    """The app (``SQS_LEASE_APP`` / ``MODULE:OBJECT``) could not be imported, or is
    not a ``sqs_lease.App``, or a job class in it breaks a rule. Fix the image."""
    AWS_UNAVAILABLE = 4
    """AWS did not answer at start (network, endpoint, credentials), or every
    receive failed for ``aws_lost_after`` seconds while running. Restart with backoff."""
    RESOURCES_MISSING = 5
    """The queue or a table does not exist: ``sqs-lease tables create`` /
    ``queue create`` (or deploy the stack) first."""


class WorkerEnv(BaseModel):
    """The worker's settings from ``SQS_LEASE_*`` environment variables (:meth:`load`).

    Explicit keyword arguments (the CLI's options) win over the environment
    (``sqs_lease._config.layered``). Where AWS is and the resource names are
    :class:`~sqs_lease.Settings`' business.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    app: str | None = Field(
        default=None,
        description="the app to run, MODULE:OBJECT (the CLI's argument wins)",
    )
    use_async: bool | None = Field(
        default=None,
        description="the shell: true one event loop, false a thread per job; unset: async "
        "if any handler is an async def",
    )
    # The worker's options: their bounds are WorkerOptions' (checked once, there, for
    # every shell); here only how they are read.
    concurrency: int | None = Field(
        default=None,
        description="jobs held at once; unset: 4 (threads, at most 1000), 1000 (async)",
    )
    max_loop_lag: float | None = Field(
        default=None,
        description="async: seconds a handler may hold the loop before it loses its lease",
    )
    receive_wait: int = Field(default=2, description="long-poll seconds of each ReceiveMessage")
    receive_window: float = Field(
        default=0.0,
        description="batching window: seconds to wait after a receive that came back short, "
        "so messages that trickle in are received 10 at a time; 0: off",
    )
    shutdown_grace: float | None = Field(
        default=None,
        description="seconds running handlers get after SIGTERM before their jobs are "
        "released; unset: stop_timeout - receive_wait - 5, else 20",
    )
    stop_timeout: float | None = Field(
        default=None,
        gt=0,
        le=120,
        description="the ECS task's stopTimeout (s): the grace must fit below it",
    )
    idle_exit: float | None = Field(
        default=None, ge=0, description="exit after this many idle seconds (unset: never)"
    )
    max_messages: int | None = Field(
        default=None, ge=1, description="exit after this many messages (unset: never)"
    )
    worker_id: str | None = Field(default=None, description="unset: host-pid-random")
    sweep_interval: float = Field(
        default=60.0,
        description="seconds between sweeps for jobs stranded without a message (each "
        "sweep also reconciles one receive of the DLQ); 0: off",
    )
    sweep_grace: float = Field(
        default=UNSENT_GRACE_SECONDS,
        description="sweep only jobs without a sent message for this many seconds",
    )
    sweep_limit: int = Field(default=25, description="records per sweep")
    unknown_class_receives: int = Field(
        default=UNKNOWN_CLASS_RECEIVES,
        description="receives of a message of a job class this app does not know "
        "before it goes to the DLQ",
    )
    aws_lost_after: float = Field(
        default=300.0,
        ge=0,
        description="exit (code 4) after every receive failed for this many seconds; 0: never",
    )
    metrics: bool = Field(
        default=False, description="write CloudWatch EMF metrics to stdout (extra `metrics`)"
    )
    metrics_namespace: str = Field(
        default="SqsLease", min_length=1, max_length=255, description="CloudWatch namespace"
    )
    metrics_interval: float = Field(
        default=60.0, gt=0, description="seconds between metric flushes (and one at exit)"
    )
    otel: bool = Field(
        default=False,
        description="OpenTelemetry spans: attempts, claims, tool calls, commits (extra `otel`)",
    )

    @model_validator(mode="after")
    def _options(self) -> WorkerEnv:
        # Before the stop timeout's sum: a value out of its own bound is named first.
        self.options()
        return self

    def options(self, shell: Shell | None = None) -> WorkerOptions:
        """The worker's options these settings give (checked for ``shell`` if named):
        those set (a variable, an argument); the rest are ``WorkerOptions``' defaults.
        ``sweep_interval`` 0 is off; the grace is :attr:`grace` once either it or
        ``stop_timeout`` is set."""
        given = {n: getattr(self, n) for n in _OPTION_NAMES if n in self.model_fields_set}
        if "sweep_interval" in given:
            given["sweep_interval"] = self.sweep_interval or None
        if self.shutdown_grace is not None or self.stop_timeout is not None:
            given["shutdown_grace"] = self.grace
        options = WorkerOptions.of(**given)
        return options if shell is None else options.for_shell(shell)

    @model_validator(mode="after")
    def _fits_stop_timeout(self) -> WorkerEnv:
        if self.stop_timeout is None:
            return self
        need = self.receive_wait + (self.shutdown_grace or 0.0) + STOP_RESERVE_SECONDS
        if need > self.stop_timeout:
            raise ValueError(
                f"receive_wait {self.receive_wait} + shutdown_grace {self.grace:g} + "
                f"{STOP_RESERVE_SECONDS:g} s reserve = {need:g} s exceeds stop_timeout "
                f"{self.stop_timeout:g} s: ECS would SIGKILL the worker before it released "
                "its jobs; lower SQS_LEASE_SHUTDOWN_GRACE or SQS_LEASE_RECEIVE_WAIT, or raise "
                "the task's stopTimeout"
            )
        return self

    @property
    def grace(self) -> float:
        """The shutdown grace in force: given, else what fits ``stop_timeout``, else 20 s."""
        if self.shutdown_grace is not None:
            return self.shutdown_grace
        if self.stop_timeout is not None:
            return max(0.0, self.stop_timeout - self.receive_wait - STOP_RESERVE_SECONDS)
        return 20.0

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None, **given: Any) -> WorkerEnv:
        """Read the environment ``environ`` (default ``os.environ``); ``given``
        (non-None) wins. Bad values, and a variable that looks like a misspelt one
        (``SQS_LEASE_CONCURENCY``), raise :class:`ConfigError` naming the variable
        and the fix."""
        known = [name for name, _, _ in env_table()]
        e = os.environ if environ is None else environ
        for name in e:
            if name.startswith(ENV_PREFIX) and name not in known:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
                if close:
                    raise ConfigError(
                        f"{name}: no such setting; did you mean {close[0]}? "
                        "(docs/operations.md lists every variable)"
                    )
        try:
            found = {
                n: e[f"{ENV_PREFIX}{n.upper()}"]
                for n in cls.model_fields
                if f"{ENV_PREFIX}{n.upper()}" in e
            }
            return cls(**layered(given, found))
        except OptionError as exc:
            raise ConfigError(f"{_where(exc.field)}: {exc}") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            name = ".".join(str(p) for p in first["loc"])
            where = _where(name) if name else "worker settings"
            got = f" (got {first.get('input')!r})" if name else ""
            msg = first["msg"].removeprefix("Value error, ")
            raise ConfigError(f"{where}: {msg}{got}") from None


_OPTION_NAMES = tuple(n for n in WorkerEnv.model_fields if n in WorkerOptions.model_fields)
"""The settings that are worker options (their bounds: ``WorkerOptions``)."""


def _where(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()} (or --{name.replace('_', '-')})"


def env_table() -> list[tuple[str, str, str]]:
    """Every environment variable the worker reads: (name, default, meaning)."""
    rows = [(name, default, meaning) for name, default, meaning in ENV_VARIABLES]
    for name, f in WorkerEnv.model_fields.items():
        default = "unset" if f.default is None else _show(f.default)
        rows.append((f"{ENV_PREFIX}{name.upper()}", default, f.description or ""))
    return rows


def env_table_markdown() -> str:
    """:func:`env_table` as the markdown table docs/operations.md holds."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{n}` | {d} | {m} |" for n, d, m in env_table()]
    return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "false" if not value else "true"
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class ServiceResult:
    """How a worker run ended: its exit code, a message for stderr, its counters."""

    code: ExitCode
    message: str = ""
    stats: WorkerStats | None = None


RECEIVE_PAUSE = (0.1, 1.0)
"""First and longest pause (s) after a failed receive, doubling while they fail."""


class _AwsLostMonitor:
    """Watches a worker's receive calls (either shell: it is one of the worker's
    ``receive_observers``): paces failed receives, and stops the worker when every
    ReceiveMessage failed for ``after`` seconds (0: never). It answers the pause;
    the driver performs it (a sleep in the thread worker, an await on the loop)."""

    def __init__(
        self, worker: Any, after: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.worker = worker
        self.after = after
        self.clock = clock
        self.failing_since: float | None = None
        self.failures = 0
        self.lost = False
        self._lock = threading.Lock()

    def __call__(self, call: Call, outcome: Outcome) -> float | None:
        if call.op != "ReceiveMessage":
            return None
        now = self.clock()
        with self._lock:
            if not isinstance(outcome, Err) or outcome.kind is ErrorKind.THROTTLED:
                self.failing_since = None  # throttled is an answer: AWS is there
                self.failures = 0
                return None
            if self.failing_since is None:
                self.failing_since = now
            self.failures += 1
            pause = min(RECEIVE_PAUSE[1], RECEIVE_PAUSE[0] * 2.0 ** (self.failures - 1))
            give_up = not self.lost and self.after > 0 and now - self.failing_since >= self.after
            self.lost = self.lost or give_up
        if not give_up:
            # A refused connection fails at once: without a pause the receive loop
            # would spin and flood the log with receive_failed.
            return pause
        self.worker.journal(
            "aws_lost",
            failing_for=round(now - self.failing_since, 3),
            error_code=outcome.code or outcome.kind.value,
        )
        self.worker.stop()
        return None


def app_of(env: WorkerEnv) -> App | ServiceResult:
    """Import the app ``env.app`` names, or say why not (exit code and message)."""
    if env.app is None:
        return ServiceResult(
            ExitCode.CONFIG,
            "no app to run: give MODULE:OBJECT or set SQS_LEASE_APP (e.g. myjobs:app)",
        )
    if not re.fullmatch(r"[\w.]+:[\w.]+", env.app):
        return ServiceResult(
            ExitCode.CONFIG, f"app {env.app!r}: write it as MODULE:OBJECT, e.g. myjobs:app"
        )
    try:
        return load_app(env.app)
    except SqsLeaseError as exc:
        return ServiceResult(ExitCode.APP_IMPORT, str(exc))
    except Exception as exc:  # whatever importing the user's module raised
        return ServiceResult(
            ExitCode.APP_IMPORT, f"app {env.app!r}: import failed: {type(exc).__name__}: {exc}"
        )


def run_worker(
    settings: Settings,
    env: WorkerEnv,
    *,
    app: App | None = None,
    journal: Journal | None = None,
    install_signals: bool = True,
    on_worker: Callable[[Any], None] | None = None,
) -> ServiceResult:
    """Run one worker as a container's main process; never raises for expected
    failures: they come back as an :class:`ExitCode` and a one-line message.
    ``app``: the app already loaded (see :func:`app_of`), else ``env.app`` is;
    ``on_worker`` sees the worker before it runs (the CLI's status line reads it)."""
    if app is None:
        loaded = app_of(env)
        if isinstance(loaded, ServiceResult):
            return loaded
        app = loaded
    journal = journal or Journal()
    sinks: list[Any] = []
    try:
        if env.metrics:
            from .metrics import EmfMetrics, MetricsFlusher

            flusher: MetricsFlusher | None = MetricsFlusher(
                EmfMetrics(app, namespace=env.metrics_namespace), env.metrics_interval
            )
            assert flusher is not None
            sinks.append(flusher.metrics)
        else:
            flusher = None
        if env.otel:
            from .tracing import OtelSpans

            sinks.append(OtelSpans())
        worker: Any
        if env.use_async or (env.use_async is None and async_handlers(app)):
            from ._aio_worker import AsyncWorker

            worker = AsyncWorker(app, settings, env.options("async"), journal=journal)
        else:
            worker = Worker(app, settings, env.options("thread"), journal=journal)
    except ConfigError as exc:
        return ServiceResult(ExitCode.CONFIG, str(exc))
    except ResourceMissing as exc:
        return ServiceResult(ExitCode.RESOURCES_MISSING, str(exc))
    except (AwsUnavailable, AwsCallFailed, botocore.exceptions.BotoCoreError) as exc:
        return ServiceResult(ExitCode.AWS_UNAVAILABLE, f"{type(exc).__name__}: {exc}")
    for sink in sinks:
        worker.journal.add_sink(sink)
    if on_worker is not None:
        on_worker(worker)
    monitor = _AwsLostMonitor(worker, env.aws_lost_after)
    worker.receive_observers.append(monitor)
    if flusher is not None:
        flusher.start()
    if env.stop_timeout is not None and install_signals:
        # The process's own worker (its signals): it ends before ECS's SIGKILL.
        _ExitDeadline(worker, ecs_exit_after(env.stop_timeout), flusher).start()
    try:
        if install_signals:
            worker.install_signal_handlers()
        stats = worker.run(max_messages=env.max_messages, idle_exit=env.idle_exit)
    except ResourceMissing as exc:
        return ServiceResult(ExitCode.RESOURCES_MISSING, str(exc))
    except (AwsUnavailable, AwsCallFailed) as exc:
        return ServiceResult(ExitCode.AWS_UNAVAILABLE, str(exc))
    finally:
        if flusher is not None:
            flusher.stop()
    if monitor.lost:
        return ServiceResult(
            ExitCode.AWS_UNAVAILABLE,
            f"every receive failed for {env.aws_lost_after:g} s ({settings.describe_endpoints()}):"
            " stopped; restart when AWS answers",
            stats,
        )
    return ServiceResult(ExitCode.OK, "", stats)


class _ExitDeadline:
    """Ends the process ``after`` seconds past the stop request (SIGTERM), if it is
    still running then: a handler that ignores the stop, an AWS call that hangs in
    the hand-back. ECS sends SIGKILL at ``stopTimeout``; this comes
    ``EXIT_MARGIN_SECONDS`` before it, says so, and flushes what is buffered. Jobs not
    released yet are recovered as any crashed worker's are (their leases expire)."""

    def __init__(self, worker: Any, after: float, flusher: Any) -> None:
        self.worker = worker
        self.after = after
        self.flusher = flusher

    def start(self) -> None:
        threading.Thread(target=self._watch, name="exit-deadline", daemon=True).start()

    def _watch(self) -> None:
        stopping: threading.Event = self.worker._stopping
        stopping.wait()
        # A daemon thread: a process that ends in time ends it; one still here then
        # (run() has not returned, or the interpreter waits on a stuck thread) is ended.
        time.sleep(self.after)
        self.worker.journal(
            "worker_exit_forced",
            after=self.after,
            in_flight=len(self.worker.book),
            reason="the stop timeout is near: a handler or a call did not end",
        )
        try:
            if self.flusher is not None:
                self.flusher.metrics.flush()
            for h in [*logging.getLogger().handlers, *logging.getLogger(LOGGER_NAME).handlers]:
                h.flush()
        finally:
            os._exit(int(ExitCode.OK))
