"""The async worker: an asyncio shell around the core flows (aiobotocore).

One event loop holds every job: a receive loop, one task per job (claim,
handler, end), one heartbeat task extending every held lease in batches
(``heartbeat_flow``: visibility 10 per call, ownership 100 per call), and a
sweep task. ``async def`` handlers run on the loop and get an
:class:`~sqs_lease.AsyncJobContext`; plain handlers run in a bounded thread
pool and get the usual :class:`~sqs_lease.JobContext`. Every decision is made
by a flow or a pure function of ``sqs_lease._core``.

**A blocked loop is not a live worker.** The heartbeat runs on the loop, so a
handler that holds the loop also holds every heartbeat. Each step of a job's
task is timed (:class:`_Watch`); a step that held the loop past the tolerated
lag (``max_loop_lag``) makes the core's :func:`~sqs_lease._core.timing.judge_stall`
drop that job's lease (it is given back for a counted retry) and name every
other lease the stall let lapse; a thread journals ``loop_blocked`` while the
loop is still held, so no lease lapses unjournaled. Why this and not a
heartbeat thread: docs/operations.md, "The async worker".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import signal
import threading
import time
import types
import uuid
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import Any, TypeVar

from pydantic import BaseModel

from ._aio import AsyncDriver
from ._aws import Timeouts
from ._clock import lease_clock
from ._config import Settings
from ._core.calls import Emit
from ._core.endings import EndKind, ending_for, stopped_ending
from ._core.flows import (
    UNKNOWN_CLASS_RECEIVES,
    UNSENT_GRACE_SECONDS,
    Claimed,
    Delivery,
    Finish,
    LossSource,
    Poison,
    admit_flow,
    apply_beats,
    commit_flow,
    fail_flow,
    gave_back,
    heartbeat_flow,
    lose,
    lost_event,
    park_flow,
    poison_flow,
    receive_flow,
    rejected_loss,
    release_flow,
    retry_flow,
    sweep_flow,
)
from ._core.intents import EffectResult, EffectSpec, effect_flow
from ._core.records import JobView
from ._core.timing import (
    OPEN,
    Drop,
    LeaseStatus,
    LocalLease,
    Stop,
    backoff_delay,
    judge_stall,
    plan_heartbeat,
    tolerated_loop_lag,
)
from ._errors import ConfigError, LeaseLost, PayloadError
from ._jobs import App, AsyncJobContext, JobClass, JobContext, canonical_json
from ._journal import Journal
from ._schema import IntentTable, JobTable
from ._shell import (
    WorkerStats,
    async_handlers,
    check_options,
    default_worker_id,
    find_queue,
    not_claimed_counter,
)

T = TypeVar("T")

MAX_CONCURRENCY = 100_000


@dataclass
class _Held:
    lease: LocalLease
    job: JobView
    delivery: Delivery
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Set on the loop with ``cancelled``, for an async handler's ``await ctx.wait()``.
    astopped: asyncio.Event = field(default_factory=asyncio.Event)

    def tell_stop(self) -> None:
        """Wake the handler's waits (call on the loop; the lease says why)."""
        self.cancelled.set()
        self.astopped.set()


@dataclass
class _Step:
    job_id: str | None
    began: float
    reported: bool = False  # loop_blocked journaled (by the watch thread, or on the loop)
    judged: bool = False  # judge_stall applied (at the step's end, or at a check within it)


class _Watch:
    """Times every step a job's task takes on the loop, and who holds it now.

    The loop thread enters and leaves steps; the watch thread only reads
    ``current`` to journal a stall while it lasts.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.current: _Step | None = None
        self.lock = threading.Lock()


class AsyncWorker:
    """Consume one queue on one event loop: thousands of jobs per process.

    The same protocol, options, journal events, counters and stop behaviour as
    :class:`~sqs_lease.Worker`; handlers may be ``async def`` (run on the loop,
    ``ctx`` is an :class:`~sqs_lease.AsyncJobContext`) or plain functions (run in
    a pool of ``threads`` threads, ``ctx`` is a :class:`~sqs_lease.JobContext`).
    ``concurrency`` bounds the jobs held at once (1..100,000).

    ``max_loop_lag`` is the longest a handler's step may hold the event loop
    (default: 1 s, lowered to half of what the tightest job class survives; it
    must stay under ``lease - heartbeat - jitter`` of every class). A step that
    holds it longer loses its lease (``loop_blocked``, then ``lease_dropped``
    with reason ``loop_blocked``) and its attempt is given back for a counted
    retry; blocking work belongs in a plain handler or ``asyncio.to_thread``.

    ``run()`` blocks (it runs its own event loop); ``await worker.serve()`` runs
    on the caller's loop. ``stop()`` is safe from any thread and from a signal
    handler.
    """

    def __init__(
        self,
        app: App,
        settings: Settings,
        *,
        worker_id: str | None = None,
        concurrency: int = 1000,
        threads: int = 16,
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
        max_loop_lag: float | None = None,
        beat_parallel: int = 8,
    ) -> None:
        check_options(
            app,
            receive_wait=receive_wait,
            sweep_interval=sweep_interval,
            sweep_grace=sweep_grace,
            sweep_limit=sweep_limit,
            unknown_class_receives=unknown_class_receives,
        )
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ConfigError(f"concurrency={concurrency}: choose 1..{MAX_CONCURRENCY}")
        if not 1 <= threads <= 1000:
            raise ConfigError(
                f"threads={threads}: choose 1..1000 threads for plain (non-async) handlers"
            )
        if not 1 <= beat_parallel <= 100:
            raise ConfigError(f"beat_parallel={beat_parallel}: choose 1..100 heartbeat calls")
        self.max_loop_lag = tolerated_loop_lag(
            max_loop_lag,
            [
                (
                    n,
                    r.job_class.lease_seconds,
                    r.job_class.heartbeat_seconds,
                    r.job_class.jitter_seconds,
                )
                for n, r in app.classes.items()
            ],
        )
        self.app = app
        self.settings = settings
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.threads = threads
        self.receive_wait = receive_wait
        shortest = min(r.job_class.lease_seconds for r in app.classes.values())
        self.receive_visibility = receive_visibility or shortest
        self.shutdown_grace = shutdown_grace
        self.tick = tick
        self.rng = rng or random.Random()
        self.sweep_interval = sweep_interval
        self.sweep_grace = sweep_grace
        self.sweep_limit = sweep_limit
        self.beat_parallel = beat_parallel
        self.journal = journal or Journal(worker_id=self.worker_id)
        if self.journal.worker_id is None:
            self.journal.worker_id = self.worker_id
        heartbeat = min(r.job_class.heartbeat_seconds for r in app.classes.values())
        read = max(0.5, min(5.0, heartbeat))
        self.timeouts = timeouts or Timeouts(read=read)
        self._clock: Callable[[], float] = lease_clock
        self.table = JobTable(settings.jobs_table)
        self.intents = IntentTable(settings.intents_table, settings.attempts_table)
        setup = find_queue(app, settings, self.journal, unknown_class_receives)
        self.queue_url = setup.queue_url
        self.dlq_url = setup.dlq_url
        self.unknown_class_receives = setup.unknown_class_receives
        self.stats = WorkerStats()
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()  # leases are read by handler threads too
        self._stopping = threading.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._saved_signals: dict[int, Any] = {}
        self._watch = _Watch(self._clock)
        self._watch_stop = threading.Event()
        self._async_classes = frozenset(async_handlers(app))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._driver: AsyncDriver | None = None
        self.calls = 0  # AWS calls made by the last run (both drivers)

    # ----------------------------------------------------------------- running

    def stop(self) -> None:
        """Stop receiving and tell every running attempt to stop (see ``Worker.stop``).

        Safe from any thread and from a signal handler: it only sets a flag; the
        heartbeat task passes the request on within a tick.
        """
        self._stopping.set()

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
        """Run on a new event loop until stopped (or idle for ``idle_exit`` s, or
        after ``max_messages`` received); then shut down cleanly. Returns the counters."""
        return asyncio.run(self.serve(max_messages=max_messages, idle_exit=idle_exit))

    async def serve(
        self, *, max_messages: int | None = None, idle_exit: float | None = None
    ) -> WorkerStats:
        """:meth:`run` on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self.journal(
            "worker_started",
            queue=self.queue_url,
            concurrency=self.concurrency,
            classes=sorted(self.app.classes),
            shell="async",
            max_loop_lag=self.max_loop_lag,
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.threads, thread_name_prefix="sqs-lease-job"
        )
        self._watch_stop.clear()
        watch = threading.Thread(target=self._watch_loop, name="loop-watch", daemon=True)
        driver = AsyncDriver(self.settings, self.journal, self.timeouts, clock=self._clock)
        poll = AsyncDriver(
            self.settings,
            self.journal,
            Timeouts(read=self.receive_wait + 5.0, attempts=1),
            clock=self._clock,
        )
        async with driver, poll:
            self._driver = driver
            beat = asyncio.create_task(self._heartbeat_loop(), name="heartbeat")
            sweep = (
                asyncio.create_task(self._sweep_loop(), name="sweep")
                if self.sweep_interval is not None
                else None
            )
            watch.start()
            try:
                await self._receive_loop(poll, max_messages, idle_exit)
            finally:
                await self._shutdown()
                self._stopping.set()
                await self._join(beat, 5.0)
                if sweep is not None:
                    sweep.cancel()
                    await asyncio.gather(sweep, return_exceptions=True)
                self._watch_stop.set()
                self._restore_signal_handlers()
                self._pool.shutdown(wait=False, cancel_futures=True)
                self.calls = driver.calls + poll.calls
        self.journal("worker_stopped", **self.stats.__dict__)
        return self.stats

    async def _join(self, task: asyncio.Task[None], timeout: float) -> None:
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(task, timeout)

    async def _receive_loop(
        self, poll: AsyncDriver, max_messages: int | None, idle_exit: float | None
    ) -> None:
        idle_since = self._clock()
        while not self._stopping.is_set():
            if max_messages is not None and self.stats.received >= max_messages:
                break
            free = self.concurrency - len(self._tasks)
            if free <= 0:
                await asyncio.sleep(self.tick)
                continue
            want = free if max_messages is None else min(free, max_messages - self.stats.received)
            batch = await poll.run(
                receive_flow(
                    queue_url=self.queue_url,
                    max_messages=want,
                    wait_seconds=self.receive_wait,
                    visibility=self.receive_visibility,
                )
            )
            if batch or self._held or self._tasks:
                # Idle counts from when the last job finished (a retry comes back).
                idle_since = self._clock()
            elif idle_exit is not None and self._clock() - idle_since >= idle_exit:
                break
            for item in batch:
                self._count("received")
                if self._stopping.is_set():
                    await self._release_unstarted(item)
                    continue
                self._start(item)

    def _count(self, name: str, n: int | bool = 1) -> None:
        # Handler threads count too (their effects' losses); keep it atomic.
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + int(n))

    def _start(self, item: Delivery | Poison) -> None:
        job_id = getattr(item, "job_id", None)
        task = asyncio.create_task(
            self._observed(job_id, self._attempt(item)), name=f"job-{job_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, flow: Any) -> Any:
        assert self._driver is not None
        return await self._driver.run(flow)

    async def _release_unstarted(self, item: Delivery | Poison) -> None:
        if isinstance(item, Delivery):
            released = await self._run(
                release_flow(
                    self.table,
                    queue_url=self.queue_url,
                    held=[(None, item)],
                    worker_id=self.worker_id,
                    wall_now=time.time(),
                    reason="shutdown",
                )
            )
            self._count("released", released)

    def _request_stop(self) -> None:
        """Pass a shutdown on to every attempt still held (idempotent; on the loop)."""
        with self._lock:
            told = [
                h for h in self._held.values() if h.lease.status in OPEN and not h.lease.shutdown
            ]
            for h in told:
                h.lease.shutdown = True
        for h in told:
            h.tell_stop()

    async def _shutdown(self) -> None:
        if self._stopping.is_set():
            self._request_stop()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.shutdown_grace)
        with self._lock:
            left = [h for h in self._held.values() if h.lease.status in OPEN]
            for h in left:
                h.lease.drop(Drop.SHUTDOWN)
        for h in left:
            h.tell_stop()
        if left:
            # No claimed job leaves without a decision: it goes back to queued, at once.
            released = await self._run(
                release_flow(
                    self.table,
                    queue_url=self.queue_url,
                    held=[(h.job, h.delivery) for h in left],
                    worker_id=self.worker_id,
                    wall_now=time.time(),
                    reason="shutdown: handler overran the grace period",
                )
            )
            self._count("released", released)
            with self._lock:
                for h in left:
                    gave_back(h.lease, "shutdown")
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5.0)

    # ----------------------------------------------------------------- the loop watch

    def _observed(
        self, job_id: str | None, coro: Coroutine[Any, Any, None]
    ) -> Coroutine[Any, Any, None]:
        """Run ``coro`` timing each of its steps on the loop (see :meth:`_stalled`)."""

        @types.coroutine
        def steps() -> Generator[Any, Any, None]:
            value: Any = None
            error: BaseException | None = None
            while True:
                step = _Step(job_id, self._clock())
                self._watch.current = step
                try:
                    yielded = coro.throw(error) if error is not None else coro.send(value)
                except StopIteration:
                    return
                finally:
                    self._watch.current = None
                    ended = self._clock()
                    if ended - step.began > self.max_loop_lag and not step.judged:
                        self._stalled(step, ended)
                try:
                    value, error = (yield yielded), None
                except BaseException as exc:  # passed on into the job's coroutine
                    value, error = None, exc

        async def run() -> None:
            await steps()

        return run()

    def _judge_now(self) -> None:
        """Judge the running step now if it already held the loop past the tolerated
        lag: a handler that blocked and then checks, or returns, within the same step
        must meet the verdict (a lease check, the ending), not slip past it."""
        step = self._watch.current
        if step is None or step.judged:
            return
        now = self._clock()
        if now - step.began > self.max_loop_lag:
            self._stalled(step, now)

    def _stalled(self, step: _Step, ended: float) -> None:
        """A job's step held the loop past the tolerated lag: ask the core what it cost."""
        step.judged = True
        with self._lock:
            held = self._held.get(step.job_id) if step.job_id is not None else None
            blocker = held.lease if held is not None else None
            stall = judge_stall(
                [h.lease for h in self._held.values()],
                blocker=blocker,
                blocker_job=step.job_id,
                began=step.began,
                ended=ended,
                tolerated=self.max_loop_lag,
            )
            if stall.drop is not None:
                stall.drop.drop(Drop.LOOP_BLOCKED)
        with self._watch.lock:
            reported, step.reported = step.reported, True
        if stall.event is not None:
            if not reported:  # a stall too short for the watch thread to see
                self.journal(
                    "loop_blocked",
                    job_id=step.job_id,
                    token=blocker.token if blocker is not None else None,
                    blocked_for=stall.event["blocked_for"],
                    tolerated=self.max_loop_lag,
                    held=len(self._held),
                )
            self.journal.write("loop_unblocked", stall.event)
        if stall.drop is not None and held is not None:
            held.tell_stop()
            self.journal(
                "lease_dropped",
                job_id=stall.drop.job_id,
                token=stall.drop.token,
                reason=Drop.LOOP_BLOCKED.value,
                lease_left=round(stall.drop.deadline - ended, 3),
            )
            # Given back for a counted retry, like any watchdog drop (heartbeat task).
            self._spawn_give_back(held, Drop.LOOP_BLOCKED)

    def _watch_loop(self) -> None:
        """Journal a stall while the loop is still held (the loop cannot say it)."""
        period = max(0.05, self.max_loop_lag / 2)
        while not self._watch_stop.wait(period):
            step = self._watch.current
            if step is None:
                continue
            held_for = self._clock() - step.began
            if held_for <= self.max_loop_lag:
                continue
            with self._watch.lock:
                if step.reported:
                    continue
                step.reported = True
            with self._lock:
                h = self._held.get(step.job_id) if step.job_id is not None else None
                token = h.lease.token if h is not None else None
                held = len(self._held)
            self.journal(
                "loop_blocked",
                job_id=step.job_id,
                token=token,
                blocked_for=round(held_for, 3),
                tolerated=self.max_loop_lag,
                held=held,
            )

    # ----------------------------------------------------------------- one job

    async def _attempt(self, item: Delivery | Poison) -> None:
        """One message, from receive to a decided end (the one per-job sequence)."""
        if isinstance(item, Poison):
            self._count("poisoned")
            await self._run(
                poison_flow(
                    self.table,
                    queue_url=self.queue_url,
                    poison=item,
                    dlq_url=self.dlq_url,
                    body=item.body,
                )
            )
            return
        reg = self.app.get(item.job_class)
        job_class = reg.job_class if reg else None
        claim = await self._run(
            admit_flow(
                self.table,
                queue_url=self.queue_url,
                dlq_url=self.dlq_url,
                delivery=item,
                known_class=job_class is not None,
                worker_id=self.worker_id,
                wall_now=time.time(),
                lease_seconds=job_class.lease_seconds if job_class else self.receive_visibility,
                max_attempts=job_class.max_attempts if job_class else 1_000_000,
                unknown_class_receives=self.unknown_class_receives,
                rand=self.rng.random() if job_class is None else 0.5,
            )
        )
        if not isinstance(claim, Claimed):
            counter = not_claimed_counter(claim)
            if counter is not None:
                self._count(counter)
            return
        self._count("claimed")
        self._count("reclaimed", claim.reclaimed)
        if reg is None or job_class is None:  # pragma: no cover - admit_flow never claims it
            return
        try:
            payload = job_class.validate_payload(claim.job.payload_json or "")
        except PayloadError as exc:
            self._count("poisoned")
            await self._finish_fail(claim, None, str(exc), "invalid_payload", poisoned=True)
            return
        held = self._hold(claim, job_class)
        try:
            error: Exception | None = None
            result: Any = None
            start = self._clock()
            with self._lock:
                told = held.lease.stop  # claimed while the worker stops: do not start
            if told is None:
                try:
                    result = await self._call_handler(held, claim, job_class, reg.handler, payload)
                except Exception as exc:
                    error = exc
                self._judge_now()  # a handler that blocked, then returned at once
            with self._lock:
                stop = held.lease.stop
                if held.lease.status in OPEN:
                    held.lease.status = LeaseStatus.DONE
            end = stopped_ending(ending_for(error, claim.job.payload_json), stop)
            await self._end(
                end.kind, end.reason, end.code, stop, claim, held, job_class, result, start
            )
        finally:
            with self._lock:
                if self._held.get(item.job_id) is held:  # not a newer attempt's entry
                    del self._held[item.job_id]

    async def _end(
        self,
        kind: EndKind,
        reason: str,
        code: str,
        stop: Stop | None,
        claim: Claimed,
        held: _Held,
        jc: JobClass,
        result: Any,
        start: float,
    ) -> None:
        if kind is EndKind.RELEASE:
            released = await self._run(
                release_flow(
                    self.table,
                    queue_url=self.queue_url,
                    held=[(claim.job, claim.delivery)],
                    worker_id=self.worker_id,
                    wall_now=time.time(),
                    reason=reason,
                )
            )
            self._count("released", released)
        elif kind is EndKind.COMMIT:
            await self._commit(claim, held, result, self._clock() - start)
        elif kind is EndKind.ABANDON:
            self._count("lost")
            self.journal(
                "result_discarded" if code == "result_discarded" else "job_abandoned",
                job_id=claim.job.job_id,
                token=claim.token,
                error_code=code,
                stop=stop.value if stop is not None else None,
                duration=round(self._clock() - start, 3),
            )
        elif kind is EndKind.FAIL:
            await self._finish_fail(claim, held, reason, code)
        elif kind is EndKind.PARK:
            self._count("parked")
            fin = await self._run(
                park_flow(
                    self.table,
                    queue_url=self.queue_url,
                    job=claim.job,
                    delivery=claim.delivery,
                    worker_id=self.worker_id,
                    wall_now=time.time(),
                    reason=reason,
                )
            )
            self._lose(held, claim, fin, LossSource.PARK)
        else:
            await self._retry(claim, held, jc, reason, code)

    def _hold(self, claim: Claimed, jc: JobClass) -> _Held:
        now = self._clock()
        lease = LocalLease(
            job_id=claim.job.job_id,
            token=claim.token,
            receipt_handle=claim.delivery.receipt_handle,
            lease_seconds=jc.lease_seconds,
            heartbeat_seconds=jc.heartbeat_seconds,
            jitter_seconds=jc.jitter_seconds,
            deadline=claim.deadline,
            started_at=now,
            stage_deadline=claim.delivery.received_at + jc.stage_budget_seconds,
            progress_timeout=jc.progress_timeout_seconds,
            last_progress=now,
            next_beat=now + jc.heartbeat_seconds,
            last_confirmed=now,
            advised_at=now,
        )
        held = _Held(lease, claim.job, claim.delivery)
        ev: Emit | None = None
        earlier: _Held | None = None
        with self._lock:
            earlier = self._held.get(lease.job_id)
            if earlier is not None:
                ev = lose(
                    earlier.lease,
                    LossSource.OWN_CLAIM,
                    f"token moved to {claim.token} by this worker",
                )
            if self._stopping.is_set():
                lease.shutdown = True
            self._held[lease.job_id] = held
        if earlier is not None:
            earlier.tell_stop()
        if lease.shutdown:
            held.tell_stop()
        self._journal_event(ev)
        return held

    async def _call_handler(
        self, held: _Held, claim: Claimed, jc: JobClass, handler: Any, payload: BaseModel
    ) -> Any:
        fields: dict[str, Any] = {
            "job_id": claim.job.job_id,
            "job_class": jc,
            "payload": payload,
            "payload_hash": claim.job.payload_hash,
            "token": claim.token,
            "attempt": claim.attempt,
            "worker_id": self.worker_id,
            "lease": held.lease,
            "lock": self._lock,
            "cancelled": held.cancelled,
            "clock": self._clock,
            "journal": self.journal,
            "targets": self.app.targets,
            "stage": claim.job.stage or "main",
        }
        if claim.job.job_class in self._async_classes:
            actx: AsyncJobContext[Any] = AsyncJobContext(
                stopped=held.astopped,
                before_check=self._judge_now,
                run_effect=lambda spec: self._effect(spec, held),
                run_blocking=self._blocking,
                **fields,
            )
            return await handler(actx, payload)
        loop = asyncio.get_running_loop()

        def effect_from_thread(spec: EffectSpec) -> EffectResult:
            # The effect flow runs on the loop (aiobotocore); its blocking tool and
            # check go back to the pool, so this thread only waits for it.
            return asyncio.run_coroutine_threadsafe(self._effect(spec, held), loop).result()

        ctx: JobContext[Any] = JobContext(run_effect=effect_from_thread, **fields)
        return await self._blocking(lambda: handler(ctx, payload))

    async def _blocking(self, fn: Callable[[], T]) -> T:
        """Run blocking code in the worker's bounded thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def _effect(self, spec: EffectSpec, held: _Held) -> EffectResult:
        tool = spec.tool
        check = spec.check
        if not asyncio.iscoroutinefunction(tool):
            # A plain handler's tool blocks: it runs in the pool, never on the loop
            # (an async handler's context hands the flow an ``async def`` tool).
            spec = replace(spec, tool=lambda: self._blocking(tool))
        if check is not None:
            blocking_check = check
            # The flow awaits what an Invoke returns; a target's check is blocking code.
            spec = replace(spec, check=lambda view: self._blocking(lambda: blocking_check(view)))  # type: ignore[arg-type,return-value]
        try:
            result: EffectResult = await self._run(
                effect_flow(
                    self.intents,
                    self.table,
                    spec=spec,
                    token=held.lease.token,
                    worker_id=self.worker_id,
                    wall_clock=time.time,
                    flow_id=uuid.uuid4().hex,
                )
            )
            return result
        except LeaseLost as exc:
            # Raised while the local lease was still open, it came from the fenced
            # intent start that found the token moved: the first news of the loss.
            with self._lock:
                ev = (
                    lose(held.lease, LossSource.INTENT_START, str(exc))
                    if held.lease.status in OPEN
                    else None
                )
            if ev is not None:
                held.tell_stop()
            self._journal_event(ev)
            raise

    def _journal_event(self, ev: Emit | None) -> None:
        if ev is not None:
            self.journal.write(ev.event, ev.fields)

    def _lose(self, held: _Held | None, claim: Claimed, fin: Finish, source: LossSource) -> None:
        loss = rejected_loss(fin)
        if loss is None:
            return
        reason, cancelled = loss
        if held is None:
            self._journal_event(
                lost_event(claim.job.job_id, claim.token, LossSource.CLAIM, reason, cancelled)
            )
            return
        with self._lock:
            ev = lose(held.lease, source, reason, cancelled=cancelled)
        held.tell_stop()
        self._journal_event(ev)

    async def _commit(self, claim: Claimed, held: _Held, result: Any, duration: float) -> None:
        if isinstance(result, BaseModel):
            result = result.model_dump(mode="json")
        try:
            text = canonical_json(result)
        except (TypeError, ValueError):
            await self._finish_fail(
                claim, held, "handler returned a result that is not JSON", "bad_result"
            )
            return
        fin = await self._run(
            commit_flow(
                self.table,
                queue_url=self.queue_url,
                job=claim.job,
                delivery=claim.delivery,
                worker_id=self.worker_id,
                result_json=text,
                wall_now=time.time(),
                duration=duration,
            )
        )
        if fin.outcome == "done":
            self._count("committed")
        elif fin.outcome == "rejected":
            self._count("rejected")
        elif fin.outcome == "failed":
            self._count("failed")
        self._lose(held, claim, fin, LossSource.COMMIT)

    async def _retry(
        self, claim: Claimed, held: _Held | None, jc: JobClass, reason: str, code: str
    ) -> Finish:
        delay = backoff_delay(
            claim.attempt, jc.backoff_base_seconds, jc.backoff_max_seconds, self.rng.random()
        )
        fin: Finish = await self._run(
            retry_flow(
                self.table,
                queue_url=self.queue_url,
                job=claim.job,
                delivery=claim.delivery,
                worker_id=self.worker_id,
                wall_now=time.time(),
                reason=reason,
                error_code=code,
                delay=delay,
                max_attempts=jc.max_attempts,
            )
        )
        if fin.outcome == "done":
            if claim.attempt >= jc.max_attempts + claim.job.granted_attempts:
                self._count("failed")
            else:
                self._count("retried")
        elif fin.outcome == "failed":
            self._count("failed")
        self._lose(held, claim, fin, LossSource.RETRY)
        return fin

    async def _finish_fail(
        self, claim: Claimed, held: _Held | None, reason: str, code: str, poisoned: bool = False
    ) -> None:
        if poisoned:
            self.journal(
                "message_poisoned",
                job_id=claim.job.job_id,
                token=claim.token,
                error_code=code,
                reason=reason,
            )
        fin = await self._run(
            fail_flow(
                self.table,
                queue_url=self.queue_url,
                job=claim.job,
                delivery=claim.delivery,
                worker_id=self.worker_id,
                wall_now=time.time(),
                reason=reason,
                error_code=code,
            )
        )
        if fin.outcome == "done" and not poisoned:
            self._count("failed")
        self._lose(held, claim, fin, LossSource.FAIL)

    def _spawn_give_back(self, held: _Held, why: Drop) -> None:
        task = asyncio.create_task(self._give_back(held, why), name=f"give-back-{held.job.job_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _give_back(self, held: _Held, why: Drop) -> None:
        """The watchdog let a job go: hand it back for a counted retry; the handler's
        late result will meet a moved record and be rejected."""
        lease = held.lease
        jc = self.app.classes[held.job.job_class].job_class
        claim = Claimed(
            held.delivery, held.job, lease.token, held.job.attempt, False, None, lease.deadline
        )
        fin = await self._retry(claim, held, jc, f"watchdog: {why.value}", why.value)
        if fin.outcome in ("done", "failed"):
            with self._lock:
                gave_back(lease, f"watchdog: {why.value}")

    # ----------------------------------------------------------------- heartbeat

    async def _heartbeat_loop(self) -> None:
        while not (self._stopping.is_set() and not self._held and not self._tasks):
            try:
                if self._stopping.is_set():
                    self._request_stop()
                await self._beat_once()
            except Exception as exc:  # the heartbeat task must survive anything
                self.journal("heartbeat_error", error_code=type(exc).__name__)
            await asyncio.sleep(self.tick)

    async def _beat_once(self) -> None:
        now = self._clock()
        with self._lock:
            plan = plan_heartbeat([h.lease for h in self._held.values()], now)
            dropped = {lease.job_id: self._held[lease.job_id] for lease, _ in plan.drop}
            for lease, why in plan.drop:
                lease.drop(why)
        for lease, why in plan.drop:
            held = dropped[lease.job_id]
            held.tell_stop()
            self.journal(
                "lease_dropped",
                job_id=lease.job_id,
                token=lease.token,
                reason=why.value,
                lease_left=round(lease.deadline - now, 3),
            )
            if why is not Drop.RESERVE_SPENT:
                self._spawn_give_back(held, why)
        with self._lock:
            extend = [lease for lease in plan.extend if lease.status in OPEN]
        if not extend:
            return
        # heartbeat_flow batches (10 visibility changes, 100 ownership reads per
        # call); rounds of up to 1,000 leases run side by side so a large round is
        # not one long queue of calls.
        size = 1000
        parts = [extend[i : i + size] for i in range(0, len(extend), size)]
        gate = asyncio.Semaphore(self.beat_parallel)

        async def part(leases: list[LocalLease]) -> None:
            async with gate:
                await self._beat_part(leases, now, plan.advise)

        await asyncio.gather(*(part(p) for p in parts))

    async def _beat_part(
        self, extend: list[LocalLease], now: float, advise: frozenset[str]
    ) -> None:
        ids = {lease.job_id for lease in extend}
        report = await self._run(
            heartbeat_flow(
                self.table,
                queue_url=self.queue_url,
                leases=extend,
                worker_id=self.worker_id,
                wall_now=time.time(),
                advise=frozenset(j for j in advise if j in ids),
            )
        )
        with self._lock:
            current = [
                lease
                for lease in extend
                if (h := self._held.get(lease.job_id)) is not None and h.lease is lease
            ]
            changed = apply_beats(current, report, started=now, advised=advise)
            cancel = [self._held[lease.job_id] for lease in changed.cancel]
        for h in cancel:
            h.tell_stop()
        for ev in changed.events:
            self._journal_event(ev)

    # ----------------------------------------------------------------- stranded sweep

    async def _sweep_loop(self) -> None:
        assert self.sweep_interval is not None
        wait = self.sweep_interval * (0.5 + 0.5 * self.rng.random())
        while True:
            await asyncio.sleep(wait)
            if self._stopping.is_set():
                return
            await self.sweep_once()
            wait = self.sweep_interval

    async def sweep_once(self) -> int:
        """One bounded sweep of stranded records; returns how many were sent again."""
        try:
            report = await self._run(
                sweep_flow(
                    self.table,
                    queue_url=self.queue_url,
                    wall_now=time.time(),
                    older_than=self.sweep_grace,
                    limit=self.sweep_limit,
                    send_id_prefix=uuid.uuid4().hex,
                )
            )
        except Exception as exc:  # the sweep must never stop the worker
            self.journal(
                "stranded_sweep_failed", error_code=type(exc).__name__, reason=str(exc)[:300]
            )
            return 0
        return sum(1 for j in report.jobs if j.verdict == "resent")
