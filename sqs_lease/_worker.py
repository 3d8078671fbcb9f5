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

import concurrent.futures
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from ._aws import SyncDriver, Timeouts
from ._core.attempt import attempt_flow, flush_deletes_flow
from ._core.calls import Flow
from ._core.env import HandlerRun
from ._core.inputs import loads as _loads
from ._core.messages import Delivery, Poison
from ._core.rounds import heartbeat_tick_flow
from ._core.shutdown import Drive, WaitAttempts, received_flow, shutdown_order
from ._core.sweeps import first_sweep_wait
from ._errors import ConfigError
from ._interrupt import stop_on_interrupt
from ._jobs import App
from ._options import Shell
from ._shell import WorkerShell, WorkerStats

ROUND_THREADS = 4
"""Threads that run a heartbeat round's parts at once (each part: 100 leases)."""


class Worker(WorkerShell):
    """Consume one queue, run handlers under heartbeat-extended leases, commit fenced.

    ``receive_visibility`` is the lease a message gets at receive, by default the
    shortest lease among the classes: it is the job's first lease (no visibility
    change at the claim while its first beat keeps a full reserve), and the
    heartbeat brings a shorter one to the class's own lease at once. Ended jobs'
    messages are deleted 10 per call within 0.25 s, and all at the stop.

    A receive asks for a full batch once 10 slots are free (or waits briefly for
    them). ``receive_window`` seconds (default 0: off) is a batching window: after
    a receive that came back short, the next waits that long, so messages that
    trickle in are received 10 at a time (fewer requests, up to that much latency).

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

    cannot_await = (
        "the thread worker cannot await: run the app with AsyncWorker (sqs-lease worker "
        "picks it, or give --async), or make them plain functions"
    )

    shell: ClassVar[Shell] = "thread"

    def _built(self) -> None:
        super()._built()
        self.driver = SyncDriver(self.settings, self.journal, self.timeouts, clock=self._clock)
        self.poll_driver = SyncDriver(
            self.settings,
            self.journal,
            Timeouts(read=self.receive_wait + 5.0, attempts=1),
            clock=self._clock,
        )
        self.poll_driver.observers = self.receive_observers
        self._threads: list[threading.Thread] = []
        # A heartbeat round's parts (100 leases each) run at once on a small pool.
        self._round_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.env.run_parallel = self._run_parallel
        self._running = 0  # job threads started and not yet through their attempt
        self._slot_freed = threading.Event()  # a job thread ended: the receive loop looks
        self._deletes_done = threading.Event()
        # Set once the shutdown handed back what it held: a handler that ignored the
        # stop keeps its thread, but its lease was let go and needs no heartbeat.
        self._beats_done = threading.Event()

    # ----------------------------------------------------------------- running

    def run(
        self, *, max_messages: int | None = None, idle_exit: float | None = None
    ) -> WorkerStats:
        """Receive and run until stopped (or idle for ``idle_exit`` s, or after
        ``max_messages`` received); then shut down cleanly. Returns the counters.

        Ctrl-C (SIGINT) stops it gracefully, like ``stop()``, when the program set
        no SIGINT handler of its own: no ``KeyboardInterrupt`` escapes mid-call."""
        undo_interrupt = stop_on_interrupt(self.journal, self.stop)
        self.journal(
            "worker_started",
            queue=self.queue_url,
            concurrency=self.concurrency,
            classes=sorted(self.app.classes),
        )
        self._round_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=ROUND_THREADS, thread_name_prefix="heartbeat-part"
        )
        beat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        beat.start()
        sweep: threading.Thread | None = None
        if self.sweep_interval is not None:
            sweep = threading.Thread(target=self._sweep_loop, name="sweep", daemon=True)
            sweep.start()
        self._deletes_done.clear()
        self._beats_done.clear()
        deleter = threading.Thread(target=self._delete_loop, name="deletes", daemon=True)
        deleter.start()
        self._idle_since = self._clock()
        try:
            while True:
                self._slot_freed.clear()
                want = self._receive_more(self._free_slots(), max_messages)
                if want is None:
                    break
                if want == 0:
                    self._slot_freed.wait(self.tick)
                    continue
                batch = self.poll_driver.run(self._receive_call(want))
                self._received(want, len(batch))
                if self._idle_over(bool(batch or len(self.book) or self._alive()), idle_exit):
                    break
                for item in batch:
                    if self.driver.run(received_flow(self.env, item)):
                        self._start(item)
        finally:
            self._shutdown()
            self._stopping.set()
            self._beats_done.set()
            self._deletes_done.set()
            deleter.join(timeout=5)
            beat.join(timeout=5)
            self._round_pool.shutdown(wait=False)
            if sweep is not None:
                sweep.join(timeout=5)
            self._restore_signal_handlers()
            undo_interrupt()
        self.journal("worker_stopped", **self.stats.__dict__)
        return self.stats

    @property
    def in_flight(self) -> int:
        """Attempts this worker holds now (claimed, not yet ended)."""
        return len(self.book)

    def _free_slots(self) -> int:
        with self._lock:
            return max(0, self.concurrency - self._running)

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
            self._running += 1
        t.start()

    def _shutdown(self) -> None:
        """The core's shutdown order (``shutdown_order``), each step performed here."""
        steps = shutdown_order(self.env, asked=self._stopping.is_set(), grace=self.shutdown_grace)
        for step in steps:
            if isinstance(step, Drive):
                self.driver.run(step.flow)
                continue
            deadline = self._clock() + step.seconds
            if isinstance(step, WaitAttempts):
                for t in list(self._threads):
                    t.join(timeout=max(0.0, deadline - self._clock()))
                continue
            while step.writing() and self._clock() < deadline:
                time.sleep(self.tick / 4)

    # ----------------------------------------------------------------- one job

    def _process(self, item: Delivery | Poison) -> None:
        try:
            self.driver.run(attempt_flow(self.env, item))
        finally:
            with self._lock:
                self._running -= 1
            self._slot_freed.set()

    def _delete_loop(self) -> None:
        """Send the deletes that waited their window (full batches go at once, from
        the job thread that filled them)."""
        while not self._deletes_done.wait(self.deletes.window / 2):
            try:
                self.driver.run(flush_deletes_flow(self.env))
            except Exception as exc:  # the driver's own failure: the thread survives it
                self.journal("message_delete_failed", error_code=type(exc).__name__)

    def _run_handler(self, run: HandlerRun) -> Any:
        """``Invoke("handler")``, in the job's thread."""
        return self._handler_here(run, self.driver.run)

    # ----------------------------------------------------------------- heartbeat

    def _heartbeat_loop(self) -> None:
        while not self._beats_done.is_set() and not (
            self._stopping.is_set() and not len(self.book) and not self._alive()
        ):
            try:
                self._beat_once()
            except Exception as exc:  # the driver's own failure: the thread survives it too
                self.journal("heartbeat_error", error_code=type(exc).__name__)
            time.sleep(self.tick)

    def _beat_once(self) -> None:
        self.driver.run(heartbeat_tick_flow(self.env, stopping=self._stopping.is_set()))

    def _run_parallel(self, flows: Sequence[Flow[Any]]) -> list[Any]:
        """``Invoke("parallel")``: a round's parts at once, on the round pool."""
        if self._round_pool is None:  # a round outside run() (tests drive it by hand)
            return [self.driver.run(f) for f in flows]
        return list(self._round_pool.map(self.driver.run, flows))

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
        return self.driver.run(self._sweep_once_flow())


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
    return None if text is None else _loads(text)
