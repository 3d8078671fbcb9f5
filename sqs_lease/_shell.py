"""What every shell sets up the same way: its options, its queue, its counters.

The thread worker (``_worker.py``), the async worker (``_aio_worker.py``) and the
Lambda shell (``aws_lambda.py``) differ in how they schedule; their options (one
``WorkerOptions``, checked in ``_options.py``), the queue and redrive they find,
their counters and the attempt env live here once (``ShellBase``); the two workers
that receive share their receive loop's pacing, ``stop`` and signals
(``WorkerShell``).
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import socket
import threading
import time
import uuid
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, ClassVar

from ._aws import CallObserver, Timeouts
from ._clock import lease_clock
from ._config import Settings
from ._core.attempt import held_effect_flow
from ._core.calls import Flow
from ._core.deletes import DeleteBatch
from ._core.env import AttemptEnv, HandlerRun, Now, SlotEnv
from ._core.inputs import loads as _loads
from ._core.intents import EffectResult, EffectSpec
from ._core.leasebook import LeaseBook, Signal
from ._core.messages import Delivery, Poison
from ._core.priority import receive_prioritized_flow
from ._core.receiving import ReceivePacer
from ._core.stages import stage_results
from ._core.sweeps import redrive_rules, sweep_once_flow
from ._core.timing import Pace, pace_budget
from ._errors import ConfigError
from ._jobs import App, JobClass, JobContext, Target
from ._journal import Journal
from ._options import Shell, WorkerOptions
from ._resources import (
    check_slots_table,
    check_table,
    interactive_queue_url,
    queue_url,
    redrive,
)
from ._schema.intent_requests import IntentTable
from ._schema.job_requests import JobTable
from ._schema.slot_requests import SlotTable


@dataclass
class WorkerStats:
    """A worker's counters, returned by ``run()`` and journaled as ``worker_stopped``
    (the flows name what to count, ``AttemptEnv.tally``; names not here are skipped)."""

    received: int = 0
    claimed: int = 0
    reclaimed: int = 0
    committed: int = 0
    rejected: int = 0
    failed: int = 0
    retried: int = 0
    parked: int = 0
    poisoned: int = 0
    already_done: int = 0
    stray: int = 0  # messages that were not their job's current message
    lost: int = 0
    released: int = 0
    deferred: int = 0  # messages left unclaimed: an unknown job class, or a hand-back under way
    released_late: int = 0  # leases its own late heartbeat let go, handed back uncharged
    waited_for_slot: int = 0  # claims given back: the job's limit had no slot free
    unanswered: int = 0  # claims with no answer (ownership unknown): the message comes back
    commit_unknown: int = 0  # commits with no answer: the next claim (or the record) tells
    commit_invalid: int = 0  # commits DynamoDB can never apply as sent (the job ends failed)


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def check_app(app: App) -> None:
    """Refuse an app no worker can run (the options' own bounds: ``WorkerOptions``)."""
    if not app.classes:
        raise ConfigError("the app registers no job class; add one with @app.job(...)")


def async_handlers(app: App) -> list[str]:
    """The app's ``async def`` handlers, stages and tools, named (they need the async
    worker): ``App.async_callables``, decided per callable (``Registered.is_async``)."""
    return app.async_callables()


@dataclass(frozen=True)
class QueueSetup:
    queue_url: str
    dlq_url: str | None
    unknown_class_receives: int
    interactive_url: str | None = None  # priorities: served first when it exists


def find_queue(
    app: App, settings: Settings, journal: Journal, unknown_class_receives: int
) -> QueueSetup:
    """Check the tables, find the queue and its redrive, and warn of a redrive too tight."""
    check_table(settings)
    if app.has_limits:
        check_slots_table(settings)
    url = queue_url(settings)
    dlq_url, max_receives = redrive(settings, url)
    most = max(c.max_attempts for c in app.job_classes())
    unknown, warning = redrive_rules(max_receives, most, unknown_class_receives)
    if warning is not None:
        journal.write(warning.event, warning.fields)
    return QueueSetup(url, dlq_url, unknown, interactive_queue_url(settings))


STAT_NAMES = frozenset(WorkerStats.__dataclass_fields__)


def context_fields(
    run: HandlerRun,
    *,
    job_class: JobClass,
    payload: Any,
    worker_id: str,
    lock: Any,
    clock: Callable[[], float],
    journal: Journal,
    targets: Mapping[str, Target],
) -> dict[str, Any]:
    """What a handler's context is built from for ``run``: every shell's (the
    simulator's too, ``testing/_sim/user.py``), so the contexts agree."""
    held, claim = run.held, run.claim
    return {
        "job_id": claim.job.job_id,
        "job_class": job_class,
        "payload": payload,
        "payload_hash": claim.job.payload_hash,
        "token": claim.token,
        "attempt": claim.attempt,
        "worker_id": worker_id,
        "lease": held.lease,
        "lock": lock,
        "cancelled": held.cancelled,  # each shell's new_signal
        "clock": clock,
        "journal": journal,
        "targets": targets,
        "stage": claim.job.stage_name,
        "last_progress": _details(claim.job.progress_json),
        "results": stage_results(claim.job),
        "job_payload_json": claim.job.payload_json,
    }


def _details(text: str | None) -> Any:
    # Saved by ctx.progress as JSON; a record edited by hand must not stop the handler.
    try:
        return None if text is None else _loads(text)
    except ValueError:
        return None


def slot_env(app: App, settings: Settings) -> SlotEnv | None:
    """The app's fleet-wide limits for the attempt flow (None: it declares none)."""
    if not app.has_limits:
        return None
    return SlotEnv(
        SlotTable(settings.slots_table),
        app.class_limit_for,
        app.tenant_limit_for,
        app.stage_limit_for,
    )


def new_write_id() -> str:
    """An attempt's nonce (``Invoke("write_id")``): unguessable, so that no other
    writer of a job record can make a write the attempt takes for its own."""
    return secrets.token_hex(12)


class ShellBase:
    """What every shell (thread, async, Lambda) holds and does alike; each adds how it
    schedules.

    Options (a :class:`WorkerOptions` checked once, with ``for_shell``, before any
    AWS call), the refusal of ``async def`` callables by a shell that cannot await,
    the journal, the lease clock, the tables and queue, the counters, the core's
    :class:`LeaseBook` (guarded by ``_lock``, which handlers' contexts share) and the
    :class:`AttemptEnv` the flows run with, and what a handler's context is built
    from. A shell names itself (``shell``), may check its own options
    (``_own_options``) and add its own parts (``_built``), and supplies
    ``_run_handler`` (how ``Invoke("handler")`` is performed) and its stop
    ``Signal`` (``_new_signal``).
    """

    shell: ClassVar[Shell]
    cannot_await: ClassVar[str | None] = None
    """The end of the refusal of an app with an ``async def`` handler, stage or tool
    (None: this shell awaits them)."""

    def __init__(
        self,
        app: App,
        settings: Settings,
        options: WorkerOptions | None = None,
        *,
        journal: Journal | None = None,
        rng: random.Random | None = None,
        **option_keywords: Any,
    ) -> None:
        """``options`` (:class:`~sqs_lease.WorkerOptions`), or its fields as keywords
        (``concurrency=8``; on top of ``options`` when both are given)."""
        options = WorkerOptions.of(options, **option_keywords).for_shell(self.shell)
        refused = async_handlers(app) if self.cannot_await is not None else []
        if refused:
            # Refused at start: a coroutine called here would never be awaited.
            raise ConfigError(f"{'; '.join(refused)}: async def, which {self.cannot_await}")
        check_app(app)
        self._own_options(app, options)  # still before any AWS call
        assert options.concurrency is not None  # WorkerOptions.for_shell set the shell's
        self.options = options
        self.app = app
        self.settings = settings
        self.worker_id = options.worker_id or default_worker_id()
        self.concurrency = options.concurrency
        self.receive_wait = options.receive_wait
        shortest = min(c.lease_seconds for c in app.job_classes())
        self.receive_visibility = options.receive_visibility or shortest
        self.shutdown_grace = options.shutdown_grace
        self.tick = options.tick
        self.rng = rng or random.Random()
        self.sweep_interval = options.sweep_interval
        self.sweep_grace = options.sweep_grace
        self.sweep_limit = options.sweep_limit
        self.journal = journal or Journal(worker_id=self.worker_id)
        if self.journal.worker_id is None:
            self.journal.worker_id = self.worker_id
        heartbeat = min(c.heartbeat_seconds for c in app.job_classes())
        # A heartbeat call must give up well inside the reserve (jitter) of a lease.
        self.timeouts = options.timeouts or Timeouts(read=max(0.5, min(5.0, heartbeat)))
        # Every lease measurement of this worker (its drivers' stamps, its heartbeat,
        # its handlers' contexts) is on the one lease clock (CLOCK_BOOTTIME if any).
        self._clock: Callable[[], float] = lease_clock
        self.table = JobTable(settings.jobs_table)
        self.intents = IntentTable(settings.intents_table, settings.attempts_table)
        setup = find_queue(app, settings, self.journal, options.unknown_class_receives)
        self.queue_url = setup.queue_url
        self.dlq_url = setup.dlq_url
        self.unknown_class_receives = setup.unknown_class_receives
        self.stats = WorkerStats()
        self._stats_lock = threading.Lock()
        self._lock = threading.Lock()
        # The leases this worker holds; its heartbeat and its handlers' contexts share it.
        budget = pace_budget(
            (c.lease_seconds, c.heartbeat_seconds, c.jitter_seconds) for c in app.job_classes()
        )
        self.book = LeaseBook(self._lock, pace=Pace(budget))
        # Ended jobs' messages, deleted 10 per call (the shell's flusher sends the
        # rest once they waited the window, and all of them at stop).
        self.deletes = DeleteBatch(lock=threading.Lock())
        self.env = AttemptEnv(
            table=self.table,
            intents=self.intents,
            queue_url=self.queue_url,
            dlq_url=self.dlq_url,
            worker_id=self.worker_id,
            book=self.book,
            rules_of=self._rules_of,
            receive_visibility=self.receive_visibility,
            unknown_class_receives=self.unknown_class_receives,
            now=self._now,
            random=self.rng.random,
            write_id=new_write_id,
            tally=self._count,
            new_signal=self._new_signal,
            run_handler=self._run_handler,
            slots=slot_env(app, settings),
            stage_rules_of=self._stage_rules_of,
            interactive_url=setup.interactive_url,
            first_stage_of=self._first_stage_of,
            deletes=self.deletes,
        )
        self._built()

    def _own_options(self, app: App, options: WorkerOptions) -> None:
        """A shell's own options, checked and kept before any AWS call (none here)."""

    def _built(self) -> None:
        """A shell's own parts, once the common ones stand (none here)."""

    def _new_signal(self) -> Signal:
        """An attempt's stop signal (``AttemptEnv.new_signal``): an event a thread waits on."""
        return threading.Event()

    @abstractmethod
    def _run_handler(self, run: HandlerRun) -> Any:
        """``Invoke("handler")``: build the job's context and call its handler (each
        shell's own: a thread, the event loop's pool)."""

    def _handler_here(self, run: HandlerRun, drive: Callable[[Flow[Any]], Any]) -> Any:
        """``Invoke("handler")`` in the calling thread (the thread worker's job thread,
        the Lambda invocation's): a :class:`JobContext`, whose ``ctx.effect`` drives
        ``held_effect_flow`` with ``drive``, and the handler called."""
        reg = self.app.get(run.claim.job.job_class, run.claim.job.stage)
        assert reg is not None  # attempt_flow runs a handler only for a known class

        def effect(spec: EffectSpec) -> EffectResult:
            flow = held_effect_flow(
                self.env, run.held, spec, wall_clock=time.time, flow_id=uuid.uuid4().hex
            )
            result: EffectResult = drive(flow)
            return result

        ctx: JobContext[Any] = JobContext(run_effect=effect, **self._context_fields(run))
        return reg.handler(ctx, run.payload)  # a model becomes data in the core

    def _count(self, name: str, n: int | bool = 1) -> None:
        """``env.tally``: count what a flow names (names these stats lack are skipped)."""
        if name not in STAT_NAMES:
            return
        # Several threads may count; += on an attribute is not atomic.
        with self._stats_lock:
            setattr(self.stats, name, getattr(self.stats, name) + int(n))

    def _now(self) -> Now:
        return Now(self._clock(), time.time())

    def _rules_of(self, job_class: str) -> JobClass | None:
        reg = self.app.get(job_class)
        return reg.job_class if reg else None

    def _first_stage_of(self, job_class: str) -> str | None:
        reg = self.app.get(job_class)
        return reg.first_stage if reg else None

    def _stage_rules_of(self, job_class: str, stage: str) -> JobClass | None:
        reg = self.app.get(job_class, stage)
        return reg.job_class if reg else None

    def _context_fields(self, run: HandlerRun) -> dict[str, Any]:
        """What a handler's context (sync or async) is built from, for ``run``."""
        reg = self.app.get(run.claim.job.job_class, run.claim.job.stage)
        assert reg is not None  # attempt_flow runs a handler only for a known class
        return context_fields(
            run,
            job_class=reg.job_class,
            payload=run.payload,
            worker_id=self.worker_id,
            lock=self._lock,
            clock=self._clock,
            journal=self.journal,
            targets=self.app.targets,
        )


class WorkerShell(ShellBase):
    """A worker that receives (the thread and async workers; not the Lambda shell, to
    which the event source hands its batch): the receive loop's pacing and priorities,
    idleness, ``stop`` and the signal handlers; ``run`` is each worker's own."""

    def _built(self) -> None:
        # Highest priority first (_core/priority.py); one queue when there are no levels.
        self.queue_urls = [u for u in (self.env.interactive_url, self.queue_url) if u]
        self._receive_turn = 0
        self._stopping = threading.Event()
        # Watchers of the receive loop's calls (the container entry point's lost-AWS
        # monitor): each shell hands this list to the driver its receives run on.
        self.receive_observers: list[CallObserver] = []
        self._saved_signals: dict[int, Any] = {}
        self._idle_since = 0.0  # set as the receive loop starts
        self._pacer = ReceivePacer.for_queue(
            self.concurrency, self.queue_url, window=self.options.receive_window
        )

    @abstractmethod
    def run(
        self, *, max_messages: int | None = None, idle_exit: float | None = None
    ) -> WorkerStats:
        """Receive and run until stopped; then shut down cleanly (each shell's own)."""

    def _sweep_once_flow(self) -> Flow[int]:
        """One bounded sweep of stranded records and the DLQ (the sweep loop's)."""
        return sweep_once_flow(
            self.env,
            older_than=self.sweep_grace,
            limit=self.sweep_limit,
            send_id_prefix=uuid.uuid4().hex,
        )

    # ----------------------------------------------------------------- the receive loop

    def _receive_more(self, free: int, max_messages: int | None) -> int | None:
        """How many messages the receive loop asks for now (``free``: open slots):
        None once it must end (stopping, or ``max_messages`` received), 0 while it
        waits (the core's :class:`ReceivePacer`: enough free slots, the batching window)."""
        if self._stopping.is_set():
            return None
        if max_messages is not None and self.stats.received >= max_messages:
            return None
        # Backpressure: no more than the heartbeat keeps on time (the core's pace).
        left = None if max_messages is None else max_messages - self.stats.received
        return self._pacer.want(self._clock(), self.book.room(free), left)

    def _received(self, asked: int, got: int) -> None:
        """A receive came back: the pacer opens its batching window if it was short."""
        self._pacer.received(self._clock(), asked, got)

    def _receive_call(self, want: int) -> Flow[list[Delivery | Poison]]:
        self._receive_turn += 1
        return receive_prioritized_flow(
            queue_urls=self.queue_urls,
            turn=self._receive_turn - 1,
            max_messages=want,
            wait_seconds=self.receive_wait,
            visibility=self.receive_visibility,
        )

    def _idle_over(self, busy: bool, idle_exit: float | None) -> bool:
        """After a receive: True once the worker has been idle ``idle_exit`` seconds.
        Idle counts from when the last job finished, not from the last receive: a
        retry a job just scheduled comes back within its backoff."""
        now = self._clock()
        if busy:
            self._idle_since = now
            return False
        return idle_exit is not None and now - self._idle_since >= idle_exit

    def stop(self) -> None:
        """Stop receiving and tell every running attempt to stop.

        Their ``ctx.wait()``/``ctx.check()`` raise ``WorkerShuttingDown``; each job
        goes back to the queue (attempt not spent) as its handler ends. Handlers
        get ``shutdown_grace`` seconds for that; the rest are released anyway.
        Safe from any thread and from a signal handler: it only sets flags (the
        heartbeat passes the request on within a tick).
        """
        self._stopping.set()
        self.book.stopping = True

    def install_signal_handlers(self) -> None:
        """Stop gracefully on SIGTERM/SIGINT; the previous handlers return when run() ends."""

        def handle(signum: int, frame: FrameType | None) -> None:
            self.journal("worker_stopping", signal=signal.Signals(signum).name)
            self.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            self._saved_signals[sig] = signal.signal(sig, handle)

    def _restore_signal_handlers(self) -> None:
        for sig, previous in self._saved_signals.items():
            signal.signal(sig, previous)
        self._saved_signals.clear()
