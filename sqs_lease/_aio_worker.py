"""The async worker: an asyncio shell around the core flows (aiobotocore).

One event loop holds every job: a receive loop, one task per job driving the
core's ``attempt_flow`` (claim, hold, handler, ending), one heartbeat task
driving ``heartbeat_tick_flow`` (visibility 10 per call, ownership 100 per
call) and a sweep task (``sweep_once_flow``); the held leases live in the
core's ``LeaseBook``. ``async def`` handlers run on the loop and get an
:class:`~sqs_lease.AsyncJobContext`; plain handlers run in a bounded thread
pool and get the usual :class:`~sqs_lease.JobContext` (``Invoke("handler")``
is performed one way or the other). This module only schedules and performs
instructions; every decision is made by a flow or a pure function of
``sqs_lease._core``.

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
import threading
import time
import types
import uuid
from collections.abc import Callable, Coroutine, Generator, Sequence
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

from ._aio import AsyncDriver
from ._aws import Timeouts
from ._core.attempt import attempt_flow, flush_deletes_flow, held_effect_flow
from ._core.calls import Flow
from ._core.env import HandlerRun
from ._core.intents import EffectResult, EffectSpec
from ._core.leasebook import Held, Signal
from ._core.loopwatch import LoopStep, loop_blocked_event, watch_period
from ._core.messages import Delivery, Poison
from ._core.rounds import heartbeat_tick_flow, watchdog_drops_flow
from ._core.shutdown import Drive, WaitAttempts, received_flow, shutdown_order
from ._core.sweeps import first_sweep_wait
from ._core.timing import tolerated_loop_lag
from ._jobs import App, AsyncJobContext, JobContext, is_async_callable
from ._options import Shell, WorkerOptions
from ._shell import WorkerShell, WorkerStats

T = TypeVar("T")


class _Stop(threading.Event):
    """An attempt's stop signal (the book's ``Signal``), for both kinds of handler: a
    plain one's ``ctx.wait`` in a pool thread waits on the event, an async one's
    ``await ctx.wait`` on :attr:`aio`. Created on the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.aio = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def set(self) -> None:
        super().set()
        if threading.get_ident() == self._thread:
            self.aio.set()
        else:  # pragma: no cover - the book tells attempts on the loop
            self._loop.call_soon_threadsafe(self.aio.set)


class AsyncWorker(WorkerShell):
    """Consume one queue on one event loop: thousands of jobs per process.

    The same protocol, options, journal events, counters and stop behaviour as
    :class:`~sqs_lease.Worker`; handlers may be ``async def`` (run on the loop,
    ``ctx`` is an :class:`~sqs_lease.AsyncJobContext`) or plain functions (run in
    a pool of ``threads`` threads, ``ctx`` is a :class:`~sqs_lease.JobContext`).
    ``concurrency`` bounds the jobs held at once (1..100,000; default 1000).

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

    shell: ClassVar[Shell] = "async"

    def _own_options(self, app: App, options: WorkerOptions) -> None:
        self.max_loop_lag = tolerated_loop_lag(
            options.max_loop_lag,
            [
                (n, c.lease_seconds, c.heartbeat_seconds, c.jitter_seconds)
                for n, c in app.lease_rules()
            ],
        )
        self.threads = options.threads

    def _new_signal(self) -> Signal:
        return _Stop()

    def _built(self) -> None:
        super()._built()
        self._tasks: set[asyncio.Task[None]] = set()
        self._jobs = 0  # attempt tasks started and not yet through their attempt
        self._slot_freed: asyncio.Event | None = None  # made on the loop, by serve()
        self._step: LoopStep | None = None  # the job step running on the loop now
        self._step_lock = threading.Lock()  # the step is shared with the watch thread
        self._watch_stop = threading.Event()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._driver: AsyncDriver | None = None
        # Called with each driver serve() builds, before it runs (the testing kit's
        # Faults wrap their calls here: the drivers exist only while serving).
        self._driver_hooks: list[Callable[[AsyncDriver], None]] = []
        self.calls = 0  # AWS calls made by the last run (both drivers)
        self.env.run_parallel = self._run_parallel

    # ----------------------------------------------------------------- running

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
            observers=self.receive_observers,
        )
        for hook in self._driver_hooks:
            hook(driver)
            hook(poll)
        async with driver, poll:
            self._driver = driver
            beat = asyncio.create_task(self._heartbeat_loop(), name="heartbeat")
            sweep = (
                asyncio.create_task(self._sweep_loop(), name="sweep")
                if self.sweep_interval is not None
                else None
            )
            deletes_done = asyncio.Event()
            deleter = asyncio.create_task(self._delete_loop(deletes_done), name="deletes")
            watch.start()
            try:
                await self._receive_loop(poll, max_messages, idle_exit)
            finally:
                await self._shutdown()
                self._stopping.set()
                # Not cancelled: a flush in flight has taken its batch from the book,
                # and cancelling it would leave those messages undeleted at the stop.
                deletes_done.set()
                await asyncio.gather(deleter, return_exceptions=True)
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(beat, 5.0)
                if sweep is not None:
                    sweep.cancel()
                    await asyncio.gather(sweep, return_exceptions=True)
                self._watch_stop.set()
                self._restore_signal_handlers()
                self._pool.shutdown(wait=False, cancel_futures=True)
                self.calls = driver.calls + poll.calls
        self.journal("worker_stopped", **self.stats.__dict__)
        return self.stats

    async def _receive_loop(
        self, poll: AsyncDriver, max_messages: int | None, idle_exit: float | None
    ) -> None:
        self._idle_since = self._clock()
        freed = self._slot_freed = asyncio.Event()
        while True:
            freed.clear()
            want = self._receive_more(self._free_slots(), max_messages)
            if want is None:
                break
            if want == 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(freed.wait(), self.tick)
                continue
            batch = await poll.run(self._receive_call(want))
            self._received(want, len(batch))
            if self._idle_over(bool(batch or len(self.book) or self._tasks), idle_exit):
                break
            for item in batch:
                if not await self._run(received_flow(self.env, item)):
                    continue
                self._jobs += 1
                self._spawn(self._observed(getattr(item, "job_id", None), self._attempt(item)))

    def _free_slots(self) -> int:
        return self.concurrency - self._jobs

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_parallel(self, flows: Sequence[Flow[Any]]) -> list[Any]:
        """``Invoke("parallel")``: a round's parts at once (the driver awaits this)."""
        return list(await asyncio.gather(*(self._run(f) for f in flows)))

    async def _run(self, flow: Flow[T]) -> T:
        assert self._driver is not None
        return await self._driver.run(flow)

    async def _shutdown(self) -> None:
        """The core's shutdown order (``shutdown_order``), each step awaited here; then
        the tasks of handlers that overran the grace (their leases were let go) are
        cancelled. Every finished job's message is deleted before serve() returns."""
        steps = shutdown_order(self.env, asked=self._stopping.is_set(), grace=self.shutdown_grace)
        for step in steps:
            if isinstance(step, Drive):
                await self._run(step.flow)
                continue
            if isinstance(step, WaitAttempts):
                if self._tasks:
                    await asyncio.wait(set(self._tasks), timeout=step.seconds)
                continue
            deadline = self._clock() + step.seconds
            while step.writing() and self._clock() < deadline:
                await asyncio.sleep(self.tick / 4)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5.0)

    # ----------------------------------------------------------------- one job

    async def _attempt(self, item: Delivery | Poison) -> None:
        try:
            await self._run(attempt_flow(self.env, item))
        finally:
            self._jobs -= 1
            if self._slot_freed is not None:
                self._slot_freed.set()

    async def _delete_loop(self, done: asyncio.Event) -> None:
        """Send the deletes that waited their window (full batches go at once, from
        the attempt that filled them), until ``done``; a flush under way ends first."""
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), self.deletes.window / 2)
            if done.is_set():
                return
            try:
                await self._run(flush_deletes_flow(self.env))
            except Exception as exc:  # the driver's own failure: the task survives it
                self.journal("message_delete_failed", error_code=type(exc).__name__)

    def _run_handler(self, run: HandlerRun) -> Coroutine[Any, Any, Any]:
        """``Invoke("handler")``: the driver awaits what this returns."""
        return self._handler(run)

    async def _handler(self, run: HandlerRun) -> Any:
        reg = self.app.get(run.claim.job.job_class, run.claim.job.stage)
        assert reg is not None  # attempt_flow runs a handler only for a known class
        held = run.held
        stop = held.cancelled
        assert isinstance(stop, _Stop)
        fields = self._context_fields(run)
        try:
            if reg.is_async:  # this stage's or tool's own callable, not its class's
                actx: AsyncJobContext[Any] = AsyncJobContext(
                    stopped=stop.aio,
                    before_check=self._judge_now,
                    run_effect=lambda spec: self._effect(spec, held),
                    run_blocking=self._blocking,
                    **fields,
                )
                result = await reg.handler(actx, run.payload)
            else:
                loop = asyncio.get_running_loop()

                def effect_from_thread(spec: EffectSpec) -> EffectResult:
                    # The effect flow runs on the loop (aiobotocore); its blocking
                    # tool and check go back to the pool: this thread only waits.
                    return asyncio.run_coroutine_threadsafe(self._effect(spec, held), loop).result()

                ctx: JobContext[Any] = JobContext(run_effect=effect_from_thread, **fields)
                result = await self._blocking(lambda: reg.handler(ctx, run.payload))
        finally:
            self._judge_now()  # a handler that blocked the loop, then ended at once
        return result  # a model becomes data in the core (stages.plain_data)

    async def _blocking(self, fn: Callable[[], T]) -> T:
        """Run blocking code in the worker's bounded thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def _effect(self, spec: EffectSpec, held: Held) -> EffectResult:
        tool = spec.tool
        if not is_async_callable(tool):
            # A plain handler's tool blocks: it runs in the pool, never on the loop
            # (an async handler's context hands the flow an ``async def`` tool).
            spec = replace(spec, tool=lambda: self._blocking(tool))
        check = spec.check
        if check is not None:
            # The flow awaits what an Invoke returns; a target's check is blocking code.
            spec = replace(spec, check=lambda view: self._blocking(lambda: check(view)))  # type: ignore[arg-type,return-value]
        return await self._run(
            held_effect_flow(self.env, held, spec, wall_clock=time.time, flow_id=uuid.uuid4().hex)
        )

    # ----------------------------------------------------------------- a blocked loop

    def _observed(
        self, job_id: str | None, coro: Coroutine[Any, Any, None]
    ) -> Coroutine[Any, Any, None]:
        """Run a job's task timing each of its steps on the loop (see :meth:`_stalled`)."""

        @types.coroutine
        def steps() -> Generator[Any, Any, None]:
            value: Any = None
            error: BaseException | None = None
            while True:
                step = LoopStep(job_id, self._clock(), self.max_loop_lag)
                self._step = step
                try:
                    yielded = coro.throw(error) if error is not None else coro.send(value)
                except StopIteration:
                    return
                finally:
                    self._step = None
                    ended = self._clock()
                    if step.overran(ended):
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
        lag: a handler that blocked and then checks, or ends, within the same step
        must meet the verdict (its lease check, its ending), not slip past it."""
        step = self._step
        if step is not None:
            now = self._clock()
            if step.overran(now):
                self._stalled(step, now)

    def _stalled(self, step: LoopStep, ended: float) -> None:
        """A job's step held the loop past the tolerated lag: the book applies the
        core's verdict, the events are the core's (``LoopStep.unblocked``); the
        blocker's job goes back like any watchdog drop."""
        stall, dropped = self.book.loop_stalled(
            step.job_id, began=step.began, ended=ended, tolerated=self.max_loop_lag
        )
        with self._step_lock:
            told = step.unblocked(stall, len(self.book))
        for ev in told:
            self.journal.write(ev.event, ev.fields)
        if dropped:
            self._spawn(self._run(watchdog_drops_flow(self.env, dropped, ended)))

    def _watch_loop(self) -> None:
        """Journal a stall while the loop is still held (the loop cannot say it)."""
        period = watch_period(self.max_loop_lag)
        while not self._watch_stop.wait(period):
            step = self._step
            if step is None:
                continue
            now = self._clock()
            with self._step_lock:
                held_for = step.watched(now)
            if held_for is None:
                continue
            h = self.book.get(step.job_id) if step.job_id is not None else None
            ev = loop_blocked_event(
                step.job_id,
                h.lease.token if h is not None else None,
                held_for,
                self.max_loop_lag,
                len(self.book),
            )
            self.journal.write(ev.event, ev.fields)

    # ----------------------------------------------------------------- heartbeat

    async def _heartbeat_loop(self) -> None:
        while not (self._stopping.is_set() and not len(self.book) and not self._tasks):
            try:
                await self._beat_once()
            except Exception as exc:  # the driver's own failure: the task survives it too
                self.journal("heartbeat_error", error_code=type(exc).__name__)
            await asyncio.sleep(self.tick)

    async def _beat_once(self) -> None:
        await self._run(heartbeat_tick_flow(self.env, stopping=self._stopping.is_set()))

    # ----------------------------------------------------------------- stranded sweep

    async def _sweep_loop(self) -> None:
        assert self.sweep_interval is not None
        wait = first_sweep_wait(self.sweep_interval, self.rng.random())
        while True:
            await asyncio.sleep(wait)
            if self._stopping.is_set():
                return
            await self.sweep_once()
            wait = self.sweep_interval

    async def sweep_once(self) -> int:
        """One bounded sweep of stranded records; returns how many were sent again."""
        return await self._run(self._sweep_once_flow())
