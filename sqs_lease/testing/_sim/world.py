"""The simulated world: a discrete-event scheduler, the network, the services, the faults.

Tasks are generators that yield :class:`CallOp` (an AWS call), :class:`SleepOp`
(on the actor's own monotonic clock) or :class:`RemoteOp` (a tool call or a
reconciliation check at a simulated target). The world answers each one at a
virtual time: a call travels to its service after a seeded latency, is applied
there at that instant, and its answer travels back; a partition drops the
request or the answer, a slow call arrives after the client has given up, a
paused process sees its answers only when it resumes, a crashed one never.
"""

from __future__ import annotations

import heapq
import http.client
import json
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from pydantic import BaseModel

from ..._core import resolving as core_resolving
from ..._core import resuming as core_resuming
from ..._core.calls import Call, Err, ErrorKind, Ok, Outcome
from ..._core.cancelling import cancel_flow
from ..._core.intents import IntentState, ToolResult
from ..._core.lease import LeaseStatus
from ..._core.messages import message_body
from ..._core.resolving import Resolution
from ..._core.sending import submit_flow
from ..._errors import IntentError, LeaseLost, ToolNotApplied, ToolOutcomeUnknown
from ..._jobs import JobClass, canonical_json, payload_hash
from ..._schema import (
    GROUP_INDEX,
    UNSENT_INDEX,
    GroupIndex,
    IntentTable,
    JobTable,
    UnsentIndex,
)
from . import fifo as fifo_world
from . import plan as plans
from .chaos import Chaos
from .clocks import Clocks, Skew
from .ddb import IndexSpec, SimDynamo, TableSpec
from .invariants import E_BUDGET, E_EXC, TRANSIENT_REASONS, Checker, Origin, Violation
from .plan import FAULT_KINDS, RunPlan
from .receiver import Receivers, Reply
from .sqs import Message, SimSQS, Wait

if TYPE_CHECKING:
    from .user import UserJobs

T = TypeVar("T")

JOBS = "sim-jobs"
INTENTS = "sim-intents"
GROUPS = "sim-groups"
ATTEMPTS = "sim-attempts"
QUEUE = "https://sqs.sim.local/000000000000/sim-work"
DLQ = "https://sqs.sim.local/000000000000/sim-work-dlq"
JOB_CLASS = "sim"
JOB_CLASS_V2 = "sim-v2"  # mixed_versions: the class the old app version does not know
EPOCH_S = 1_767_225_600.0
MAX_EVENTS = 3_000_000


class SimPayload(BaseModel):
    n: int


# --------------------------------------------------------------------------- ops


# The ops are built for every instruction a task yields (tens of thousands per run):
# plain slotted classes, not frozen dataclasses, whose __init__ costs several times
# more. Nothing compares, hashes or changes them.


class CallOp:
    __slots__ = ("call", "origin")

    def __init__(self, call: Call, origin: Origin) -> None:
        self.call = call
        self.origin = origin


class SleepOp:
    __slots__ = ("seconds", "wakeable")

    def __init__(self, seconds: float, wakeable: bool = False) -> None:
        self.seconds = seconds  # on the actor's monotonic clock
        self.wakeable = wakeable


class RemoteCall(BaseException):
    """Raised by a simulated tool or check when called: the driver turns it into a
    :class:`RemoteOp`. It works whether the core invokes the object itself or a
    closure around it (``lambda: check(view)``), and no ``except Exception`` in
    between can swallow it."""

    def __init__(self, remote: SimTool | SimCheck, args: tuple[Any, ...]) -> None:
        super().__init__(remote.kind)
        self.remote = remote
        self.args_seen = args


@dataclass(eq=False)
class SimTool:
    """The tool an ``Invoke("tool", ...)`` carries: a call to a simulated target."""

    target: str
    key: str
    resource: str
    scope: str  # the fence's scope: the job id (tokens are ordered per job)
    token: int
    payload_hash: str
    worker: str
    timeout: float
    kind: str = "tool"
    stage: str = ""  # staged: the stage whose attempt sends it (the checker's I19)

    def __call__(self, *args: Any) -> Any:
        raise RemoteCall(self, args)


@dataclass(eq=False)
class SimCheck:
    """The reconciliation check (called with the intent's view); runs at the target."""

    target: str
    key: str
    resource: str
    scope: str
    token: int
    timeout: float
    kind: str = "check"

    def __call__(self, *args: Any) -> Any:
        raise RemoteCall(self, args)


Remote: TypeAlias = SimTool | SimCheck


class RemoteOp:
    __slots__ = ("remote",)

    def __init__(self, remote: Remote) -> None:
        self.remote = remote


Op: TypeAlias = CallOp | SleepOp | RemoteOp
SimGen: TypeAlias = Generator[Op, Any, T]


class Task:
    __slots__ = ("actor", "done", "gen", "name", "on_done", "sleep_gen", "sleeping")

    def __init__(self, actor: Actor, name: str, gen: SimGen[Any]) -> None:
        self.actor = actor
        self.name = name
        self.gen = gen
        self.done = False
        self.sleep_gen = 0
        self.sleeping = False
        self.on_done: Callable[[], None] | None = None


class _Pending:
    """One call in flight (all its SDK attempts)."""

    __slots__ = ("applied", "armed", "attempt", "done", "on_timeout", "sent_mono", "task")

    def __init__(self, task: Task, sent_mono: float) -> None:
        self.task = task
        self.sent_mono = sent_mono
        self.attempt = 0
        self.done = False
        self.applied = 0  # the first attempt of this call the service applied (0: none)
        self.armed = False  # the current attempt's timeout is scheduled
        self.on_timeout: Callable[[], None] | None = None


# --------------------------------------------------------------------------- actors


class Actor:
    """Something that runs tasks: a worker process, the producer, an operator."""

    def __init__(
        self,
        world: World,
        actor_id: str,
        *,
        faulty: bool = False,
        rate: float = 1.0,
        mono0: float = 0.0,
        wall_offset: float = 0.0,
    ) -> None:
        self.world = world
        self.id = actor_id
        self.faulty = faulty
        self.rate = rate
        self.mono0 = mono0
        self.wall_offset = wall_offset
        self.clock: Skew | None = None  # issue 26 (clocks): skew, drift, a step
        self.t0 = world.now
        self.alive = True
        self.paused_until = 0.0
        self.tasks: list[Task] = []
        # (start, end, mode, services): mode "both" drops requests and answers,
        # "response" lets the request apply and loses the answer.
        self.partitions: list[tuple[float, float, str, tuple[str, ...]]] = []
        self.slow: list[tuple[float, float, float]] = []  # (start, end, max extra latency)

    def mono(self, t: float | None = None) -> float:
        """This actor's monotonic clock: its own origin and rate (drift)."""
        return self.mono0 + ((self.world.now if t is None else t) - self.t0) * self.rate

    def wall(self) -> float:
        """This actor's wall clock: off by its offset (the protocol must not care)."""
        if self.clock is not None:  # issue 26 (clocks)
            skew = self.clock.at(self.world.now)
            return round(EPOCH_S + self.world.now * self.rate + self.wall_offset + skew, 3)
        return round(EPOCH_S + self.world.now * self.rate + self.wall_offset, 3)

    def cut(self, service: str, t: float, *, request: bool) -> bool:
        for start, end, mode, services in self.partitions:
            if start <= t < end and service in services and (mode == "both" or not request):
                return True
        return False

    def extra_latency(self, t: float) -> float:
        extra = 0.0
        for start, end, hi in self.slow:
            if start <= t < end:
                extra = max(extra, self.world.chaos.uniform(0.2, hi))
        return extra

    def spawn(self, name: str, gen: SimGen[Any]) -> Task:
        task = Task(self, name, gen)
        self.tasks.append(task)
        self.world.at(self.world.now, lambda: self.world.resume(task, None))
        return task

    def kill(self) -> None:
        """The process is gone: its tasks stop where they are; nothing of it runs again."""
        self.alive = False
        for task in self.tasks:
            if not task.done:
                task.done = True
                task.gen.close()


# --------------------------------------------------------------------------- the world


@dataclass
class RunResult:
    seed: int
    mutation: str | None
    violations: list[Violation]
    end_time: float
    events: int
    injected: dict[str, int]
    counts: dict[str, int]
    log: list[tuple[float, str, str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def render_log(self) -> list[str]:
        return [render_entry(e) for e in self.log]


def render_entry(entry: tuple[float, str, str, Any]) -> str:
    t, who, kind, data = entry
    text = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return f"{t:13.6f} {who:<9} {kind} {text}"


class World:
    def __init__(
        self,
        seed: int,
        *,
        workers: int | None = None,
        jobs: int | None = None,
        mutation: str | None = None,
        trace: bool = True,
        features: frozenset[str] | None = None,
        user: UserJobs | None = None,
    ) -> None:
        self.seed = seed
        # A user's app: its handlers run instead of the scripted plans (user.py).
        self.user = user
        self.mutation = mutation
        self.trace = trace
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.events = 0
        self.chaos = Chaos(seed)
        self.plan: RunPlan = plans.draw_plan(
            self.chaos, workers=workers, jobs=jobs, features=features
        )
        self.chaos.cutoff = self.plan.cutoff
        self.log: list[tuple[float, str, str, Any]] = []
        self.checker = Checker(JOBS, INTENTS)
        self.checker.known_classes = self._known_classes
        self.checker.live_owner = self._live_owner  # I24 (dup-defer)
        self.counts = self.checker.counts
        self.ddb = SimDynamo(
            [
                _jobs_table_spec(),
                TableSpec(INTENTS, "intent_key"),
                TableSpec(ATTEMPTS, "intent_key", "attempt"),
                TableSpec(GROUPS, "group_id"),
            ],
            self.chaos,
            self.plan.ddb,
            on_write=self._on_write,
        )
        self.ddb.faults.txn_transient = self.plan.wide.txn_transient
        self.ddb.item_limit = "oversize" in self.plan.wide.features
        self.sqs = SimSQS(self.chaos, self.plan.sqs)
        # the fifo world's queues are FIFO ones (their names end in .fifo)
        self.queue_url, self.dlq_url = fifo_world.queue_urls(self.plan, QUEUE, DLQ)
        self.fifo = (
            fifo_world.FifoWorld(self, self.plan.fifo) if self.plan.fifo is not None else None
        )
        self.sqs.create_queue(self.dlq_url, visibility=self.plan.lease)
        self.sqs.create_queue(
            self.queue_url,
            visibility=self.plan.lease,
            dlq_url=self.dlq_url,
            max_receive=self.plan.max_receive,
        )
        self.sqs.on_redrive = self._on_redrive
        self.receivers = Receivers(self.chaos, self.plan.targets)
        self.receivers.add("keyed", keyed=True)
        self.receivers.add("unkeyed", keyed=False)
        self.receivers.listeners.append(self._on_effect)
        self.receivers.admitted.append(self.checker.request_admitted)
        self.jobs_req = JobTable(JOBS)
        self.intents_req = IntentTable(INTENTS, ATTEMPTS)
        p = self.plan
        self.job_class = JobClass(
            name=JOB_CLASS,
            payload_model=SimPayload,
            lease_seconds=p.lease,
            heartbeat_seconds=p.heartbeat,
            jitter_seconds=p.jitter,
            missed_heartbeats=3,
            effect_timeout_seconds=p.tool_http_timeout,
            progress_timeout_seconds=p.progress_timeout,
            stage_budget_seconds=p.stage_budget,
            max_attempts=p.max_attempts,
            backoff_base_seconds=p.backoff_base,
            backoff_max_seconds=p.backoff_max,
        )
        self.job_class_v2 = JobClass(
            name=JOB_CLASS_V2,
            payload_model=SimPayload,
            lease_seconds=p.lease,
            heartbeat_seconds=p.heartbeat,
            jitter_seconds=p.jitter,
            missed_heartbeats=3,
            effect_timeout_seconds=p.tool_http_timeout,
            progress_timeout_seconds=p.progress_timeout,
            stage_budget_seconds=p.stage_budget,
            max_attempts=p.max_attempts,
            backoff_base_seconds=p.backoff_base,
            backoff_max_seconds=p.backoff_max,
        )
        self.job_plans = {jp.job_id: jp for jp in p.job_plans}
        # staged: each staged job's stages, in order (the checker's I18)
        self.checker.staged = {jp.job_id: jp.stage_names for jp in p.job_plans if jp.stages}
        self._old_left = p.wide.old_workers  # mixed_versions: first workers on the old app
        self._journal_hooks: dict[str, Callable[[str, Any], None]] = {
            "intent_confirmed": self._effect_reported,
            "intent_replayed": self._effect_reported,
            "job_abandoned": self._attempt_abandoned,
            "ownership_unknown": self._ownership_unknown,
            "tool_request_failed": self._refused,
            "intent_start_refused": self._refused,
        }
        from . import planned  # plans: the drawn app, its limits and shells (None: off)

        self.planned = planned.setup(self)
        # I20: (worker, job, token) of attempts a refusal proved superseded
        self._refused_attempts: set[tuple[str, str, Any]] = set()
        self.workers: dict[str, Any] = {}
        self._worker_seq = 0
        # The producer's calls may be slow, lose their answer and be retried by its SDK
        # (a duplicate message); it never pauses nor crashes, and resubmits on error.
        self.producer = Actor(self, "producer", faulty=True)
        self.operator = Actor(self, "operator")
        # --- issue 26 (clocks.py): clocks, backlog, dead_entries
        self.clocks = Clocks(self)
        self.clocks.attach(self.producer)
        self.clocks.attach(self.operator)
        self.receivers.retention = self.clocks.key_retention
        if self.clocks.plan.backlog:
            self.sqs.sent_before = self.clocks.sent_before
        # --- end clocks
        self.done_at: float | None = None
        self._decisions: dict[str, int] = {}  # operator_races: decisions per job
        self._edited: set[str] = set()  # unreadable_records: jobs an outside writer edited
        # oversize: job -> token of the attempt whose handler returned it
        self.oversize_returned: dict[str, int] = {}
        self.failed_tasks = 0
        self.reserved_jobs: set[str] = set()  # lambda: jobs stored under a reserved id
        self.lambda_run: Any = None  # lambda: the operator's retries (lambdas.LambdaRun)

    # ------------------------------------------------------------------ scheduling

    def at(self, t: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        now = self.now
        heapq.heappush(self._heap, (t if t > now else now, self._seq, fn))

    def record(self, who: str, kind: str, data: Any) -> None:
        self.log.append((round(self.now, 6), who, kind, data))
        hook = self._journal_hooks.get(kind)
        if hook is not None and who in self.workers:
            hook(who, data)

    def resume(self, task: Task, value: Any, sent: float | None = None) -> None:
        """Run ``task`` on with ``value``; an outcome gets the actor's monotonic stamps
        (``sent``: when the request left, where the outcome does not carry it yet)."""
        actor = task.actor
        if task.done or not actor.alive:
            return
        if actor.paused_until > self.now:
            until = actor.paused_until
            self.at(until, lambda: self.resume(task, value, sent))
            return
        if isinstance(value, (Ok, Err)):
            value = _stamped(value, value.sent_at if sent is None else sent, actor.mono())
        task.sleeping = False
        try:
            op = task.gen.send(value)
        except StopIteration:
            self._task_done(task)
            return
        except Exception as exc:  # a worker thread would die here: report it
            self._task_done(task)
            self.failed_tasks += 1
            self.checker.now = self.now
            self.checker.fail(E_EXC, f"{actor.id}/{task.name} raised {type(exc).__name__}: {exc}")
            self.record(actor.id, "task_crashed", {"task": task.name, "error": repr(exc)})
            return
        self._dispatch(task, op)

    def _task_done(self, task: Task) -> None:
        task.done = True
        if task.on_done is not None:
            task.on_done()

    def interrupt(self, task: Task | None) -> None:
        """Wake a task from a wakeable sleep (a no-op when it is doing something else)."""
        if task is None or task.done or not task.sleeping:
            return
        task.sleep_gen += 1
        task.sleeping = False
        self.at(self.now, lambda: self.resume(task, None))

    def _dispatch(self, task: Task, op: Op) -> None:
        if isinstance(op, SleepOp):
            dt = max(0.0, op.seconds) / task.actor.rate
            if op.wakeable:
                task.sleep_gen += 1
                gen = task.sleep_gen
                task.sleeping = True

                def wake() -> None:
                    if task.sleep_gen == gen and task.sleeping:
                        task.sleeping = False
                        self.resume(task, None)

                self.at(self.now + dt, wake)
            else:
                self.at(self.now + dt, lambda: self.resume(task, None))
        elif isinstance(op, CallOp):
            self._call(task, op)
        else:
            self._remote(task, op.remote)

    # ------------------------------------------------------------------ the network: AWS calls

    def latency(self, actor: Actor) -> float:
        lo, hi = self.plan.latency
        # random.Random.uniform(lo, hi) is lo + (hi - lo) * random(): the same draw
        lat = lo + (hi - lo) * self.chaos.rng.random()
        if actor.faulty:
            lat += actor.extra_latency(self.now)
            if self.chaos.roll("slow_call", self.plan.slow_call):
                lat += self.chaos.uniform(0.5, 12.0)
        return lat

    def _timeout_for(self, actor: Actor, c: Call) -> float:
        if c.op == "ReceiveMessage":
            return float(c.params.get("WaitTimeSeconds", 0)) + 5.0
        return self.plan.read_timeout if actor.faulty else 30.0

    def _call(self, task: Task, op: CallOp) -> None:
        actor = task.actor
        c = op.call
        self.checker.now = self.now
        self.checker.call_sent(c, op.origin, actor.mono())
        attempts = 1 if (c.op == "ReceiveMessage" or not actor.faulty) else self.plan.sdk_attempts
        pending = _Pending(task, actor.mono())
        self._attempt(pending, op, attempts)

    def _attempt(self, p: _Pending, op: CallOp, left: int) -> None:
        actor = p.task.actor
        c = op.call
        p.attempt += 1
        attempt = p.attempt
        t0 = self.now
        timeout = self._timeout_for(actor, c)

        def on_timeout() -> None:
            if p.done or p.attempt != attempt:
                return
            if left > 1:
                self.chaos.count("sdk_retry")
                self._attempt(p, op, left - 1)
                return
            p.done = True
            p.on_timeout = None
            err = Err(
                ErrorKind.UNREACHABLE,
                "ReadTimeoutError",
                "",
                f"{c.service} {c.op}: no answer within {timeout:g} s",
                sent_at=p.sent_mono,
            )
            # What ends the attempt now is a call with no answer (any call: seed 411093
            # gave up on a timed-out UpdateItem after an earlier transient cancel).
            op.origin.transient_cancel = False
            if self.trace:
                self.record(actor.id, "call_timeout", {"op": c.op, "key": _summary(c)})
            self.resume(p.task, err)

        # The client's timeout is armed only when it can matter: the request is lost,
        # or arrives too late, or (decided when it applies) its answer is.
        p.on_timeout = on_timeout
        if actor.faulty and actor.cut(c.service, t0, request=True):
            self.chaos.count("request_dropped")
            p.armed = True
            self.at(t0 + timeout, on_timeout)
            return
        lat = self.latency(actor)
        self.at(t0 + lat, lambda: self._apply(p, attempt, op, t0, timeout, left))
        p.armed = lat >= timeout or c.op == "ReceiveMessage"
        if p.armed:
            self.at(t0 + timeout, on_timeout)

    def _service(self, op: CallOp) -> Outcome | Wait:
        c = op.call
        if c.service == "dynamodb":
            self.checker.now = self.now
            out = self.ddb.handle(c.op, c.params, self.now, op.origin)
            if isinstance(out, Err) and out.code == "IdempotentParameterMismatchException":
                self.checker.token_mismatch(c, op.origin)
            return out
        return self.sqs.handle(c.op, c.params, self.now)

    def _apply(
        self, p: _Pending, attempt: int, op: CallOp, t0: float, timeout: float, left: int
    ) -> None:
        out = self._service(op)
        if isinstance(out, Wait):
            self._long_poll(p, attempt, op, t0, timeout, out)
            return
        if isinstance(out, Ok):
            p.applied = min(p.applied or attempt, attempt)
        self._answer(p, attempt, op, t0, timeout, left, out)

    def _long_poll(
        self, p: _Pending, attempt: int, op: CallOp, t0: float, timeout: float, first: Wait
    ) -> None:
        state = {"done": False}
        until = first.until

        def poll() -> None:
            if state["done"]:
                return
            if not p.task.actor.alive:
                state["done"] = True  # the process is gone, and its connection with it
                return
            out = self._service(op)
            if isinstance(out, Wait):
                if self.now >= until - 1e-9:
                    out = Ok({})
                else:
                    arm(out.next_visible)
                    return
            state["done"] = True
            self._answer(p, attempt, op, t0, timeout, 1, out)

        def over() -> bool:
            return state["done"] or not p.task.actor.alive

        def woken() -> bool:
            if over():
                return False  # pass the wake-up on to the next waiting poll
            self.at(self.now, poll)
            return True

        def arm(nxt: float | None) -> None:
            # (the Wait's next_visible: the queue as the poll just saw it, this instant)
            when = until if nxt is None else min(until, nxt)
            self.at(when, poll)
            self.sqs.wait(woken, over)

        arm(first.next_visible)

    def _answer(
        self,
        p: _Pending,
        attempt: int,
        op: CallOp,
        t0: float,
        timeout: float,
        left: int,
        out: Outcome,
    ) -> None:
        actor = p.task.actor
        c = op.call
        if self.trace:
            self.record("aws", c.op, {"from": actor.id, "key": _summary(c), "out": _brief(out)})
        t_back = self.now + self.latency(actor)
        lost = actor.faulty and (
            actor.cut(c.service, t_back, request=False)
            or self.chaos.roll("lost_response", self.plan.lost_response)
        )
        if lost or t_back > t0 + timeout:
            if not lost:
                self.chaos.count("late_answer")
            if p.attempt == attempt and not p.armed and p.on_timeout is not None:
                p.armed = True
                self.at(t0 + timeout, p.on_timeout)
            return  # the client's timeout decides what it sees

        def deliver() -> None:
            if p.done or p.attempt != attempt:
                return
            if c.op == "TransactWriteItems" and 0 < p.applied < attempt:
                # The SDK resent a transaction whose first try applied, and the worker
                # sees the resend's answer: success where the ClientRequestToken made it
                # idempotent (AWS), a cancellation where it did not (moto, or no token).
                kind = f"retried_applied_{_txn_kind(c)}"
                self.checker.bump(kind)
                self.record(
                    actor.id, "sim_note", {"kind": kind, "key": _summary(c), "out": _brief(out)}
                )
            if (
                isinstance(out, Err)
                and out.kind in (ErrorKind.THROTTLED, ErrorKind.SERVER)
                and left > 1
            ):
                self.chaos.count("sdk_retry")
                self._attempt(p, op, left - 1)
                return
            p.done = True
            p.on_timeout = None
            # I8 charges a give-up to the last failure before it. A later error (seed
            # 989: a throttled plain UpdateItem, which the core reads as "outcome
            # unknown" by design) replaces the cancel as the cause; a read that only
            # looks at what the cancel left (a refused start's GetItem) does not.
            if c.op == "TransactWriteItems" or isinstance(out, Err):
                op.origin.transient_cancel = c.op == "TransactWriteItems" and _transient_cancel(out)
            self.resume(p.task, out, p.sent_mono)

        self.at(t_back, deliver)

    # ------------------------------------------------------------------ the network: targets

    def _remote(self, task: Task, r: Remote) -> None:
        actor = task.actor
        p = _Pending(task, actor.mono())
        t0 = self.now
        timeout = r.timeout

        def on_timeout() -> None:
            if p.done:
                return
            late: Exception = (
                ToolOutcomeUnknown(f"{r.target}: timeout after {timeout:g} s", code="timeout")
                if r.kind == "tool"
                else TimeoutError(f"{r.target} check: timeout after {timeout:g} s")
            )
            self.chaos.count("tool_timeout" if r.kind == "tool" else "check_timeout")
            self._deliver_remote(p, r, _raised(late, p.sent_mono))

        p.on_timeout = on_timeout
        if actor.faulty and actor.cut("target", t0, request=True):
            self.chaos.count("request_dropped")
            if r.kind == "tool" and self.chaos.chance(0.5):
                # Connection refused: certainly nothing was sent.
                exc: Exception = ToolNotApplied("target: connection refused", code="refused")
                self.at(t0 + 0.001, lambda: self._deliver_remote(p, r, _raised(exc, p.sent_mono)))
                return
            p.armed = True
            self.at(t0 + timeout, on_timeout)
            return
        lat = self.latency(actor)
        if isinstance(r, SimTool):
            self.receivers.sent(r.target, r.key, r.token)
            if self.plan.wide.tool_work:
                # widened world: the target takes its time (a capture is not instant),
                # which is the window two jobs sharing a key can race in
                lat += self.chaos.wide.uniform(0.0, self.plan.wide.tool_work)
        self.at(t0 + lat, lambda: self._remote_apply(p, r, t0, timeout))
        if lat >= timeout:
            p.armed = True
            self.at(t0 + timeout, on_timeout)

    def _remote_apply(self, p: _Pending, r: Remote, t0: float, timeout: float) -> None:
        actor = p.task.actor
        out: Outcome
        self.checker.now = self.now  # the fence tells the checker what it admits (I1)
        if isinstance(r, SimTool):
            applied_before = len(self.receivers.ledger)
            reply = self.receivers.apply(
                r.target,
                key=r.key,
                resource=r.resource,
                scope=r.scope,
                token=r.token,
                payload_hash=r.payload_hash,
                worker=r.worker,
                now=self.now,
            )
            out = _tool_outcome(r, reply, p.sent_mono)
            if r.stage and len(self.receivers.ledger) > applied_before:
                # staged: an effect of a stage applied (even when answered 500 after)
                self.checker.stage_effect_applied(r.scope, r.stage, r.key, r.token, r.worker)
            if reply.status == 412:
                self.checker.now = self.now
                self.checker.owner_fenced(
                    r.target,
                    r.key,
                    r.resource,
                    r.scope,
                    r.token,
                    r.worker,
                    self.truth(r.scope),
                    reply.body.get("highest"),
                )
            elif 200 <= reply.status < 300:
                out = self._after_success(r, out, p.sent_mono)
            if self.trace:
                self.record(
                    r.target,
                    "effect",
                    {
                        "from": actor.id,
                        "key": r.key,
                        "token": r.token,
                        "status": reply.status,
                        "replayed": reply.replayed,
                    },
                )
        else:
            assert isinstance(r, SimCheck)
            answer = self.receivers.check(
                r.target, key=r.key, resource=r.resource, scope=r.scope, token=r.token
            )
            out = Ok({"value": answer}, p.sent_mono)
            if self.trace:
                self.record(
                    r.target,
                    "check",
                    {
                        "from": actor.id,
                        "key": r.key,
                        "token": r.token,
                        "verdict": answer.verdict.value,
                    },
                )
        t_back = self.now + self.latency(actor)
        lost = actor.faulty and (
            actor.cut("target", t_back, request=False)
            or self.chaos.roll("lost_response", self.plan.lost_response)
        )
        if lost or t_back > t0 + timeout:
            if not p.armed and p.on_timeout is not None:
                p.armed = True
                self.at(t0 + timeout, p.on_timeout)
            return
        self.at(t_back, lambda: self._deliver_remote(p, r, out))

    def _after_success(self, r: SimTool, out: Outcome, sent: float) -> Outcome:
        """Widened world (cut_responses): the target applied, yet the caller sees an error.

        Either the answer is cut on its way back (the HTTP client raises what
        ``urllib``/``http.client`` raise then, and ``effects.http_json`` lets through)
        or the user's code parsing the success response raises.
        """
        w = self.plan.wide
        if self.chaos.roll_wide("tool_cut_response", w.cut_response):
            exc: Exception = self.chaos.wide.choice(
                [
                    http.client.IncompleteRead(b'{"id": "', 64),
                    http.client.BadStatusLine(""),
                ]
            )
            return _raised(exc, sent)
        if self.chaos.roll_wide("tool_parse_bug", w.parse_bug):
            return _raised(KeyError("charge_id"), sent)
        return out

    def _deliver_remote(self, p: _Pending, r: Remote, out: Outcome) -> None:
        if p.done:
            return
        p.done = True
        p.on_timeout = None
        self.resume(p.task, out)

    # ------------------------------------------------------------------ hooks

    def _on_write(
        self,
        table: str,
        key: Any,
        old: Mapping[str, Any] | None,
        new: Mapping[str, Any] | None,
        origin: Any,
    ) -> None:
        if table == JOBS and self.clocks.outside(new, old):
            return  # dead_entries: an older version's record, not a job of the run
        self.checker.now = self.now
        self.checker.item_written(table, old, new, origin)
        if table == JOBS and self.fifo is not None:
            self.fifo.job_written(old, new, origin)
        if table == JOBS and new is not None:
            self.clocks.charged(old, new, origin)  # backlog: I25
        if table == JOBS and "operator_races" in self.plan.wide.features:
            self._operator_sees(old, new)
        if table == JOBS and self.lambda_run is not None:
            self.lambda_run.job_written(old, new)  # lambda: jobs retry racing the run

    def _on_effect(self, entry: Any) -> None:
        self.checker.now = self.now
        self.checker.effect_applied(entry)

    def _on_redrive(self, m: Message) -> None:
        self.record("sqs", "redrive_to_dlq", {"message": m.message_id, "body": m.body})
        if self.planned is not None:  # plans: P4, no waiter for a slot is dead-lettered
            self.planned.redriven(m)

    def _live_owner(self, worker: str, job_id: str, token: int) -> bool:
        """I24 (dup-defer): the worker runs and holds the job at the token, its lease
        open and inside its conservative deadline on its own clock; or one of its
        attempts claimed it at the token and has not held it yet (validating, taking
        its slots: soak seeds 1040258 and 1045173). (An attempt whose handler
        returned, its end write under way, is the protocol's to keep too, but not
        counted here: another worker's watch does not see it, see ``LeaseBook.owns``.)"""
        w = self.workers.get(worker)
        return (
            w is not None
            and w.alive
            and w.paused_until <= self.now
            and (
                w.book.holds_open(job_id, token, w.mono())
                or w.book.claim_pending(job_id, token, w.mono())
            )
        )

    def _known_classes(self, worker: str) -> frozenset[str] | None:
        w = self.workers.get(worker)
        return frozenset(w.classes) if w is not None else None

    def _effect_reported(self, worker: str, data: Any) -> None:
        """``intent_confirmed``/``intent_replayed``: the effect flow returns this result."""
        key = str(data.get("key", ""))
        recorded = None
        for target in self.receivers.targets.values():
            recorded = recorded or target.applied.get(key)
        self.checker.now = self.now
        self.checker.effect_reported(
            worker, str(data.get("job_id")), key, data.get("external_id"), recorded
        )

    def _refused(self, worker: str, data: Any) -> None:
        """A refusal that proves another owner: a fenced receiver's 412 (the tool's
        ``LeaseLost``) or a fenced intent start that found the token moved (I20)."""
        if data.get("error_code") == "LeaseLost" or data.get("reason") == "token_moved":
            self._refused_attempts.add((worker, str(data.get("job_id")), data.get("token")))

    def _attempt_abandoned(self, worker: str, data: Any) -> None:
        """``job_abandoned``: was the attempt given up right after a transient cancellation?
        And if a refusal proved another owner, is it told as a lease loss (I20)?"""
        w = self.workers[worker]
        job_id, token = str(data.get("job_id")), data.get("token")
        if (worker, job_id, token) in self._refused_attempts:
            self.checker.now = self.now
            self.checker.refusal_told_as(worker, job_id, token, str(data.get("error_code")))
        held = w.book.get(job_id)
        if held is None or held.lease.token != token or not held.tag.transient_cancel:
            return
        lease = held.lease
        # Past the conservative deadline giving up is the rule (DESIGN: let it go).
        running = lease.status is LeaseStatus.DONE and w.mono() < lease.conservative_deadline
        self.checker.now = self.now
        self.checker.attempt_abandoned(
            worker, job_id, token, str(data.get("error_code")), self.truth(job_id), running
        )

    def _ownership_unknown(self, worker: str, data: Any) -> None:
        """I14: a write DynamoDB refused as invalid is not a question of ownership."""
        reason = str(data.get("reason", ""))
        if "ValidationException" in reason:
            self.checker.now = self.now
            self.checker.validation_as_unknown(worker, str(data.get("job_id")), reason)

    def truth(self, job_id: str) -> tuple[int, str] | None:
        """The job's token and state as the table holds them now (no latency, no fault)."""
        item = self.ddb.get(JOBS, {"job_id": {"S": job_id}})
        if item is None:
            return None
        return int(item["token"]["N"]), str(item["state"]["S"])

    # ------------------------------------------------------------------ actors at work

    def new_worker(self) -> Any:
        from .worker import SimWorker

        self._worker_seq += 1
        wid = f"w{self._worker_seq}"
        c = self.chaos
        w = SimWorker(
            self,
            wid,
            rate=1.0 + c.uniform(-0.001, 0.001),
            mono0=round(c.uniform(1e3, 1e6), 3),
            wall_offset=round(c.uniform(-300.0, 300.0), 3),
        )
        if self.chaos.active and abs(w.wall_offset) > 1.0:
            self.chaos.count("clock_drift")
        info: dict[str, Any] = {"rate": w.rate, "wall_offset": w.wall_offset}
        if "mixed_versions" in self.plan.wide.features:
            # The first workers run the old app (no sim-v2); every later start is new.
            old = self._old_left > 0
            self._old_left -= 1
            w.classes = {JOB_CLASS: self.job_class}
            if not old:
                w.classes[JOB_CLASS_V2] = self.job_class_v2
            info["app"] = "old" if old else "new"
        if self.planned is not None:  # plans: the shell, limits, pace and lag from the app
            self.planned.worker_started(w, info)
        self.workers[wid] = w
        self.record(wid, "worker_started", info)
        self.clocks.attach(w, steps=True)  # issue 26 (clocks)
        w.start()
        return w

    def worker_exited(self, w: Any, *, restart_after: float) -> None:
        w.kill()
        self.record(w.id, "worker_exited", {})
        # lambda: a dead function environment is not restarted (the mapping starts one)
        self.at(self.now + restart_after, getattr(w, "replace_after_exit", self.new_worker))

    def _submit(self, job_id: str, tries: int = 1, producer: str = "") -> None:
        """Submit ``job_id`` as the producer would (``producer``: concurrent_submits'
        extra producers, "p1", "p2": their own send ids and tasks)."""
        text = canonical_json({"n": int(job_id.rsplit("-", 1)[1])})
        jp = self.job_plans[job_id]
        flow: Any = submit_flow(
            self.jobs_req,
            queue_url=self.queue_url,
            job_id=job_id,
            job_class=jp.job_class,
            payload_json=text,
            payload_hash=payload_hash(text),
            wall_now=self.producer.wall(),
            send_id=f"{job_id}{'.' + producer if producer else ''}.{tries}",
            resend_after=self._resend_after(),
            # staged: submitted with the app, the record and message name the first stage
            stage=jp.stages[0][0] if jp.stages else None,
            # fifo: its session, stage count, interleave_stages
            **(self.fifo.submit_args(jp) if self.fifo is not None else {}),
            tenant=self.planned.tenant(job_id) if self.planned is not None else None,  # plans
        )
        if jp.producer_dies:
            flow = self._dies_before_send(flow, job_id)
        name = f"submit-{job_id}" + (f"-{producer}" if producer else "")
        origin = Origin("producer", name, "producer")

        def again() -> None:  # a producer resubmits (submit is idempotent by job id)
            if tries < 30:
                self.at(self.now + 1.0, lambda: self._submit(job_id, tries + 1, producer))

        self.producer.spawn(name, _drive_plain(self, self.producer, flow, origin, again))

    def _resend_after(self) -> float:
        """As the real producer (``submit_flow``'s default grace) where the workers
        sweep stranded records; without a sweep, a resubmission must take the send
        over at once or a record whose first send died is never sent."""
        sweep = self.plan.sweep
        return sweep.grace if sweep is not None else 0.0

    def _dies_before_send(self, flow: Any, job_id: str) -> Any:
        """producer_death: the submission stops where the message would be sent (the
        record is written; the process that wrote it is gone, nobody resubmits)."""
        instr = next(flow)
        while True:
            if isinstance(instr, Call) and instr.op == "SendMessage":
                flow.close()
                if self.chaos.active:
                    self.chaos.count("producer_died")
                self.record("producer", "producer_died", {"job_id": job_id})
                return None
            out = yield instr
            try:
                instr = flow.send(out)
            except StopIteration as stop:
                return stop.value

    def _deploy(self) -> None:
        """mixed_versions: the rolling deploy reaches the old workers (graceful stop;
        they restart on the new version)."""
        for w in list(self.workers.values()):
            if w.alive and not w.stopping and JOB_CLASS_V2 not in w.classes:
                self.record("world", "deploy", {"worker": w.id})
                w.begin_shutdown()

    def _stray(self) -> None:
        """mixed_versions: a message names a submitted job with the other class (an old
        producer, a hand-sent message): poison, it must claim nothing."""
        if not self.chaos.active:
            return
        ids = sorted(self.job_plans)
        job_id = self.chaos.wide.choice(ids)
        record = self.ddb.get(JOBS, {"job_id": {"S": job_id}})
        if record is None:
            return
        cls = record["job_class"]["S"]
        other = JOB_CLASS if cls == JOB_CLASS_V2 else JOB_CLASS_V2
        self.chaos.count("stray_class_message")
        self.record("faults", "stray_class_message", {"job_id": job_id, "job_class": other})
        self.sqs.now = self.now
        self.sqs.send(self.sqs.queues[self.queue_url], message_body(job_id, other))

    def _cancel(self) -> None:
        job_id = self.chaos.choice(sorted(self.job_plans))
        flow = cancel_flow(
            self.jobs_req,
            job_id=job_id,
            reason="operator (simulated)",
            wall_now=self.operator.wall(),
        )
        origin = Origin("operator", f"cancel-{job_id}", "operator")
        self.operator.spawn(f"cancel-{job_id}", _drive_plain(self, self.operator, flow, origin))

    def _poison(self) -> None:
        q = self.sqs.queues[self.queue_url]
        self.sqs.now = self.now
        if self.chaos.chance(0.5):
            self.sqs.send(q, "{not json")
        else:
            self.sqs.send(q, message_body(f"ghost-{self._seq}", JOB_CLASS))

    def _fault(self) -> None:
        kinds = list(FAULT_KINDS)
        weights = [self.plan.fault_weights.get(k, 0.0) for k in kinds]
        kind = self.chaos.rng.choices(kinds, weights)[0]
        if not self.chaos.active:
            return
        live = [w for w in self.workers.values() if w.alive and not w.stopping]
        room = self.plan.cutoff - self.now
        if kind == "cancel":
            self.chaos.count(kind)
            self.record("faults", kind, {})
            self._cancel()
            return
        if kind == "poison_message":
            self.chaos.count(kind)
            self.record("faults", kind, {})
            self._poison()
            return
        if not live:
            return
        w = self.chaos.choice(live)
        L = self.plan.lease
        info: dict[str, Any] = {"worker": w.id}
        if kind == "pause":
            d = min(self.chaos.uniform(0.5, 2.5 * L), max(0.1, room))
            w.paused_until = max(w.paused_until, self.now + d)
            info["seconds"] = round(d, 3)
        elif kind == "crash":
            delay = self.chaos.uniform(1.0, 60.0)
            info["restart_after"] = round(delay, 3)
            self.worker_exited(w, restart_after=delay)
        elif kind in ("partition_both", "partition_oneway"):
            d = min(self.chaos.uniform(1.0, 2.0 * L), room)
            services = self.chaos.choice(
                [
                    ("dynamodb", "sqs", "target"),
                    ("dynamodb",),
                    ("sqs",),
                    ("target",),
                    ("dynamodb", "sqs"),
                ]
            )
            mode = "both" if kind == "partition_both" else "response"
            w.partitions.append((self.now, self.now + d, mode, services))
            info.update(seconds=round(d, 3), services=list(services))
        elif kind == "slow_window":
            d = min(self.chaos.uniform(5.0, 60.0), room)
            hi = self.chaos.uniform(1.0, 10.0)
            w.slow.append((self.now, self.now + d, hi))
            info.update(seconds=round(d, 3), max_extra=round(hi, 3))
        elif kind == "shutdown":
            w.begin_shutdown()
        self.chaos.count(kind)
        self.record("faults", kind, info)

    # ------------------------------------------------------------------ the run

    def run(self) -> RunResult:
        p = self.plan
        self.record("world", "plan", _plan_summary(p))
        self.clocks.leave_dead_entries()  # issue 26 (dead_entries)
        for jp in p.job_plans:
            self.at(jp.submit_at, lambda j=jp.job_id: self._submit(j))  # type: ignore[misc]
        for _ in range(p.workers):
            self.new_worker()
        times = sorted(self.chaos.uniform(0.0, p.cutoff) for _ in range(p.fault_events))
        for t in times:
            self.at(t, self._fault)
        self._schedule_issue14()
        if self.fifo is not None:
            self.fifo.schedule()  # the fifo world's resubmits
        from . import lambdas  # lambda: the event source mapping and the sweep function

        lambdas.start(self)
        if "mixed_versions" in p.wide.features:
            self.at(p.wide.deploy_at, self._deploy)
            for t in p.wide.stray_messages:
                self.at(t, self._stray)
        n_jobs = len(p.job_plans)
        self._last_submit = max((jp.submit_at for jp in p.job_plans), default=0.0)
        settle_end: float | None = None
        # The loop runs once per event: the names it reads every time are local.
        heap, pop, chaos, checker = self._heap, heapq.heappop, self.chaos, self.checker
        violations, final_jobs = checker.violations, checker.final_jobs
        max_time, last_submit = p.max_time, self._last_submit
        while heap:
            t, _, fn = pop(heap)
            if t > max_time:
                break
            self.now = t
            chaos.now = t
            self.events += 1
            if self.events > MAX_EVENTS:
                checker.now = t
                checker.fail(E_BUDGET, f"more than {MAX_EVENTS} events")
                break
            fn()
            if violations:
                break
            finished = self._finished() if self._edited else len(final_jobs)
            finished -= len(self.reserved_jobs)  # lambda: a reserved id's job is not a plan's
            if settle_end is None:
                if finished == n_jobs and t >= last_submit:
                    self.done_at = t
                    settle_end = t + p.settle
            elif finished < n_jobs:
                settle_end = None  # operator_races: a resumed job runs again
            elif t >= settle_end:
                break
        if not self.checker.violations:
            self.checker.now = self.now
            # unreadable_records: a job whose record an outside writer made unreadable
            # is the operator's (its message went to the DLQ as poison): not checked
            records = {
                jp.job_id: self.ddb.get(JOBS, {"job_id": {"S": jp.job_id}})
                for jp in p.job_plans
                if jp.job_id not in self._edited
            }
            stranded = self._stranded(records)
            # first: a stranded record that a half-done resolution left is named as such
            self.checker.half_resolutions(records, stranded)
            self.checker.finish(records, self._stuck_detail(records), stranded)
            self.checker.oversize_ended(records, self.oversize_returned)
            lambdas.finish(self, records)  # lambda
        for v in self.checker.violations:
            self.record("checker", "violation", {"name": v.name, "message": v.message})
        return RunResult(
            seed=self.seed,
            mutation=self.mutation,
            violations=list(self.checker.violations),
            end_time=self.now,
            events=self.events,
            injected=dict(self.chaos.injected),
            counts=dict(self.counts),
            log=self.log,
        )

    def _schedule_issue14(self) -> None:
        """Issue 14's features (docs/simulation.md, "The widened world")."""
        for when, seconds in self.plan.wide.unreadable:
            self.at(when, lambda d=seconds: self._make_unreadable(d))  # type: ignore[misc]
        for jp in self.plan.job_plans:
            for k, delay in enumerate(jp.extra_submits, 1):
                # concurrent_submits: another producer of the same job id, milliseconds
                # later: both may see the record without a sent message
                def extra(j: str = jp.job_id, who: str = f"p{k}") -> None:
                    if self.chaos.active:
                        self.chaos.count("concurrent_submit")
                    self._submit(j, producer=who)

                self.at(jp.submit_at + delay, extra)

    def _finished(self) -> int:
        """Jobs the drain waits no more for: finished ones and (unreadable_records) the
        ones an outside writer edited, which are the operator's."""
        if not self._edited:
            return len(self.checker.final_jobs)
        return len(self.checker.final_jobs | self._edited)

    def _make_unreadable(self, seconds: float) -> None:
        """unreadable_records: an outside writer (a hand edit, a newer version) gives a
        running job's record a state this version does not know, and puts it back
        ``seconds`` later. Written around the API: no worker request is involved."""
        table = self.ddb.items[JOBS]
        running = sorted(
            (str(item["job_id"]["S"]), key)
            for key, item in table.items()
            # (the workers' liveness records share the table and carry no state)
            if item.get("state", {}).get("S") == "running"
        )
        if not running:
            return
        job_id, key = self.chaos.wide14.choice(running)
        self._edited.add(job_id)
        saved = table[key]["state"]
        table[key] = {**table[key], "state": {"S": "archived"}}
        if self.chaos.active:
            self.chaos.count("record_unreadable")
        self.record("world", "record_unreadable", {"job_id": job_id, "seconds": seconds})

        def restore() -> None:
            item = table.get(key)
            if item is not None and item.get("state") == {"S": "archived"}:
                table[key] = {**item, "state": saved}
                self.record("world", "record_readable", {"job_id": job_id})

        self.at(self.now + seconds, restore)

    def _operator_sees(self, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        """operator_races: a job that parks gets an operator's decision a little later
        (at most two per job), while the workers go on with the others."""
        if new is None or new.get("state", {}).get("S") != "parked":
            return  # (a worker's liveness record carries no state)
        if old is not None and old.get("state", {}).get("S") == "parked":
            return
        job_id = str(new["job_id"]["S"])
        n = self._decisions.get(job_id, 0)
        if n >= 2:
            return
        self._decisions[job_id] = n + 1
        delay = self.chaos.wide14.uniform(0.5, 20.0)
        self.at(self.now + delay, lambda: self._operator_decides(job_id, n + 1))

    def _operator_runs(self, origin: Origin, command: Callable[[str], Any], send_id: str) -> None:
        """Run an operator's command; the process may die after any of its calls
        applied (up to 3 times per command), and the operator runs the same command
        again a little later, as the runbook says (a fresh send id each time)."""
        tries = [0]

        def run(sid: str) -> None:
            failed: list[BaseException] = []

            def dies() -> bool:
                if tries[0] >= 3 or self.chaos.operator.random() >= OPERATOR_DIES:
                    return False
                self.chaos.count("operator_died")
                return True

            def again() -> None:
                # Run it again if it died or got no answer (its message says to);
                # not when it was told there is nothing (more) to do.
                if not failed or isinstance(failed[0], IntentError) or tries[0] >= 8:
                    return
                tries[0] += 1
                delay = self.chaos.operator.uniform(2.0, 60.0)
                self.at(self.now + delay, lambda: run(f"{send_id}r{tries[0]}"))

            task = f"{origin.task}-{tries[0]}"
            flow = _mortal(command(sid), dies, failed)
            who = Origin("operator", task, "operator")
            self.operator.spawn(task, _drive_plain(self, self.operator, flow, who, again))

        run(send_id)

    def _operator_decides(self, job_id: str, n: int, waited: int = 0) -> None:
        """Resolve the job's ambiguous intent as the target's truth says (confirmed with
        its id, or retry), or resume the job when it parked for another reason."""
        record = self.ddb.get(JOBS, {"job_id": {"S": job_id}})
        if record is None or record["state"]["S"] != "parked":
            return
        ambiguous = [
            v
            for v in (self.intents_req.parse(i) for i in self.ddb.items[INTENTS].values())
            if v.job_id == job_id and v.state is IntentState.AMBIGUOUS
        ]
        send_id = f"{job_id}.op{n}"
        origin = Origin("operator", f"decide-{job_id}-{n}", "operator")
        if ambiguous:
            intent = min(ambiguous, key=lambda v: v.key)
            applied = None
            in_flight = False
            for target in self.receivers.targets.values():
                applied = applied or target.applied.get(intent.key)
                in_flight = in_flight or bool(target.pending.get(intent.key))
            if applied is None and in_flight:
                # An operator who cannot tell yet asks the provider again later.
                if waited < 20:
                    self.at(self.now + 5.0, lambda: self._operator_decides(job_id, n, waited + 1))
                return
            self.record(
                "operator",
                "operator_resolves",
                {"job_id": job_id, "key": intent.key, "applied": applied is not None},
            )
            key = intent.key
            judged = intent.attempts  # the ambiguity this decision is about
            resolution = Resolution.CONFIRMED if applied is not None else Resolution.RETRY
            external_id = applied.external_id if applied is not None else None

            def command(sid: str) -> Any:
                # Looked up at each run: a mutation patches the core's flow.
                return core_resolving.resolve_flow(
                    self.intents_req,
                    self.jobs_req,
                    queue_url=self.queue_url,
                    key=key,
                    resolution=resolution,
                    external_id=external_id,
                    who="operator (simulated)",
                    why="checked with the provider",
                    wall_now=self.operator.wall(),
                    send_id=sid,
                    # As the runbook says: a command run again names the attempt.
                    attempt=judged,
                )

        else:
            self.record("operator", "operator_resumes", {"job_id": job_id})

            def command(sid: str) -> Any:
                return core_resuming.resume_flow(
                    self.jobs_req,
                    queue_url=self.queue_url,
                    job_id=job_id,
                    wall_now=self.operator.wall(),
                    send_id=sid,
                )

        self._operator_runs(origin, command, send_id)

    def _stranded(self, records: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
        """Jobs whose record is ``queued`` and no message (queue or DLQ) names them."""
        named = {m.body for url in (self.queue_url, self.dlq_url) for m in self.sqs.live(url)}
        out = []
        for job_id, item in records.items():
            if item is None or item["state"]["S"] != "queued":
                continue
            if not any(f'"job_id":"{job_id}"' in body for body in named):
                out.append(job_id)
        return out

    def _stuck_detail(self, records: Mapping[str, Mapping[str, Any] | None]) -> dict[str, str]:
        out: dict[str, str] = {}
        for job_id in records:
            where = []
            for url, name in ((self.queue_url, "queue"), (self.dlq_url, "dlq")):
                for m in self.sqs.live(url):
                    if f'"job_id":"{job_id}"' in m.body:
                        state = "in flight" if self.sqs.in_flight(m) else "visible"
                        where.append(f"{name} {m.message_id} {state} receives={m.receive_count}")
            out[job_id] = "; messages: " + (", ".join(where) if where else "none")
        return out


def _jobs_table_spec(name: str = JOBS) -> TableSpec:
    """The jobs table with the sparse ``unsent`` index the stranded sweep queries
    (as ``_schema.UnsentIndex``: keys ``unsent``/``unsent_since``, its projection)
    and the sparse ``group`` index a group cancel queries (``_schema.GroupIndex``)."""
    projects = UnsentIndex.Meta.projection.non_key_attributes
    unsent = IndexSpec(UNSENT_INDEX, "unsent", "unsent_since", tuple(projects or ()))
    in_group = GroupIndex.Meta.projection.non_key_attributes
    group = IndexSpec(GROUP_INDEX, "group_id", "created_at", tuple(in_group or ()))
    return TableSpec(name, "job_id", indexes=(unsent, group))


def _plan_summary(p: RunPlan) -> dict[str, Any]:
    return {
        "profile": p.profile,
        "workers": p.workers,
        "jobs": p.jobs,
        "cutoff": p.cutoff,
        "lease": p.lease,
        "heartbeat": p.heartbeat,
        "jitter": p.jitter,
        "max_attempts": p.max_attempts,
        "stage_budget": p.stage_budget,
        "concurrency": p.concurrency,
        "receive_wait": p.receive_wait,
        "sdk_attempts": p.sdk_attempts,
        "sqs": {
            "stale_mode": p.sqs.stale_mode,
            "spelling": p.sqs.spelling,
            "expired_cmv": p.sqs.expired_cmv,
            "duplicate": round(p.sqs.duplicate, 4),
        },
        "max_receive": p.max_receive,
        "ddb_idempotent_tokens": p.ddb.idempotent_tokens,
        "fault_events": p.fault_events,
        **({"widened": sorted(p.wide.features)} if p.wide.features else {}),
    }


def _stamped(out: Outcome, sent: float, received: float) -> Outcome:
    """The outcome with the driver's monotonic stamps (as the sync driver sets them)."""
    if isinstance(out, Ok):
        return Ok(out.response, sent, received)
    return Err(
        out.kind,
        out.code,
        out.query_code,
        out.message,
        out.item,
        out.reasons,
        sent,
        received,
        out.exc,
    )


def _transient_cancel(out: Outcome) -> bool:
    """A transaction cancelled only for transient reasons (throttling, a conflict)."""
    if not isinstance(out, Err) or out.kind is not ErrorKind.TRANSACTION_CANCELLED:
        return False
    codes = {str(r.get("Code", "")) for r in out.reasons} - {"None"}
    return bool(codes) and codes <= TRANSIENT_REASONS


def _raised(exc: Exception, sent: float) -> Err:
    return Err(ErrorKind.RAISED, type(exc).__name__, "", str(exc), None, (), sent, sent, exc)


def _tool_outcome(r: SimTool, reply: Reply, sent: float) -> Outcome:
    """What an HTTP tool (``effects.http_json``) makes of the target's answer."""
    status = reply.status
    if 200 <= status < 300:
        return Ok({"value": ToolResult(dict(reply.body), reply.external_id)}, sent)
    exc: Exception
    if status == 412:
        exc = LeaseLost(f"{r.target}: the receiver rejected fencing token {r.token}")
    elif status == 429:
        exc = ToolNotApplied(f"{r.target}: 429 too many requests", code="http_429")
    elif status == 409 or status >= 500:
        exc = ToolOutcomeUnknown(f"{r.target}: HTTP {status}", code=f"http_{status}")
    else:
        exc = ToolNotApplied(f"{r.target}: HTTP {status}", code=f"http_{status}", retry=False)
    return _raised(exc, sent)


def _summary(c: Call) -> str:
    params = c.params
    if "Key" in params:
        return "/".join(str(next(iter(v.values()))) for v in params["Key"].values())
    if "Item" in params:
        item = params["Item"]
        for k in ("job_id", "intent_key"):
            if k in item:
                return str(item[k]["S"])
    if "RequestItems" in params:
        keys = [
            str(next(iter(v.values())))
            for spec in params["RequestItems"].values()
            for k in spec.get("Keys", [])
            for v in k.values()
        ]
        return ",".join(keys)
    if "TransactItems" in params:
        parts = []
        for entry in params["TransactItems"]:
            kind, spec = next(iter(entry.items()))
            key = spec.get("Key") or spec.get("Item") or {}
            first: Mapping[str, Any] = next(iter(key.values()), {})
            parts.append(f"{kind}:{next(iter(first.values()), '')}")
        return ",".join(parts)
    if "ReceiptHandle" in params:
        return str(params["ReceiptHandle"])
    if "Entries" in params:
        return ",".join(str(e.get("ReceiptHandle", "")) for e in params["Entries"])
    if "MessageBody" in params:
        return str(params["MessageBody"])[:80]
    return ""


def _txn_kind(c: Call) -> str:
    """Which intent transaction this is: start, confirm or attempt_failed."""
    items = list(c.params.get("TransactItems", []))
    if items and "ConditionCheck" in items[0]:
        return "intent_start"
    for entry in items:
        spec = entry.get("Update", {})
        if spec.get("TableName") == INTENTS:
            states = {v.get("S") for v in spec.get("ExpressionAttributeValues", {}).values()}
            return "intent_confirm" if "confirmed" in states else "intent_reopen"
    return "attempt_close"


def _brief(out: Outcome) -> str:
    if isinstance(out, Ok):
        r = out.response
        if "Messages" in r:
            return "ok " + ",".join(
                f"{m['MessageId']}#{m.get('Attributes', {}).get('ApproximateReceiveCount', '?')}"
                for m in r["Messages"]
            )
        if r.get("Failed"):
            return "ok failed=" + ",".join(f"{f['Id']}:{f['Code']}" for f in r["Failed"])
        if r.get("UnprocessedKeys"):
            return "ok unprocessed"
        return "ok"
    codes = ",".join(str(x.get("Code", "")) for x in out.reasons)
    return f"{out.code or out.kind.value}" + (f" [{codes}]" if codes else "")


OPERATOR_DIES = 0.2
"""operator_races: the chance that an operator's command dies right after one of its
calls applied (before it sees the answer)."""


class OperatorDied(Exception):
    """The operator's process died half way through a command (operator_races)."""


def _mortal(flow: Any, dies: Callable[[], bool], failed: list[BaseException]) -> Any:
    """Pass a flow's instructions through; after a call applied, maybe die there.
    ``failed`` gets what ended it early (its death, or the flow's own error)."""
    try:
        instr = next(flow)
        while True:
            out = yield instr
            if isinstance(instr, Call) and dies():
                flow.close()
                raise OperatorDied(f"the operator died after its {instr.op}")
            try:
                instr = flow.send(out)
            except StopIteration as stop:
                return stop.value
    except Exception as exc:
        failed.append(exc)
        raise


def _drive_plain(
    world: World,
    actor: Actor,
    flow: Any,
    origin: Origin,
    on_error: Callable[[], None] | None = None,
) -> SimGen[Any]:
    """Run a flow for a fault-free actor (producer, operator); its errors are logged."""
    from .worker import drive

    try:
        return (yield from drive(world, actor, flow, origin))
    except Exception as exc:
        world.record(actor.id, "flow_failed", {"task": origin.task, "error": repr(exc)})
        if on_error is not None:
            on_error()
        return None
