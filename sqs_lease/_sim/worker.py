"""A simulated worker process: the same sequence as ``sqs_lease._worker.Worker``.

One receive loop, one heartbeat loop, one task per received message: receive ->
parse -> claim -> hold the local lease -> run the handler while the heartbeat
extends the lease (plan_heartbeat + heartbeat_flow every H) -> commit / retry /
fail / park; graceful shutdown releases what is still held. Every decision is
made by the real core flows; this module only mirrors the worker shell (its
threads become tasks, its locks are not needed in one thread), method by method,
so a defect of that shell shows here too.

The handler is a scripted list of steps (:class:`~sqs_lease._sim.plan.JobPlan`):
work for some seconds, and side effects through the real ``effect_flow`` whose
tool and check are simulated remote calls to a fenced target.

Keep this shell in step with ``_worker.py``: a change to the real worker's
sequence (what it holds, when it marks a lease done, what it does with a
heartbeat verdict) must be made here too, or the simulation checks a worker
that no longer exists. The mirrored methods keep the real names
(``_process``, ``_hold``, ``_run_handler``, ``_commit``, ``_retry``,
``_finish_fail``, ``_beat_once``, ``_shutdown``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .._core.calls import Call, Emit, Err, ErrorKind, Flow, Invoke, Ok, Outcome, Sleep
from .._core.endings import EndKind, ending_for, stopped_ending
from .._core.flows import (
    UNKNOWN_CLASS_RECEIVES,
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
from .._core.intents import EffectResult, EffectSpec, default_key, effect_flow
from .._core.records import JobView
from .._core.timing import (
    EFFECT_MARGIN,
    OPEN,
    Drop,
    LeaseStatus,
    LocalLease,
    Stop,
    backoff_delay,
    plan_heartbeat,
)
from .._errors import (
    LeaseLost,
    PayloadError,
    PermanentError,
    ToolOutcomeUnknown,
    TransientError,
)
from .._jobs import JobClass, canonical_json, payload_hash
from .invariants import Origin
from .plan import Step
from .world import (
    DLQ,
    QUEUE,
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
_OPEN = (LeaseStatus.OK, LeaseStatus.UNKNOWN)
# The simulated receivers keep idempotency keys for good: a repeat after the check
# said "not applied" stays protected for longer than any simulated run.
_SIM_KEY_RETENTION = 30 * 86_400.0


def drive(
    world: World, actor: Actor, flow: Flow[T], origin: Origin, watch: LocalLease | None = None
) -> SimGen[T]:
    """Step a core flow: calls and remote invokes go to the world, sleeps advance the clock.

    With ``watch``, a tool call is marked on that lease while it runs, as
    ``JobContext`` marks the real one, so the watchdog sees its timeout.
    """
    instr = next(flow)
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


def _invoke_local(actor: Actor, inv: Invoke) -> Outcome:
    """As ``SyncDriver.invoke``: run caller code, its exception becomes an outcome."""
    start = actor.mono()
    try:
        value = inv.fn()
    except Exception as exc:
        return Err(
            ErrorKind.RAISED, type(exc).__name__, "", str(exc), None, (), start, actor.mono(), exc
        )
    return Ok({"value": value}, start, actor.mono())


@dataclass
class SimHeld:
    """``_worker._Held`` plus what the checker needs (the issuing task's origin)."""

    lease: LocalLease
    job: JobView
    delivery: Delivery
    origin: Origin
    cancelled: bool = False
    started: bool = False


class SimWorker(Actor):
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
        self.queue_url = QUEUE
        self.dlq_url = DLQ
        self.held: dict[str, SimHeld] = {}
        self.job_tasks: list[Task] = []
        self.stopping = False
        self.receive_task: Task | None = None
        self.heartbeat_task: Task | None = None
        self._jobs_started = 0
        self.stats: dict[str, int] = {}
        self.sweep_task: Task | None = None
        self._sweeps = 0

    # ------------------------------------------------------------------ plumbing

    def bump(self, what: str, n: int = 1) -> None:
        self.stats[what] = self.stats.get(what, 0) + n
        self.world.checker.bump(what, n)

    def journal(self, event: str, **fields: Any) -> None:
        self.world.record(self.id, event, fields)

    def drive(self, flow: Flow[T], origin: Origin, watch: LocalLease | None = None) -> SimGen[T]:
        return drive(self.world, self, flow, origin, watch)

    def start(self) -> None:
        self.receive_task = self.spawn("receive", self.receive_loop())
        self.heartbeat_task = self.spawn("heartbeat", self.heartbeat_loop())
        if self.world.plan.sweep is not None:
            self.sweep_task = self.spawn("sweep", self._sweep_loop())

    def begin_shutdown(self) -> None:
        self.stopping = True
        self._request_stop()
        self.world.interrupt(self.receive_task)

    def _request_stop(self) -> None:
        """As ``_worker.Worker._request_stop``: every attempt still held is told to stop."""
        for h in self.held.values():
            if h.lease.status in _OPEN and not h.lease.shutdown:
                h.lease.shutdown = True
                h.cancelled = True

    def _alive_jobs(self) -> int:
        return sum(1 for t in self.job_tasks if not t.done)

    # ------------------------------------------------------------------ run() / receive loop

    def receive_loop(self) -> SimGen[None]:
        origin = Origin(self.id, "receive", "receive")
        for _ in range(_LOOP_LIMIT):
            if self.stopping:
                break
            free = max(0, self.concurrency - self._alive_jobs())
            if free == 0:
                yield SleepOp(1.0, wakeable=True)  # woken when a job task ends
                continue
            batch = yield from self.drive(
                receive_flow(
                    queue_url=self.queue_url,
                    max_messages=free,
                    wait_seconds=self.receive_wait,
                    visibility=self.receive_visibility,
                ),
                origin,
            )
            for item in batch:
                self.bump("received")
                if self.stopping:
                    yield from self._release_unstarted(item)
                    continue
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

    def _release_unstarted(self, item: Delivery | Poison) -> SimGen[None]:
        if isinstance(item, Delivery):
            n = yield from self.drive(
                release_flow(
                    self.table,
                    queue_url=self.queue_url,
                    held=[(None, item)],
                    worker_id=self.id,
                    wall_now=self.wall(),
                    reason="shutdown",
                ),
                Origin(self.id, "release", "release"),
            )
            self.bump("released", n)

    def _shutdown(self) -> SimGen[None]:
        if self.stopping:
            self._request_stop()
        deadline = self.mono() + self.shutdown_grace
        for _ in range(_LOOP_LIMIT):
            if not self._alive_jobs() or self.mono() >= deadline:
                break
            yield SleepOp(max(0.01, deadline - self.mono()), wakeable=True)
        left = [h for h in self.held.values() if h.lease.status in _OPEN]
        for h in left:
            h.lease.drop(Drop.SHUTDOWN)
            h.cancelled = True
        if left:
            origin = Origin(
                self.id, "release", "release", {h.job.job_id: h.lease.token for h in left}
            )
            n = yield from self.drive(
                release_flow(
                    self.table,
                    queue_url=self.queue_url,
                    held=[(h.job, h.delivery) for h in left],
                    worker_id=self.id,
                    wall_now=self.wall(),
                    reason="shutdown: handler overran the grace period",
                ),
                origin,
            )
            self.bump("released", n)
            for h in left:
                gave_back(h.lease, "shutdown")

    # ------------------------------------------------------------------ one job (_process)

    def _process(self, item: Delivery | Poison, holder: list[Task]) -> SimGen[None]:
        task_name = holder[0].name if holder else "job"
        origin = Origin(self.id, task_name, "job")
        if isinstance(item, Delivery):
            origin.send_id = item.send_id  # the checker's I11: which send this task claims with
        if isinstance(item, Poison):
            self.bump("poisoned")
            yield from self.drive(
                poison_flow(
                    self.table,
                    queue_url=self.queue_url,
                    poison=item,
                    dlq_url=self.dlq_url,
                    body=item.body,
                ),
                origin,
            )
            return
        job_class = self.classes.get(item.job_class)
        max_receive = self.world.plan.max_receive
        claim = yield from self.drive(
            admit_flow(
                self.table,
                queue_url=self.queue_url,
                dlq_url=self.dlq_url,
                delivery=item,
                known_class=job_class is not None,
                worker_id=self.id,
                wall_now=self.wall(),
                lease_seconds=job_class.lease_seconds if job_class else self.receive_visibility,
                max_attempts=job_class.max_attempts if job_class else 1_000_000,
                unknown_class_receives=max(1, min(UNKNOWN_CLASS_RECEIVES, max_receive - 1)),
                # Drawn only when needed, so known-class schedules keep their seeds.
                rand=self.world.chaos.random() if job_class is None else 0.5,
            ),
            origin,
        )
        if not isinstance(claim, Claimed):
            if claim.outcome in ("done", "parked"):
                self.bump("already_done")
            elif claim.outcome == "stray":
                self.bump("stray")
            elif claim.outcome in (
                "missing",
                "class_mismatch",
                "unknown_class",
                "unreadable",
                "invalid",
            ):
                self.bump("poisoned")
            elif claim.outcome == "exhausted":
                self.bump("failed")
            elif claim.outcome == "deferred":
                self.bump("deferred")
            return
        self.bump("claimed")
        self.bump("reclaimed", int(claim.reclaimed))
        if job_class is None:  # pragma: no cover - admit_flow never claims it
            return
        try:
            job_class.validate_payload(claim.job.payload_json or "")
        except PayloadError as exc:
            self.bump("poisoned")
            yield from self._finish_fail(
                claim, None, str(exc), "invalid_payload", origin, poisoned=True
            )
            return
        held = self._hold(claim, job_class, origin)
        fin: Finish | None = None
        try:
            fin = yield from self._run_handler(held, claim, job_class, origin)
        finally:
            self._forget(held, item, fin)

    def _forget(self, held: SimHeld, item: Delivery, fin: Finish | None) -> None:
        """The ``finally`` of ``_worker.Worker._process``: drop our entry, not a newer one."""
        if self.held.get(item.job_id) is held:
            del self.held[item.job_id]

    def _hold(self, claim: Claimed, jc: JobClass, origin: Origin) -> SimHeld:
        now = self.mono()
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
        held = SimHeld(lease, claim.job, claim.delivery, origin)
        earlier = self.held.get(lease.job_id)
        if earlier is not None:
            # Our own new claim moved the token past the earlier attempt (a retry or a
            # duplicate delivery reached this worker): that attempt is lost.
            self.bump("own_claim_superseded")
            self._journal_event(
                lose(
                    earlier.lease,
                    LossSource.OWN_CLAIM,
                    f"token moved to {claim.token} by this worker",
                )
            )
            earlier.cancelled = True
        if self.stopping:
            lease.shutdown = True
            held.cancelled = True
        self.held[lease.job_id] = held
        self.world.interrupt(self.heartbeat_task)
        return held

    def _journal_event(self, ev: Emit | None) -> None:
        if ev is not None:
            self.world.record(self.id, ev.event, dict(ev.fields))

    def _lose(self, held: SimHeld | None, claim: Claimed, fin: Finish, source: LossSource) -> None:
        """As ``_worker.Worker._lose``: a rejected write journals the loss, once."""
        loss = rejected_loss(fin)
        if loss is None:
            return
        reason, cancelled = loss
        if held is None:
            self._journal_event(
                lost_event(claim.job.job_id, claim.token, LossSource.CLAIM, reason, cancelled)
            )
            return
        self._journal_event(lose(held.lease, source, reason, cancelled=cancelled))
        held.cancelled = True

    def _mark(self, held: SimHeld, status: LeaseStatus) -> Stop | None:
        stop = held.lease.stop
        if held.lease.status in _OPEN:
            held.lease.status = status
        return stop

    # ------------------------------------------------------------------ the handler

    def _handler(self, held: SimHeld, claim: Claimed, origin: Origin) -> SimGen[Any]:
        plan = self.world.job_plans.get(claim.job.job_id)
        if plan is None:  # pragma: no cover - every sim job has a plan
            return {"job": claim.job.job_id}
        r = self.world.chaos.random()
        for step in plan.steps:
            if step.kind == "work":
                yield SleepOp(step.seconds)
                if plan.cooperative:
                    held.lease.last_progress = self.mono()  # ctx.progress()
                    if held.cancelled:
                        held.lease.check(self.mono())  # ctx.wait(): raises once told to stop
            else:
                yield from self._effect(held, claim, step, plan.target, origin)
        if r < plan.p_unknown:
            raise ToolOutcomeUnknown("scripted: the handler's own call timed out", code="timeout")
        if r < plan.p_unknown + plan.p_permanent:
            raise PermanentError("scripted permanent failure", code="sim_permanent")
        if r < plan.p_unknown + plan.p_permanent + plan.p_transient:
            raise TransientError("scripted transient failure", code="sim_transient")
        result = {"job": claim.job.job_id, "attempt": claim.attempt, "worker": self.id}
        if plan.result_bytes:  # oversize: a result over DynamoDB's item limit
            result["blob"] = "x" * plan.result_bytes
        return result

    def _effect(
        self, held: SimHeld, claim: Claimed, step: Step, target: str, origin: Origin
    ) -> SimGen[EffectResult]:
        job_id = claim.job.job_id
        stage = claim.job.stage or "main"
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
        timeout = self.classes[claim.job.job_class].effect_timeout_seconds  # EffectCall.timeout
        spec = EffectSpec(
            key=key,
            job_id=job_id,
            stage=stage,
            action=step.action,
            target=target,
            payload_json=text,
            payload_hash=digest,
            tool=SimTool(target, key, resource, job_id, claim.token, digest, self.id, timeout),
            check=SimCheck(target, key, resource, job_id, claim.token, p.tool_http_timeout),
            lease_check=lambda: lease.check(self.mono()),
            may_record=lambda: lease.may_record(self.mono()),
            key_retention_seconds=_SIM_KEY_RETENTION,
        )
        try:
            return (
                yield from self.drive(
                    effect_flow(
                        self.intents,
                        self.table,
                        spec=spec,
                        token=claim.token,
                        worker_id=self.id,
                        wall_clock=self.wall,
                        flow_id=f"{origin.task}@{self.world.now:.6f}",
                    ),
                    origin,
                    watch=lease,
                )
            )
        except LeaseLost as exc:
            # As ``_worker.Worker._run_effect``: raised while the lease was open, it
            # came from the intent start that found the token moved.
            if lease.status in _OPEN:
                self._journal_event(lose(lease, LossSource.INTENT_START, str(exc)))
                held.cancelled = True
            raise

    def _run_handler(
        self, held: SimHeld, claim: Claimed, jc: JobClass, origin: Origin
    ) -> SimGen[Finish | None]:
        start = self.mono()
        error: Exception | None = None
        result: Any = None
        if held.lease.stop is None:  # claimed while the worker stops: do not start
            try:
                result = yield from self._handler(held, claim, origin)
            except Exception as exc:
                error = exc
        origin.handler_ended = True  # the truth the checker uses for I5 (not patched)
        stop = self._mark(held, LeaseStatus.DONE)
        origin.told_to_stop = stop is not None  # the truth the checker uses for I3
        end = stopped_ending(ending_for(error, claim.job.payload_json), stop)
        if end.kind is EndKind.RELEASE:
            n = yield from self.drive(
                release_flow(
                    self.table,
                    queue_url=self.queue_url,
                    held=[(claim.job, claim.delivery)],
                    worker_id=self.id,
                    wall_now=self.wall(),
                    reason=end.reason,
                ),
                origin,
            )
            self.bump("released", n)
            return None
        if end.kind is EndKind.COMMIT:
            return (yield from self._commit(claim, held, result, self.mono() - start, origin))
        if end.kind is EndKind.ABANDON:
            self.bump("lost")
            self.journal(
                "result_discarded" if end.code == "result_discarded" else "job_abandoned",
                job_id=claim.job.job_id,
                token=claim.token,
                error_code=end.code,
                stop=stop.value if stop is not None else None,
                duration=round(self.mono() - start, 3),
            )
            return None
        if end.kind is EndKind.FAIL:
            return (yield from self._finish_fail(claim, held, end.reason, end.code, origin))
        if end.kind is EndKind.PARK:
            self.bump("parked")
            fin = yield from self.drive(
                park_flow(
                    self.table,
                    queue_url=self.queue_url,
                    job=claim.job,
                    delivery=claim.delivery,
                    worker_id=self.id,
                    wall_now=self.wall(),
                    reason=end.reason,
                ),
                origin,
            )
            self._lose(held, claim, fin, LossSource.PARK)
            return fin
        return (yield from self._retry(claim, held, jc, end.reason, end.code, origin))

    # ------------------------------------------------------------------ ends of an attempt

    def _commit(
        self, claim: Claimed, held: SimHeld, result: Any, duration: float, origin: Origin
    ) -> SimGen[Finish]:
        text = canonical_json(result)
        if len(text) > 400 * 1024:  # oversize: the checker's I14 follows this job
            self.world.oversize_returned.add(claim.job.job_id)
        fin = yield from self.drive(
            commit_flow(
                self.table,
                queue_url=self.queue_url,
                job=claim.job,
                delivery=claim.delivery,
                worker_id=self.id,
                result_json=text,
                wall_now=self.wall(),
                duration=duration,
            ),
            origin,
        )
        if fin.outcome == "done":
            self.bump("committed")
        elif fin.outcome == "rejected":
            self.bump("rejected")
        elif fin.outcome == "failed":
            self.bump("failed")
        else:
            self.bump("commit_unknown")
        self._lose(held, claim, fin, LossSource.COMMIT)
        return fin

    def _retry(
        self,
        claim: Claimed,
        held: SimHeld | None,
        jc: JobClass,
        reason: str,
        code: str,
        origin: Origin,
    ) -> SimGen[Finish]:
        delay = backoff_delay(
            claim.attempt,
            jc.backoff_base_seconds,
            jc.backoff_max_seconds,
            self.world.chaos.random(),
        )
        fin = yield from self.drive(
            retry_flow(
                self.table,
                queue_url=self.queue_url,
                job=claim.job,
                delivery=claim.delivery,
                worker_id=self.id,
                wall_now=self.wall(),
                reason=reason,
                error_code=code,
                delay=delay,
                max_attempts=jc.max_attempts,
            ),
            origin,
        )
        if fin.outcome == "done":
            spent = claim.attempt >= jc.max_attempts + claim.job.granted_attempts
            self.bump("failed" if spent else "retried")
        elif fin.outcome == "failed":
            self.bump("failed")
        self._lose(held, claim, fin, LossSource.RETRY)
        return fin

    def _finish_fail(
        self,
        claim: Claimed,
        held: SimHeld | None,
        reason: str,
        code: str,
        origin: Origin,
        poisoned: bool = False,
    ) -> SimGen[Finish]:
        if poisoned:
            self.journal(
                "message_poisoned",
                job_id=claim.job.job_id,
                token=claim.token,
                error_code=code,
                reason=reason,
            )
        fin = yield from self.drive(
            fail_flow(
                self.table,
                queue_url=self.queue_url,
                job=claim.job,
                delivery=claim.delivery,
                worker_id=self.id,
                wall_now=self.wall(),
                reason=reason,
                error_code=code,
            ),
            origin,
        )
        if fin.outcome == "done" and not poisoned:
            self.bump("failed")
        self._lose(held, claim, fin, LossSource.FAIL)
        return fin

    # ------------------------------------------------------------------ heartbeat

    def heartbeat_loop(self) -> SimGen[None]:
        origin = Origin(self.id, "heartbeat", "heartbeat")
        for _ in range(_LOOP_LIMIT):
            if self.stopping and not self.held and not self._alive_jobs():
                return
            if self.stopping:
                self._request_stop()
            try:
                yield from self._beat_once(origin)
            except Exception as exc:  # as the real loop: the heartbeat survives anything
                self.journal("heartbeat_error", error_code=type(exc).__name__)
                self.world.checker.now = self.world.now
                self.world.checker.round_failed(self.id, exc)
            yield SleepOp(self._next_wake(), wakeable=True)

    def _next_wake(self) -> float:
        """The real loop ticks every 0.1 s; sleeping until the next due moment is the same."""
        now = self.mono()
        due = [now + 30.0]
        for h in self.held.values():
            lease = h.lease
            if lease.status not in _OPEN:
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

    def _beat_once(self, origin: Origin) -> SimGen[None]:
        now = self.mono()
        plan = plan_heartbeat([h.lease for h in self.held.values()], now)
        dropped = {lease.job_id: self.held[lease.job_id] for lease, _ in plan.drop}
        for lease, why in plan.drop:
            lease.drop(why)
            dropped[lease.job_id].cancelled = True
        for lease, why in plan.drop:
            held = dropped[lease.job_id]
            self.journal(
                "lease_dropped",
                job_id=lease.job_id,
                token=lease.token,
                reason=why.value,
                lease_left=round(lease.deadline - now, 3),
            )
            if why is not Drop.RESERVE_SPENT:
                jc = self.classes[held.job.job_class]
                claim = Claimed(
                    held.delivery,
                    held.job,
                    lease.token,
                    held.job.attempt,
                    False,
                    None,
                    lease.deadline,
                )
                watchdog = Origin(self.id, "heartbeat", "heartbeat", {lease.job_id: lease.token})
                fin = yield from self._retry(
                    claim, held, jc, f"watchdog: {why.value}", why.value, watchdog
                )
                if fin.outcome in ("done", "failed"):
                    gave_back(lease, f"watchdog: {why.value}")
        # As the real worker: the drops' writes can take long; a handler that ended
        # meanwhile must not get its visibility extended (seed 1658).
        extend = [lease for lease in plan.extend if lease.status in OPEN]
        if not extend:
            return
        by_lease = {id(h.lease): h for h in self.held.values()}
        truth: dict[str, tuple[int, str] | None] = {}
        for lease in extend:
            h = by_lease.get(id(lease))
            ended = h.origin.handler_ended if h is not None else False
            self.world.checker.now = self.world.now
            self.world.checker.beat_planned(self.id, lease.job_id, lease.token, ended)
            truth[lease.job_id] = self.world.truth(lease.job_id)
        report = yield from self.drive(
            heartbeat_flow(
                self.table,
                queue_url=self.queue_url,
                leases=extend,
                worker_id=self.id,
                wall_now=self.wall(),
                advise=plan.advise,
            ),
            origin,
        )
        # Only the leases this worker still holds (a newer own claim may have replaced
        # one while the round was in flight); the core's apply_beats moves them.
        current = []
        for lease in extend:
            h = self.held.get(lease.job_id)
            if h is not None and h.lease is lease:
                current.append(lease)
            elif h is not None:
                self.bump("verdict_for_superseded_attempt")
        changed = apply_beats(current, report, started=now, advised=plan.advise)
        for ev in changed.events:
            self._journal_event(ev)
        self.world.checker.now = self.world.now
        for lease in changed.extended:
            self.world.checker.lease_extended(
                self.id, lease.job_id, lease.token, truth[lease.job_id]
            )
        for lease in changed.cancel:
            self.held[lease.job_id].cancelled = True

    # ------------------------------------------------------------------ stranded sweep

    def _sweep_loop(self) -> SimGen[None]:
        """As ``_worker.Worker._sweep_loop``: a random first wait (spreading the sweeps
        of workers started together), then one bounded sweep every interval until the
        worker stops."""
        sweep = self.world.plan.sweep
        assert sweep is not None
        wait = sweep.interval * (0.5 + 0.5 * self.world.chaos.random())
        for _ in range(_LOOP_LIMIT):
            yield SleepOp(wait)
            if self.stopping:
                return
            yield from self.sweep_once()
            wait = sweep.interval

    def sweep_once(self) -> SimGen[int]:
        """As ``_worker.Worker.sweep_once``: never raises; a failed sweep is journaled
        and the next one tries again."""
        sweep = self.world.plan.sweep
        assert sweep is not None
        self._sweeps += 1
        try:
            report = yield from self.drive(
                sweep_flow(
                    self.table,
                    queue_url=self.queue_url,
                    wall_now=self.wall(),
                    older_than=sweep.grace,
                    limit=sweep.limit,
                    # unique per run, as the real worker's uuid4 (worker ids are)
                    send_id_prefix=f"{self.id}-sweep{self._sweeps}",
                ),
                Origin(self.id, "sweep", "sweep"),
            )
        except Exception as exc:  # the sweep must never stop the worker
            self.journal(
                "stranded_sweep_failed", error_code=type(exc).__name__, reason=str(exc)[:300]
            )
            return 0
        resent = sum(1 for j in report.jobs if j.verdict == "resent")
        self.bump("stranded_resent", resent)
        return resent
