"""The sync worker: a thin thread shell around the core flows.

Threads: the caller's thread receives; one thread per running job drives the
core's ``attempt_flow`` (claim, hold, handler, ending) with a ``SyncDriver``; one
heartbeat thread drives ``heartbeat_round_flow`` every tick; a sweep thread
``sweep_once_flow``. The held leases live in the core's ``LeaseBook`` (guarded by
this worker's lock). This module only schedules and performs instructions (the
handler runs in its job thread, as ``Invoke("handler")``); every decision is made
by a flow or a pure function of ``sqs_lease._core``.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from types import FrameType
from typing import Any

from pydantic import BaseModel

from ._aws import SyncDriver, Timeouts
from ._clock import lease_clock
from ._config import Settings
from ._core.attempt import (
    AttemptEnv,
    HandlerRun,
    Now,
    attempt_flow,
    first_sweep_wait,
    heartbeat_tick_flow,
    held_effect_flow,
    release_unstarted_flow,
    shutdown_flow,
    sweep_once_flow,
)
from ._core.flows import (
    UNKNOWN_CLASS_RECEIVES,
    UNSENT_GRACE_SECONDS,
    Delivery,
    Poison,
    receive_flow,
)
from ._core.intents import EffectResult, EffectSpec
from ._core.leasebook import LeaseBook
from ._errors import ConfigError
from ._jobs import App, JobClass, JobContext
from ._journal import Journal
from ._schema import IntentTable, JobTable
from ._shell import (
    STAT_NAMES,
    WorkerStats,
    async_handlers,
    check_options,
    default_worker_id,
    find_queue,
)


class Worker:
    """Consume one queue, run handlers under heartbeat-extended leases, commit fenced.

    ``receive_visibility`` is the lease a message gets at receive, before its claim
    sets the class's own lease; by default the shortest lease among the classes.

    Every ``sweep_interval`` seconds (``None`` turns it off) a separate thread sends
    again up to ``sweep_limit`` records left without a sent message for longer than
    ``sweep_grace`` seconds (a producer that died between its write and its send, a
    resume whose send failed). Many workers may sweep at once: each re-send is won
    by one of them.

    A message naming a job class this worker's app does not know (another version
    of the app on the same queue) is never claimed: it is left for a worker that
    knows the class, with a growing visibility backoff, and after
    ``unknown_class_receives`` receives (or one before the queue's own redrive)
    moved to the DLQ with the reason.
    """

    def __init__(
        self,
        app: App,
        settings: Settings,
        *,
        worker_id: str | None = None,
        concurrency: int = 4,
        receive_wait: int = 2,
        receive_visibility: int | None = None,
        shutdown_grace: float = 20.0,
        timeouts: Timeouts | None = None,
        journal: Journal | None = None,
        tick: float = 0.1,
        rng: random.Random | None = None,
        sweep_interval: float | None = 60.0,
        sweep_grace: float = UNSENT_GRACE_SECONDS,
        sweep_limit: int = 25,
        unknown_class_receives: int = UNKNOWN_CLASS_RECEIVES,
    ) -> None:
        check_options(
            app,
            receive_wait=receive_wait,
            sweep_interval=sweep_interval,
            sweep_grace=sweep_grace,
            sweep_limit=sweep_limit,
            unknown_class_receives=unknown_class_receives,
        )
        if not 1 <= concurrency <= 1000:
            raise ConfigError(f"concurrency={concurrency}: choose 1..1000")
        if async_handlers(app):
            raise ConfigError(
                f"job classes {', '.join(async_handlers(app))} have async handlers: run them "
                "with AsyncWorker (sqs-lease worker picks it, or give --async)"
            )
        self.sweep_interval = sweep_interval
        self.sweep_grace = sweep_grace
        self.sweep_limit = sweep_limit
        self.app = app
        self.settings = settings
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.receive_wait = receive_wait
        shortest = min(r.job_class.lease_seconds for r in app.classes.values())
        self.receive_visibility = receive_visibility or shortest
        self.shutdown_grace = shutdown_grace
        self.tick = tick
        self.rng = rng or random.Random()
        self.journal = journal or Journal(worker_id=self.worker_id)
        if self.journal.worker_id is None:
            self.journal.worker_id = self.worker_id
        heartbeat = min(r.job_class.heartbeat_seconds for r in app.classes.values())
        # A heartbeat call must give up well inside the reserve (jitter) of a lease.
        read = max(0.5, min(5.0, heartbeat))
        # Every lease measurement of this worker (its drivers' stamps, its heartbeat,
        # its handlers' contexts) is on the one lease clock (CLOCK_BOOTTIME if any).
        self._clock: Callable[[], float] = lease_clock
        self.driver = SyncDriver(
            settings, self.journal, timeouts or Timeouts(read=read), clock=self._clock
        )
        self.poll_driver = SyncDriver(
            settings, self.journal, Timeouts(read=receive_wait + 5.0, attempts=1), clock=self._clock
        )
        self.table = JobTable(settings.jobs_table)
        self.intents = IntentTable(settings.intents_table, settings.attempts_table)
        setup = find_queue(app, settings, self.journal, unknown_class_receives)
        self.queue_url = setup.queue_url
        self.dlq_url = setup.dlq_url
        self.unknown_class_receives = setup.unknown_class_receives
        self.stats = WorkerStats()
        self._lock = threading.Lock()
        # The leases this worker holds; job threads and the heartbeat thread share it.
        self.book = LeaseBook(self._lock)
        self._stats_lock = threading.Lock()
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
            tally=self._count,
            new_signal=threading.Event,
            run_handler=self._run_handler,
        )
        self._slots = threading.Semaphore(concurrency)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._saved_signals: dict[int, Any] = {}

    # ----------------------------------------------------------------- running

    def stop(self) -> None:
        """Stop receiving and tell every running attempt to stop.

        Their ``ctx.wait()``/``ctx.check()`` raise ``WorkerShuttingDown``; each job
        goes back to the queue (attempt not spent) as its handler ends. Handlers
        get ``shutdown_grace`` seconds for that; the rest are released anyway.
        Safe from a signal handler: it only sets flags (the heartbeat thread
        passes the request on within a tick).
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

    def run(
        self, *, max_messages: int | None = None, idle_exit: float | None = None
    ) -> WorkerStats:
        """Receive and run until stopped (or idle for ``idle_exit`` s, or after
        ``max_messages`` received); then shut down cleanly. Returns the counters."""
        self.journal(
            "worker_started",
            queue=self.queue_url,
            concurrency=self.concurrency,
            classes=sorted(self.app.classes),
        )
        beat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        beat.start()
        sweep: threading.Thread | None = None
        if self.sweep_interval is not None:
            sweep = threading.Thread(target=self._sweep_loop, name="sweep", daemon=True)
            sweep.start()
        idle_since = self._clock()
        try:
            while not self._stopping.is_set():
                if max_messages is not None and self.stats.received >= max_messages:
                    break
                free = self._free_slots()
                if free == 0:
                    self._stopping.wait(self.tick)
                    continue
                want = (
                    free if max_messages is None else min(free, max_messages - self.stats.received)
                )
                batch = self.poll_driver.run(
                    receive_flow(
                        queue_url=self.queue_url,
                        max_messages=want,
                        wait_seconds=self.receive_wait,
                        visibility=self.receive_visibility,
                    )
                )
                if batch or len(self.book) or self._alive():
                    # Idle counts from when the last job finished, not from the last
                    # receive: a retry a job just scheduled comes back within its backoff.
                    idle_since = self._clock()
                elif idle_exit is not None and self._clock() - idle_since >= idle_exit:
                    break
                for item in batch:
                    self._count("received")
                    if self._stopping.is_set():
                        self._release_unstarted(item)
                        continue
                    self._start(item)
        finally:
            self._shutdown()
            self._stopping.set()
            beat.join(timeout=5)
            if sweep is not None:
                sweep.join(timeout=5)
            self._restore_signal_handlers()
        self.journal("worker_stopped", **self.stats.__dict__)
        return self.stats

    def _count(self, name: str, n: int | bool = 1) -> None:
        """``env.tally``: count what a flow names (the simulator's own counters, which
        these stats do not have, are skipped)."""
        if name not in STAT_NAMES:
            return
        # Job threads and the heartbeat thread all count; += on an attribute is not atomic.
        with self._stats_lock:
            setattr(self.stats, name, getattr(self.stats, name) + int(n))

    def _now(self) -> Now:
        return Now(self._clock(), time.time())

    def _rules_of(self, job_class: str) -> JobClass | None:
        reg = self.app.get(job_class)
        return reg.job_class if reg else None

    def _free_slots(self) -> int:
        with self._lock:
            return max(0, self.concurrency - sum(1 for t in self._threads if t.is_alive()))

    def _start(self, item: Delivery | Poison) -> None:
        t = threading.Thread(
            target=self._process,
            args=(item,),
            daemon=True,
            name=f"job-{getattr(item, 'job_id', None)}",
        )
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
        t.start()

    def _release_unstarted(self, item: Delivery | Poison) -> None:
        self.driver.run(release_unstarted_flow(self.env, item))

    def _shutdown(self) -> None:
        if self._stopping.is_set():
            # Asked to stop (not just done: max_messages or idle_exit let handlers finish).
            self.book.request_stop()
        deadline = self._clock() + self.shutdown_grace
        for t in list(self._threads):
            t.join(timeout=max(0.0, deadline - self._clock()))
        self.driver.run(shutdown_flow(self.env))

    # ----------------------------------------------------------------- one job

    def _process(self, item: Delivery | Poison) -> None:
        self.driver.run(attempt_flow(self.env, item))

    def _run_handler(self, run: HandlerRun) -> Any:
        """``Invoke("handler")``, in the job's thread: build its context, call the handler."""
        held, claim = run.held, run.claim
        reg = self.app.get(claim.job.job_class)
        assert reg is not None  # attempt_flow runs a handler only for a known class
        ctx: JobContext[Any] = JobContext(
            job_id=claim.job.job_id,
            job_class=reg.job_class,
            payload=run.payload,
            payload_hash=claim.job.payload_hash,
            token=claim.token,
            attempt=claim.attempt,
            worker_id=self.worker_id,
            lease=held.lease,
            lock=self._lock,
            cancelled=held.cancelled,  # a threading.Event (new_signal)
            clock=self._clock,
            journal=self.journal,
            run_effect=lambda spec: self._run_effect(spec, run),
            targets=self.app.targets,
            stage=claim.job.stage or "main",
        )
        result = reg.handler(ctx, run.payload)
        return result.model_dump(mode="json") if isinstance(result, BaseModel) else result

    def _run_effect(self, spec: EffectSpec, run: HandlerRun) -> EffectResult:
        return self.driver.run(
            held_effect_flow(
                self.env, run.held, spec, wall_clock=time.time, flow_id=uuid.uuid4().hex
            )
        )

    # ----------------------------------------------------------------- heartbeat

    def _heartbeat_loop(self) -> None:
        while not (self._stopping.is_set() and not len(self.book) and not self._alive()):
            try:
                self._beat_once()
            except Exception as exc:  # the driver's own failure: the thread survives it too
                self.journal("heartbeat_error", error_code=type(exc).__name__)
            time.sleep(self.tick)

    def _beat_once(self) -> None:
        self.driver.run(heartbeat_tick_flow(self.env, stopping=self._stopping.is_set()))

    def _alive(self) -> bool:
        with self._lock:
            return any(t.is_alive() for t in self._threads)

    # ----------------------------------------------------------------- stranded sweep

    def _sweep_loop(self) -> None:
        assert self.sweep_interval is not None
        wait = first_sweep_wait(self.sweep_interval, self.rng.random())
        while not self._stopping.wait(wait):
            self.sweep_once()
            wait = self.sweep_interval

    def sweep_once(self) -> int:
        """One bounded sweep of stranded records; returns how many were sent again.

        Never raises: a failed sweep is journaled (``stranded_sweep_failed``, with
        the fix when the index is missing) and the next one tries again.
        """
        return self.driver.run(
            sweep_once_flow(
                self.env,
                older_than=self.sweep_grace,
                limit=self.sweep_limit,
                send_id_prefix=uuid.uuid4().hex,
            )
        )


def load_app(spec: str) -> App:
    """Import ``MODULE:OBJECT`` and return the App it names."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"app {spec!r}: write it as MODULE:OBJECT, e.g. myjobs:app")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"app {spec!r}: cannot import {module_name!r}: {exc}") from None
    obj = getattr(module, attr, None)
    if not isinstance(obj, App):
        raise ConfigError(f"app {spec!r}: {attr!r} is not a sqs_lease.App")
    return obj


def result_of(text: str | None) -> Any:
    return None if text is None else json.loads(text)
