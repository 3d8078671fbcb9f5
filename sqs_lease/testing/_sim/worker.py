"""A simulated worker process: a shell of simulated tasks around the core's flows.

One receive loop, one heartbeat loop, one task per received message. The attempt
(claim, hold, handler, ending, release) is the core's ``attempt_flow``, the
heartbeat round ``heartbeat_round_flow``, a receive while stopping ``received_flow``,
the shutdown's steps ``shutdown_order``,
over the core's ``LeaseBook``: the very code the thread worker runs. This module
only schedules (tasks in simulated time instead of threads) and performs the
instructions (:func:`drive`), so a mutation of the core is caught through the
real worker's path.

The handler is a scripted list of steps (:class:`~sqs_lease.testing._sim.plan.JobPlan`):
work for some seconds, and side effects through the real ``held_effect_flow``
whose tool and check are simulated remote calls to a fenced target. The
checker watches through the flows' :class:`~sqs_lease._core.env.Observer`
hooks (this worker implements them).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from ..._core import attempt as core
from ..._core.calls import Call, Emit, Flow, Invoke, Ok, Outcome, Sleep, raised
from ..._core.claiming import UNKNOWN_CLASS_RECEIVES, Claimed
from ..._core.deletes import DeleteBatch
from ..._core.env import ActFor, AttemptEnv, HandlerRun, Now, Parallel
from ..._core.intents import EffectResult, EffectSpec, default_key
from ..._core.lease import OPEN, LocalLease, Stop
from ..._core.leasebook import Flag, Held, LeaseBook, is_open
from ..._core.limits import ITEM_LIMIT
from ..._core.messages import Delivery, Poison, receive_flow
from ..._core.receiving import ReceivePacer
from ..._core.rounds import heartbeat_tick_flow
from ..._core.shutdown import Drive, WaitAttempts, received_flow, shutdown_order
from ..._core.stages import NextStage
from ..._core.sweeps import first_sweep_wait, redrive_rules, sweep_once_flow
from ..._core.timing import EFFECT_MARGIN, Pace, pace_budget
from ..._errors import (
    LeaseLost,
    PermanentError,
    ToolNotApplied,
    ToolOutcomeUnknown,
    TransientError,
)
from ..._jobs import JobClass, canonical_json, payload_hash
from .invariants import Origin
from .plan import STAGE_NAMES, Step
from .tasks import (
    Actor,
    CallOp,
    RemoteCall,
    RemoteOp,
    SimCheck,
    SimGen,
    SimTool,
    SleepOp,
    Task,
)

if TYPE_CHECKING:
    from .world import World

T = TypeVar("T")
_LOOP_LIMIT = 1_000_000  # every loop is bounded; the world's clock and event budget end it first
# The simulated receivers keep idempotency keys for good: a repeat after the check
# said "not applied" stays protected for longer than any simulated run.
_SIM_KEY_RETENTION = 30 * 86_400.0

HandlerGen: TypeAlias = Callable[[HandlerRun], "SimGen[Any]"]


def drive(
    world: World,
    actor: Actor,
    flow: Flow[T],
    origin: Origin,
    watch: LocalLease | None = None,
    handler: HandlerGen | None = None,
) -> SimGen[T]:
    """Perform a core flow's instructions in simulated time: calls and remote invokes
    go to the world, sleeps advance the clock, events are recorded.

    With ``watch``, a tool call is marked on that lease while it runs, as
    ``JobContext`` marks the real one, so the watchdog sees its timeout. With
    ``handler``, ``Invoke("handler")`` runs that scripted handler in simulated time.
    ``Invoke("act_for")`` switches the origin the checker sees for the calls that
    follow (a watchdog's retry, the shutdown release act for their attempts' tokens).
    """
    base = origin
    try:
        try:
            instr = next(flow)
        except StopIteration as done:  # a flow with nothing to do yields nothing
            first: T = done.value
            return first
        for _ in range(_LOOP_LIMIT):
            out: Outcome | None
            if isinstance(instr, Emit):
                world.record(actor.id, instr.event, dict(instr.fields))
                out = None
            elif isinstance(instr, Call):
                out = yield CallOp(instr, origin)
            elif isinstance(instr, Sleep):
                start = actor.mono()
                yield SleepOp(instr.seconds)
                out = Ok({}, start, actor.mono())
            elif isinstance(instr, Invoke) and isinstance(instr.fn, ActFor):
                tokens = instr.fn.tokens
                kind = instr.fn.kind
                origin = base if tokens is None else Origin(actor.id, kind, kind, dict(tokens))
                out = Ok({"value": None}, actor.mono(), actor.mono())
            elif isinstance(instr, Invoke) and isinstance(instr.fn, Parallel):
                # A round's parts, one after another in simulated time (one schedule
                # of the many a concurrent shell may run).
                start = actor.mono()
                values = []
                for part in instr.fn.flows:
                    values.append((yield from drive(world, actor, part, origin, watch, handler)))
                out = Ok({"value": values}, start, actor.mono())
            elif (
                isinstance(instr, Invoke)
                and handler is not None
                and isinstance(instr.fn, HandlerRun)
            ):
                start = actor.mono()
                try:
                    value = yield from handler(instr.fn)
                except Exception as exc:
                    out = raised(exc, start, actor.mono())
                else:
                    out = Ok({"value": value}, start, actor.mono())
            elif isinstance(instr, Invoke):
                try:
                    out = _invoke_local(actor, instr)
                except RemoteCall as remote:
                    handle = None
                    if watch is not None and remote.remote.kind == "tool":
                        handle = watch.begin_call(actor.mono(), remote.remote.timeout)
                    out = yield RemoteOp(remote.remote)
                    if watch is not None and handle is not None:
                        watch.end_call(handle, actor.mono())
            else:  # pragma: no cover - the core yields nothing else
                raise TypeError(f"unknown instruction {instr!r}")
            try:
                instr = flow.send(out)
            except StopIteration as stop:
                result: T = stop.value
                return result
        raise RuntimeError("flow did not finish within the loop bound")  # pragma: no cover
    finally:
        # A killed task closes its generator: the flow's own clean-up runs now, not
        # whenever it is collected.
        flow.close()


def _invoke_local(actor: Actor, inv: Invoke) -> Outcome:
    """As ``SyncDriver.invoke``: run caller code, its exception becomes an outcome."""
    start = actor.mono()
    try:
        value = inv.fn()
    except Exception as exc:
        return raised(exc, start, actor.mono())
    return Ok({"value": value}, start, actor.mono())


class SimWorker(Actor):
    """A simulated worker process: a shell of tasks around the core's attempt flow."""

    def __init__(
        self, world: World, worker_id: str, *, rate: float, mono0: float, wall_offset: float
    ) -> None:
        super().__init__(
            world, worker_id, faulty=True, rate=rate, mono0=mono0, wall_offset=wall_offset
        )
        p = world.plan
        self.concurrency = p.concurrency
        self.receive_wait = p.receive_wait
        self.receive_visibility = world.job_class.lease_seconds
        self.shutdown_grace = 20.0
        self.tick = 0.1
        self.classes: dict[str, JobClass] = {world.job_class.name: world.job_class}
        self.table = world.jobs_req
        self.intents = world.intents_req
        self.queue_url = world.queue_url  # (FIFO ones in the fifo world)
        self.dlq_url = world.dlq_url
        self.job_tasks: list[Task] = []
        self.stopping = False
        self.receive_task: Task | None = None
        self.heartbeat_task: Task | None = None
        self._jobs_started = 0
        self.stats: dict[str, int] = {}
        self.sweep_task: Task | None = None
        self._sweeps = 0
        self._truth: dict[str, tuple[int, str] | None] = {}
        self.shell = "thread"  # plans: the shell it runs as, and an async one's loop lag
        self.loop_lag = 0.0
        most = max(c.max_attempts for c in self.classes.values())
        unknown_bound, _ = redrive_rules(p.max_receive, most, UNKNOWN_CLASS_RECEIVES)
        # A heartbeat that sleeps until the next due moment is woken by a new lease.
        self.book = LeaseBook(
            on_hold=lambda: self.world.interrupt(self.heartbeat_task),
            pace=Pace(
                pace_budget(
                    (c.lease_seconds, c.heartbeat_seconds, c.jitter_seconds)
                    for c in self.classes.values()
                )
            ),
        )
        # Ended jobs' messages, deleted 10 per call; the flusher sleeps until one is due.
        self.deletes = DeleteBatch(on_add=lambda: self.world.interrupt(self.delete_task))
        self.delete_task: Task | None = None
        self._pacer = ReceivePacer.for_queue(self.concurrency, self.queue_url)
        self._write_ids = itertools.count(1)
        self.env = AttemptEnv(
            table=self.table,
            intents=self.intents,
            queue_url=self.queue_url,
            dlq_url=self.dlq_url,
            worker_id=self.id,
            book=self.book,
            rules_of=lambda name: self.classes.get(name),  # the world may swap the app
            receive_visibility=self.receive_visibility,
            unknown_class_receives=unknown_bound,
            now=lambda: Now(self.mono(), self.wall()),
            random=lambda: self.world.chaos.random(),
            # Deterministic and apart from the chaos stream: the nonce only has to be
            # one no other writer in the world uses.
            write_id=lambda: f"{self.id}.{next(self._write_ids)}",
            tally=self.bump,
            new_signal=Flag,
            run_handler=_no_sync_handler,
            observer=self,
            run_parallel=_no_sync_parallel,  # drive() runs Invoke("parallel") itself
            deletes=self.deletes,
            stage_rules_of=self._stage_rules,
        )

    # ------------------------------------------------------------------ plumbing

    def _stage_rules(self, job_class: str, stage: str) -> JobClass | None:
        """staged: every stage of a known class runs with that class's rules."""
        if stage not in STAGE_NAMES:
            planned = self.world.planned  # plans: a planned stage has its tool's rules
            return planned.stage_rules(job_class, stage) if planned is not None else None
        base = self.classes.get(job_class)
        if base is not None and self.world.fifo is not None:
            return self.world.fifo.stage_class(base, job_class, stage)  # its own input model
        return base

    def bump(self, what: str, n: int = 1) -> None:
        self.stats[what] = self.stats.get(what, 0) + n
        self.world.checker.bump(what, n)

    def journal(self, event: str, **fields: Any) -> None:
        self.world.record(self.id, event, fields)

    def drive(self, flow: Flow[T], origin: Origin, watch: LocalLease | None = None) -> SimGen[T]:
        return drive(self.world, self, flow, origin, watch, self._handler)

    def start(self) -> None:
        self.receive_task = self.spawn("receive", self.receive_loop())
        self.heartbeat_task = self.spawn("heartbeat", self.heartbeat_loop())
        self.delete_task = self.spawn("deletes", self._delete_loop())
        if self.world.plan.sweep is not None:
            self.sweep_task = self.spawn("sweep", self._sweep_loop())

    def begin_shutdown(self) -> None:
        self.stopping = True
        self.book.request_stop()
        self.world.interrupt(self.receive_task)

    def _alive_jobs(self) -> int:
        return sum(1 for t in self.job_tasks if not t.done)

    # ------------------------------------------------------------------ the checker's view

    def handler_ended(self, held: Held, stop: Stop | None) -> None:
        origin: Origin = held.tag
        origin.handler_ended = True  # the truth the checker uses for I5 (not patched)
        origin.told_to_stop = stop is not None  # the truth the checker uses for I3

    def committing(self, claim: Claimed, result_json: str) -> None:
        if len(result_json) > ITEM_LIMIT:  # oversize: the checker's I14 follows this job
            self.world.oversize_returned[claim.job.job_id] = claim.token

    def round_planned(self, leases: list[LocalLease]) -> None:
        self._truth = {}
        for lease in leases:
            h = self.book.held_of(lease)
            ended = h.tag.handler_ended if h is not None else False
            self.world.checker.now = self.world.now
            self.world.checker.beat_planned(self.id, lease.job_id, lease.token, ended)
            self._truth[lease.job_id] = self.world.truth(lease.job_id)

    def round_failed(self, exc: Exception) -> None:
        self.world.checker.now = self.world.now
        self.world.checker.round_failed(self.id, exc)

    def round_applied(self, extended: tuple[LocalLease, ...]) -> None:
        self.world.checker.now = self.world.now
        for lease in extended:
            self.world.checker.lease_extended(
                self.id, lease.job_id, lease.token, self._truth[lease.job_id]
            )

    # ------------------------------------------------------------------ run() / receive loop

    def receive_loop(self) -> SimGen[None]:
        origin = Origin(self.id, "receive", "receive")
        for _ in range(_LOOP_LIMIT):
            if self.stopping:
                break
            slots = max(0, self.concurrency - self._alive_jobs())
            free = self.book.room(slots)
            self.world.checker.room_given(
                self.id, slots, free, sum(1 for h in self.book.entries() if is_open(h))
            )
            want = self._pacer.want(self.mono(), free)
            if want == 0:
                # Woken when a job task ends; a free slot waits at most the fill wait.
                yield SleepOp(self._pacer.pause(self.mono(), free), wakeable=True)
                continue
            batch = yield from self.drive(
                receive_flow(
                    queue_url=self.queue_url,
                    max_messages=want,
                    wait_seconds=self.receive_wait,
                    visibility=self.receive_visibility,
                ),
                origin,
            )
            self._pacer.received(self.mono(), want, len(batch))
            for item in batch:
                start = yield from self.drive(
                    received_flow(self.env, item), Origin(self.id, "release", "release")
                )
                if start:
                    self._start(item)
        yield from self._shutdown()
        delay = self.world.chaos.uniform(1.0, 30.0)
        self.world.at(self.world.now, lambda: self.world.worker_exited(self, restart_after=delay))

    def _start(self, item: Delivery | Poison) -> None:
        self._jobs_started += 1
        name = f"job{self._jobs_started}-{getattr(item, 'job_id', None)}"
        holder: list[Task] = []
        task = self.spawn(name, self._process(item, holder))
        holder.append(task)
        task.on_done = lambda: self._job_ended(task)
        self.job_tasks = [t for t in self.job_tasks if not t.done]
        self.job_tasks.append(task)

    def _job_ended(self, task: Task) -> None:
        self.world.interrupt(self.receive_task)
        self.world.interrupt(self.heartbeat_task)

    def _shutdown(self) -> SimGen[None]:
        """The core's shutdown order, each step performed in simulated time (the job
        tasks wake this one as they end)."""
        for step in shutdown_order(self.env, asked=self.stopping, grace=self.shutdown_grace):
            if isinstance(step, Drive):
                yield from self.drive(step.flow, Origin(self.id, step.kind, step.kind))
                continue
            deadline = self.mono() + step.seconds
            for _ in range(_LOOP_LIMIT):
                if isinstance(step, WaitAttempts):
                    if not self._alive_jobs() or self.mono() >= deadline:
                        break
                    yield SleepOp(max(0.01, deadline - self.mono()), wakeable=True)
                else:
                    if not step.writing() or self.mono() >= deadline:
                        break
                    # as the real shells poll it (an attempt's task ends right after)
                    yield SleepOp(min(self.tick, max(0.01, deadline - self.mono())), wakeable=True)

    def _delete_loop(self) -> SimGen[None]:
        """As the real workers' flusher: send the deletes that waited their window
        (a full batch goes at once, from the job task that filled it)."""
        origin = Origin(self.id, "deletes", "deletes")
        for _ in range(_LOOP_LIMIT):
            due = self.deletes.due()
            if due is None:
                if self.stopping and not self._alive_jobs():
                    return
                yield SleepOp(30.0, wakeable=True)  # woken when a delete is queued
                continue
            if due > self.mono():
                yield SleepOp(due - self.mono() + 1e-6, wakeable=True)
                continue
            yield from self.drive(core.flush_deletes_flow(self.env), origin)

    # ------------------------------------------------------------------ one job

    def _process(self, item: Delivery | Poison, holder: list[Task]) -> SimGen[None]:
        task_name = holder[0].name if holder else "job"
        origin = Origin(self.id, task_name, "job")
        if isinstance(item, Delivery):
            origin.send_id = item.send_id  # the checker's I11: which send this task claims with
            self.world.clocks.delivered(self, item.received_at, origin)  # I25
        flow: Flow[Any] = core.attempt_flow(self.env, item, tag=origin)
        if "staged" in self.world.plan.wide.features:
            flow = self._mortal_continuation(flow)
        yield from self.drive(flow, origin)

    def _mortal_continuation(self, flow: Flow[T]) -> Flow[T]:
        """staged: pass the attempt's instructions through; while faults are on, the
        process may die right before the next stage's message is sent (after the
        checkpoint) or right before the old message is deleted (after that send), as
        a SIGKILLed worker would. A job task's only SendMessage is a continuation;
        the delete after it may be queued in the batch: the death comes before the
        step that follows the send, whatever it is."""
        w = self.world.plan.wide
        chaos = self.world.chaos
        sent = False
        try:
            instr = next(flow)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        while True:
            dies = False
            where = "before_send"
            if isinstance(instr, Call) and instr.op == "SendMessage":
                dies = chaos.roll_wide("stage_death", w.stage_death_before_send)
            elif sent:
                where = "before_delete"
                # the next step after the send: the old message's delete (or queuing it)
                dies = chaos.roll_wide("stage_death", w.stage_death_before_delete)
                sent = False
            if dies:
                flow.close()
                self.world.record(self.id, "sim_stage_death", {"where": where})
                delay = chaos.uniform(1.0, 30.0)
                self.world.at(
                    self.world.now,
                    lambda d=delay: self.world.worker_exited(self, restart_after=d),  # type: ignore[misc]
                )
                yield Sleep(1e9)  # killed before this wakes
                raise RuntimeError("a dead worker's task ran on")  # pragma: no cover
            sent = isinstance(instr, Call) and instr.op == "SendMessage"
            out = yield instr
            try:
                instr = flow.send(out)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ the handler

    def _handler(self, run: HandlerRun) -> SimGen[Any]:
        """``Invoke("handler")``: the job's scripted plan, in simulated time."""
        if self.world.user is not None:  # a user's own handlers (testing.simulate)
            from .user import run_user_handler

            return (yield from run_user_handler(self, run, self.world.user))
        held, claim, origin = run.held, run.claim, run.held.tag
        plan = self.world.job_plans.get(claim.job.job_id)
        if plan is None:  # pragma: no cover - every sim job has a plan
            return {"job": claim.job.job_id}
        r = self.world.chaos.random()
        steps = plan.steps
        after: str | None = None  # staged: the stage that follows this one
        fifo = self.world.fifo
        stage = ""
        if plan.stages:
            names = plan.stage_names
            i = names.index(claim.job.stage or names[0])
            steps = plan.stages[i][1]
            after = names[i + 1] if i + 1 < len(names) else None
            stage = names[i]
            if fifo is not None:  # fifo: resume after the steps its own hint says are done
                steps = steps[fifo.resume_from(claim.job.job_id, stage, claim.job.progress_json) :]
        done = len(plan.stages[i][1]) - len(steps) if plan.stages else 0
        planned = self.world.planned
        # plans: the limits it holds, and its tool's callable run as this shell would
        ran = planned.start_stage(self, run, plan) if planned is not None else None
        for step in steps:
            done += 1  # (the step's own index in its stage is done - 1, hint or not)
            if step.kind == "work":
                stall = (
                    planned.stall_of(self, claim.job.job_id, claim.job.stage, done - 1)
                    if planned
                    else None
                )
                if stall is not None:  # plans: an async tool holds the event loop a while
                    yield from planned.block(self, run, stall)  # type: ignore[union-attr]
                yield SleepOp(max(0.0, step.seconds - (stall or 0.0)))
                if plan.cooperative:
                    held.lease.last_progress = self.mono()  # ctx.progress()
                    if stage and fifo is not None:  # ctx.progress({"stage", "done"})
                        held.lease.progress = fifo.hint(stage, done)
                    if held.cancelled.is_set():
                        held.lease.check(self.mono())  # ctx.wait(): raises once told to stop
            elif step.kind == "plain":
                yield from self._plain_call(claim, step)
            else:
                yield from self._effect(held, claim, step, plan.target, origin)
        if ran is not None:
            ran.end()  # plans: a plain tool awaited fails once its work is done
        if r < plan.p_unknown:
            raise ToolOutcomeUnknown("scripted: the handler's own call timed out", code="timeout")
        if r < plan.p_unknown + plan.p_permanent:
            raise PermanentError("scripted permanent failure", code="sim_permanent")
        if r < plan.p_unknown + plan.p_permanent + plan.p_transient:
            raise TransientError("scripted transient failure", code="sim_transient")
        result = {"job": claim.job.job_id, "attempt": claim.attempt, "worker": self.id}
        if after is not None:
            # staged: the checkpoint names who ended the stage; the next stage's input
            # is the job's payload again (every stage's model is SimPayload)
            given = (
                fifo.next_input(claim.job.job_id, after)
                if fifo is not None
                else {"n": int(claim.job.job_id.rsplit("-", 1)[1])}
            )
            return NextStage(after, given, result=result)
        if plan.result_bytes:  # oversize: a result over DynamoDB's item limit
            result["blob"] = "x" * plan.result_bytes
        return result

    def _plain_call(self, claim: Claimed, step: Step) -> SimGen[None]:
        """plain_calls: a fenced call the handler makes without an intent, as a user's
        own HTTP request with ``ctx.fence_headers(key)`` (the job's scope and token) to
        a keyed receiver, under a key stable across attempts. No intent, no DynamoDB:
        the receiver's fence is all that stops an older owner. Its answer, as a
        handler would read it: 2xx or a replay, done; 422 (the key was used with
        another body), done before; 412, this attempt is stale (``LeaseLost``, the
        attempt is abandoned); anything else, a transient error (the attempt is retried
        and repeats the key)."""
        job_id = claim.job.job_id
        # a staged job's calls are its stage's own (stages share the step actions)
        key = f"plain:{job_id}:{claim.job.stage + ':' if claim.job.stage else ''}{step.action}"
        body: dict[str, Any] = {"job": job_id, "action": step.action}
        if step.per_attempt:
            body["attempt"] = claim.attempt
        call = SimTool(
            "keyed",
            key,
            f"keyed:{job_id}",
            job_id,
            claim.token,
            payload_hash(canonical_json(body)),
            self.id,
            self.world.plan.tool_http_timeout,
        )
        out = yield RemoteOp(call)
        if isinstance(out, Ok):
            return
        exc = out.exc
        if isinstance(exc, LeaseLost):
            raise exc
        if isinstance(exc, ToolNotApplied) and exc.code == "http_422":
            return
        raise TransientError(f"plain call {step.action}: {out.code}", code="plain_call")

    def _effect(
        self, held: Held, claim: Claimed, step: Step, target: str, origin: Origin
    ) -> SimGen[EffectResult]:
        job_id = claim.job.job_id
        stage = claim.job.stage_name
        target = step.target or target  # widened world: a shared invoice's target
        key = step.key or default_key(job_id, stage, step.action, target, None)
        text = canonical_json(
            {"key": step.key, "amount": step.amount}
            if step.key
            else {"job": job_id, "action": step.action, "amount": len(step.action)}
        )
        digest = payload_hash(text)
        resource = step.resource or f"{target}:{job_id}"
        p = self.world.plan
        lease = held.lease
        origin.lease = lease  # the checker's I15: the lease the intent writes must find open
        timeout = self.classes[claim.job.job_class].effect_timeout_seconds  # EffectCall.timeout
        spec = EffectSpec(
            key=key,
            job_id=job_id,
            stage=stage,
            action=step.action,
            target=target,
            payload_json=text,
            payload_hash=digest,
            tool=SimTool(
                target,
                key,
                resource,
                job_id,
                claim.token,
                digest,
                self.id,
                timeout,
                stage=claim.job.stage or "",
            ),
            check=SimCheck(target, key, resource, job_id, claim.token, p.tool_http_timeout),
            lease_check=lambda: lease.check(self.mono()),
            may_record=lambda: lease.may_record(self.mono()),
            key_retention_seconds=self.world.clocks.key_retention or _SIM_KEY_RETENTION,
        )
        return (
            yield from self.drive(
                core.held_effect_flow(
                    self.env,
                    held,
                    spec,
                    wall_clock=self.wall,
                    flow_id=f"{origin.task}@{self.world.now:.6f}",
                ),
                origin,
                watch=lease,
            )
        )

    # ------------------------------------------------------------------ heartbeat

    def heartbeat_loop(self) -> SimGen[None]:
        origin = Origin(self.id, "heartbeat", "heartbeat")
        for _ in range(_LOOP_LIMIT):
            if self.stopping and not len(self.book) and not self._alive_jobs():
                return
            yield from self.drive(heartbeat_tick_flow(self.env, stopping=self.stopping), origin)
            yield SleepOp(self._next_wake(), wakeable=True)

    def _next_wake(self) -> float:
        """The real loop ticks every 0.1 s; sleeping until the next due moment is the same."""
        now = self.mono()
        due = [now + 30.0]
        for h in self.book.entries():
            lease = h.lease
            if lease.status not in OPEN:
                continue
            due += [
                lease.next_beat,
                lease.conservative_deadline,
                lease.stage_deadline - lease.lease_seconds,
            ]
            if lease.calls:
                due.append(min(lease.calls.values()) + EFFECT_MARGIN)
            if lease.progress_timeout is not None:
                due.append(lease.last_progress + lease.progress_timeout)
        return max(self.tick, min(due) - now + 1e-6)

    # ------------------------------------------------------------------ stranded sweep

    def _sweep_loop(self) -> SimGen[None]:
        """As ``_worker.Worker._sweep_loop``: a random first wait (spreading the sweeps
        of workers started together), then one bounded sweep every interval until the
        worker stops."""
        sweep = self.world.plan.sweep
        assert sweep is not None
        wait = first_sweep_wait(sweep.interval, self.world.chaos.random())
        for _ in range(_LOOP_LIMIT):
            yield SleepOp(wait)
            if self.stopping:
                return
            yield from self.sweep_once()
            wait = sweep.interval

    def sweep_once(self) -> SimGen[int]:
        """As ``_worker.Worker.sweep_once``: the core's one bounded sweep."""
        sweep = self.world.plan.sweep
        assert sweep is not None
        self._sweeps += 1
        return (
            yield from self.drive(
                sweep_once_flow(
                    self.env,
                    older_than=sweep.grace,
                    limit=sweep.limit,
                    # unique per run, as the real worker's uuid4 (worker ids are)
                    send_id_prefix=f"{self.id}-sweep{self._sweeps}",
                ),
                Origin(self.id, "sweep", "sweep"),
            )
        )


def _no_sync_handler(run: HandlerRun) -> Any:  # pragma: no cover - drive runs the script
    raise RuntimeError("the simulator runs handlers as scripted tasks (drive's handler)")


def _no_sync_parallel(flows: Any) -> Any:  # pragma: no cover - drive runs the parts
    raise RuntimeError("the simulator runs a round's parts in simulated time (drive)")
