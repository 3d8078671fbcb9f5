"""The ``lambda`` world: Lambda consumers on the queue, alone or beside thread workers.

What a seed draws (its own stream, ``lambda-SEED``, so a seed without the feature runs
as it always did): whether functions serve the queue alone or beside the thread
workers; the event source mapping's batch size (1-10) and concurrency (1-3
pollers, each with its execution environment); the function timeout, and the job
class's stage budget fitted under it; sometimes a first deployment whose timeout
the class's budget can never fit (the consumer must refuse it: its invocations
fail until the operator fixes the function, never a record looped to the DLQ);
the scheduled sweep function's period; and, sometimes, a producer that submits a
job under a worker's reserved id (``worker#<id>``, issue 26 defect 12).

The mapping (:class:`Mapping`, AWS's, never faulty) long-polls the queue for a
batch (on the fifo world's FIFO queue, each group's messages in order behind its
head, several groups a batch, the records naming their group, as AWS hands them
over), invokes an idle environment with it and a deadline (the function timeout),
deletes the records the invocation reported done and leaves the others to their
visibility. An invocation that outlives its timeout is killed with its environment
(its records come back when their visibility lapses); the faults of the world
pause, partition and crash environments as they do workers.

The function (:class:`SimLambda`) is the simulated worker's shell (its handler,
effects, lease book) driving what the adapter ``sqs_lease.aws_lambda`` drives:
``_core.invocation.unfit_problem`` at each invocation, then
``_core.invocation.record_flow`` for each record in order (the budget rule, FIFO
group stop, ``take_record_flow``, the attempt and its ``AttemptEnd``) under a heartbeat
that runs while the invocation does, and ``release_unstarted_records_flow``. The
sweep function runs ``sweep_pages_flow`` as ``sweeper(app)`` does.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from collections.abc import Mapping as MappingT
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from ..._core import invocation
from ..._core.calls import Call, Flow, Ok, Outcome, call
from ..._core.env import AttemptEnv, Now
from ..._core.eventsource import END_MARGIN_SECONDS, FIFO_BATCH_SIZE, parse_event_record
from ..._core.invocation import RecordEnd
from ..._core.messages import Delivery
from ..._core.records import CANCELLED_CODE
from ..._core.rounds import heartbeat_tick_flow
from ..._core.sweeps import SCHEDULED_DLQ_RECEIVES, SCHEDULED_SWEEP_PAGE, sweep_pages_flow
from ..._core.timing import EFFECT_MARGIN
from . import producers
from .invariants import Origin
from .plan import SweepPlan, serial_bound
from .resources import JOB_CLASS, JOB_CLASS_V2, QUEUE
from .tasks import Actor, SimGen, SleepOp, Task

if TYPE_CHECKING:
    from .chaos import Chaos
    from .plan import RunPlan
    from .world import World

T = TypeVar("T")
FEATURE = "lambda"
REFUSED = "refused"  # an invocation's answer when the consumer refused the app
FUNCTION_TIMEOUTS = (30, 60, 120, 300, 900)
_LOOP_LIMIT = 1_000_000
QUEUE_ARN = "arn:aws:sqs:us-east-1:000000000000:sim-work"


@dataclass(frozen=True)
class LambdaPlan:
    """The Lambda deployment of one run."""

    mode: str  # "lambda": functions only; "both": functions beside the thread workers
    pollers: int  # the mapping's concurrency: pollers, each with one environment
    batch_size: int  # records per invocation, at most
    timeout: int  # the function timeout first deployed
    fitted_timeout: int  # the timeout once the operator fixed a refused deployment
    fix_after: float  # the operator fixes a refused deployment this long after its error
    sweep_every: float  # the scheduled sweep function's period
    cold_start: float  # an environment's init, before its first invocation
    reserved_id: str = ""  # a job submitted under a worker's reserved id ("": none)
    reserved_at: float = 0.0
    retries: bool = False  # an operator runs ``jobs retry`` on jobs that fail, racing the run
    # per intent start an environment sends: the chance it is starved of CPU (a
    # function's CPU share scales with its memory) for 1-2.5 leases while the write
    # is in flight: its call goes out after its lease lapsed, its heartbeat not told
    starved: float = 0.0


def takes(plan: RunPlan, allowed: frozenset[str]) -> bool:
    """Whether this world's stream turns it on for the run (:func:`draw`'s first
    draw and its rules, before the ``plans`` world's draw)."""
    on = random.Random(f"lambda-{plan.seed}").random() < 0.3
    return on and FEATURE in allowed and plan.profile != "long"


def draw(c: Chaos, plan: RunPlan, allowed: frozenset[str]) -> None:
    """Draw the Lambda deployment from its own stream; everything is drawn whatever
    is allowed, so no other feature's draws move."""
    r = random.Random(f"lambda-{plan.seed}")
    r.random()  # (takes' draw: whether the world is on)
    mode = r.choice(["lambda", "lambda", "both"])
    pollers = r.randint(1, 3)
    batch_size = r.choice([1, 2, 5, 10, 10])
    pick = r.random()
    slack = r.uniform(0.0, 0.5)
    unfit = r.random() < 0.25
    too_short = r.uniform(0.2, 0.9)
    fix_after = r.uniform(20.0, 120.0)
    sweep_every = r.choice([60.0, 120.0, 300.0])
    cold_start = r.uniform(0.1, 2.0)
    reserved = r.random() < 0.3
    reserved_at = r.uniform(0.0, 0.6)
    retries = r.random() < 0.6
    starved = r.uniform(0.02, 0.2) if r.random() < 0.4 else 0.0
    if not takes(plan, allowed):
        return
    if plan.plans is not None:
        # Not drawn with planned jobs yet: their shells (thread, async, loop stalls) are
        # the workers'; a function's would need its own.
        return
    if "mixed_versions" in plan.wide.features:
        mode = "both"  # its old and new workers stay (the functions run the new app)
    # The class's stage budget fits the function (the margin and some slack under it);
    # a "budget" run keeps its tighter budget.
    # A stage gets at least one lease and one effect call with the watchdog's margin
    # (the job class's own timing rules); the timeouts that leave room for twice that.
    floor = max(plan.lease, plan.tool_http_timeout + EFFECT_MARGIN)
    fits = [t for t in FUNCTION_TIMEOUTS if t - END_MARGIN_SECONDS >= 2 * floor]
    fitted = fits[int(pick * len(fits))]
    budget = max(floor, math.floor((fitted - END_MARGIN_SECONDS) * (1.0 - slack)))
    plan.stage_budget = min(plan.stage_budget, budget)
    if plan.progress_timeout is not None:
        plan.progress_timeout = min(plan.progress_timeout, plan.stage_budget)
    # A first deployment too short for the budget: the consumer refuses it.
    first = max(5, int((plan.stage_budget + END_MARGIN_SECONDS) * too_short)) if unfit else fitted
    lp = LambdaPlan(
        mode=mode,
        pollers=pollers,
        batch_size=batch_size,
        timeout=first,
        fitted_timeout=fitted,
        fix_after=round(fix_after, 3),
        sweep_every=sweep_every,
        cold_start=round(cold_start, 3),
        reserved_id="worker#fn1" if reserved else "",
        reserved_at=round(reserved_at * plan.cutoff, 3),
        retries=retries,
        starved=round(starved, 4),
    )
    c.count(f"world_{FEATURE}")
    if mode == "lambda":
        plan.workers = 0
        # The drain's bound (``plan.max_time``) counts a job's attempts as if each job
        # had a worker of its own; functions alone run a batch's records one after the
        # other, ``pollers`` batches at once, and an operator's retries give each
        # failing job up to two more lives: every attempt of every job may queue
        # behind the others (soak seed 1045968: ten jobs always over their budget,
        # retried, on one poller).
        lives = 3 if retries else 1
        plan.max_time = max(plan.max_time, serial_bound(plan, plan.jobs * lives, lanes=pollers))
    plan.lambdas = lp
    # The scheduled sweep finds what no message brings (issue 33 item 1): the producer
    # leaves a record's send to it for the real grace, as beside sweeping workers.
    plan.sweep = plan.sweep or SweepPlan()
    plan.wide = replace(plan.wide, features=plan.wide.features | {FEATURE})


# --------------------------------------------------------------------------- the function


class SimLambda:
    """Marker base so the world can tell an environment from a worker (no import cycle)."""


def _new_env(world: World, deployment: Deployment) -> Any:
    from .worker import SimWorker

    class Environment(SimWorker, SimLambda):
        """One execution environment of the function: the simulated worker's handler,
        effects and lease book, driven one invocation at a time."""

        def __init__(self, env_id: str) -> None:
            c = world.chaos
            super().__init__(
                world,
                env_id,
                rate=1.0 + c.uniform(-0.001, 0.001),
                mono0=round(c.uniform(1e3, 1e6), 3),
                wall_offset=round(c.uniform(-300.0, 300.0), 3),
            )
            self.concurrency = 1
            # The function deploys the current app: both classes.
            self.classes = {JOB_CLASS: world.job_class, JOB_CLASS_V2: world.job_class_v2}
            # Lambda deletes a record's message by not reporting it: the attempt deletes
            # at once and answers whether it did (as the adapter sets it).
            self.env.deletes = None
            self.rules = {
                n: (c.stage_budget_seconds, c.lease_seconds) for n, c in self.classes.items()
            }
            self.timeout = invocation.FunctionTimeout()  # as the adapter reads it
            self.fifo_batches = invocation.FifoBatchWatch()  # as the adapter watches
            self.invoking = False
            self.busy = False
            self.invocations = 0

        def start(self) -> None:
            """Frozen between invocations: nothing runs until the mapping invokes it."""

        def drive(self, flow: Flow[T], origin: Origin, watch: Any = None) -> SimGen[T]:
            lp = world.plan.lambdas
            if lp is not None and lp.starved > 0:
                flow = self._starving(flow, lp.starved)
            return super().drive(flow, origin, watch)

        def _starving(self, flow: Flow[T], chance: float) -> Flow[T]:
            """Pass the flow's instructions on; at an intent start, maybe starve."""
            from .invariants import _intent_write
            from .resources import INTENTS

            rng = world.lambda_run.rng if world.lambda_run is not None else None
            try:
                instr = next(flow)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            while True:
                if (
                    rng is not None
                    and isinstance(instr, Call)
                    and _intent_write(instr, INTENTS) == "transaction"
                    and rng.random() < chance
                ):
                    d = rng.uniform(1.0, 2.5) * world.plan.lease
                    self.paused_until = max(self.paused_until, world.now + d)
                    world.record(self.id, "sim_starved", {"seconds": round(d, 3)})
                out = yield instr
                try:
                    instr = flow.send(out)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]

        def begin_shutdown(self) -> None:
            """Lambda retires an environment between invocations (the mapping stops
            giving it batches); a running invocation goes on to its end."""
            self.stopping = True

        def replace_after_exit(self) -> None:
            """A dead environment is not restarted: the mapping starts a new one."""

        def invocation(
            self, records: list[dict[str, Any]], deadline: float, answer: list[Any]
        ) -> SimGen[None]:
            """One invocation, as ``LambdaShell.handle``: refuse an app that can never
            fit, then each record in order under a heartbeat; the failures answered."""
            self.invocations += 1
            timeout = self.timeout.read(int((deadline - self.mono()) * 1000))
            problem = invocation.unfit_problem(self.rules, timeout)
            if problem is not None:
                world.record(self.id, "lambda_refused", {"function_timeout": timeout})
                answer.append(REFUSED)  # the invocation failed: the mapping deletes nothing
                return
            told = self.fifo_batches.seen(len(records), world.queue_url)
            if told is not None:
                world.record(self.id, told.event, dict(told.fields))
                deployment.batch_alarm = True  # the operator's alarm on the event
            self.invoking = True
            self.heartbeat_task = self.spawn("heartbeat", self._beat())
            batch = invocation.BatchEnds()

            def remaining() -> int:
                return int((deadline - self.mono()) * 1000)

            try:
                for i, record in enumerate(records):
                    name = f"inv{self.invocations}-rec{i}-{record.get('messageId', '')}"
                    origin = Origin(self.id, name, "job")
                    # The checker's I11 labels the task with the send id it claims with.
                    seen = parse_event_record(record, self.mono(), 0)
                    if isinstance(seen, Delivery):
                        origin.send_id = seen.send_id
                    end: RecordEnd | None = yield from self.drive(
                        invocation.record_flow(
                            self.env, record, batch.groups, remaining, tag=origin
                        ),
                        origin,
                    )
                    batch.ended(end)
                if batch.unstarted:
                    yield from self.drive(
                        invocation.release_unstarted_records_flow(
                            self.env, batch.unstarted, remaining
                        ),
                        Origin(self.id, "release", "release"),
                    )
            finally:
                self.invoking = False
                world.interrupt(self.heartbeat_task)
            answer.append(batch.failures)

        def _beat(self) -> SimGen[None]:
            origin = Origin(self.id, "heartbeat", "heartbeat")
            for _ in range(_LOOP_LIMIT):
                if not self.invoking:
                    return
                yield from self.drive(heartbeat_tick_flow(self.env, stopping=False), origin)
                yield SleepOp(self._next_wake(), wakeable=True)

    deployment.seq += 1
    env = Environment(f"fn{deployment.seq}")
    world.workers[env.id] = env
    world.record(env.id, "lambda_environment_started", {"function_timeout": deployment.timeout})
    return env


# --------------------------------------------------------------------------- the mapping


@dataclass
class Deployment:
    """The function as deployed now (the operator may fix a refused timeout, and a
    FIFO queue's event source that hands over batches: ``batch_size``)."""

    timeout: int
    batch_size: int
    seq: int = 0
    fixed: bool = False
    batch_alarm: bool = False  # an environment warned of a FIFO batch
    batch_fixing: bool = False


class EventSourceMapping(Actor):
    """The event source mapping: AWS's pollers, never paused nor crashed."""

    def __init__(self, world: World, lp: LambdaPlan) -> None:
        super().__init__(world, "esm")
        self.lp = lp
        self.deployment = Deployment(lp.timeout, lp.batch_size)

    def start(self) -> None:
        for k in range(self.lp.pollers):
            holder: list[Task] = []
            task = self.spawn(f"poller{k}", self._poll(holder))
            holder.append(task)

    def _poll(self, holder: list[Task]) -> SimGen[None]:
        world = self.world
        origin = Origin(self.id, "poll", "receive")
        env: Any = None
        poller = holder[0]
        for _ in range(_LOOP_LIMIT):
            out = yield from _drive(
                world, self, _receive(world.queue_url, self.deployment.batch_size), origin
            )
            messages = out.response.get("Messages", []) if isinstance(out, Ok) else []
            if not messages:
                if not isinstance(out, Ok):
                    yield SleepOp(1.0)
                continue
            records = [_event_record(m, world.queue_url) for m in messages]
            if env is None or not env.alive or env.stopping:
                env = _new_env(world, self.deployment)
                yield SleepOp(self.lp.cold_start)  # init: before the invocation's clock
            answer: list[Any] = []
            timeout = self.deployment.timeout
            deadline_at = world.now + timeout
            task = env.spawn(
                f"invoke{env.invocations + 1}",
                env.invocation(records, env.mono(deadline_at), answer),
            )
            task.on_done = lambda p=poller: world.interrupt(p)
            world.at(deadline_at, lambda e=env, t=task: self._time_out(e, t, poller))  # type: ignore[misc]
            for _ in range(_LOOP_LIMIT):
                if answer or not env.alive or world.now >= deadline_at:
                    break
                yield SleepOp(deadline_at - world.now + 1e-6, wakeable=True)
            failures = answer[0] if answer else None
            if failures == REFUSED:
                self._refused()
            if self.deployment.batch_alarm:
                self._batch_warned()
            if not isinstance(failures, list):
                continue  # failed (refused, timed out, crashed): all back at visibility
            done = [r for r in records if r["messageId"] not in set(failures)]
            if done:
                yield from _drive(world, self, _delete(world.queue_url, done), origin)

    def _time_out(self, env: Any, task: Task, poller: Task) -> None:
        if not task.done and env.alive:
            self.world.record(env.id, "lambda_timed_out", {"task": task.name})
            env.kill()
            self.world.record(env.id, "worker_exited", {})
        self.world.interrupt(poller)

    def _refused(self) -> None:
        """A refused invocation is what the operator's alarm (the function's ``Errors``)
        sees: a while later the function's timeout is raised to fit the class."""
        d = self.deployment
        if d.fixed:
            return
        d.fixed = True

        def fix() -> None:
            d.timeout = self.lp.fitted_timeout
            self.world.record("operator", "lambda_timeout_raised", {"timeout": d.timeout})
            for w in list(self.world.workers.values()):
                if isinstance(w, SimLambda):
                    w.begin_shutdown()  # type: ignore[attr-defined]

        self.world.at(self.world.now + self.lp.fix_after, fix)

    def _batch_warned(self) -> None:
        """A FIFO batch's warning reaches the operator as the refusal does: a while
        later the event source's batch size is set to the one the warning names."""
        d = self.deployment
        if d.batch_fixing:
            return
        d.batch_fixing = True

        def fix() -> None:
            d.batch_size = FIFO_BATCH_SIZE
            self.world.record("operator", "lambda_batch_size_set", {"batch_size": d.batch_size})

        self.world.at(self.world.now + self.lp.fix_after, fix)


def _drive(world: World, actor: Actor, flow: Flow[Any], origin: Origin) -> SimGen[Any]:
    from .worker import drive

    return (yield from drive(world, actor, flow, origin))


def _receive(queue_url: str, batch_size: int) -> Flow[Outcome]:
    out: Outcome = yield from call(
        Call(
            "sqs",
            "ReceiveMessage",
            {
                "QueueUrl": queue_url,
                "MaxNumberOfMessages": batch_size,
                "WaitTimeSeconds": 20,
                "MessageSystemAttributeNames": ["All"],
            },
        )
    )
    return out


def _delete(queue_url: str, records: list[dict[str, Any]]) -> Flow[None]:
    entries = [{"Id": str(i), "ReceiptHandle": r["receiptHandle"]} for i, r in enumerate(records)]
    yield from call(Call("sqs", "DeleteMessageBatch", {"QueueUrl": queue_url, "Entries": entries}))


def _event_record(m: Mapping[str, Any], queue_url: str) -> dict[str, Any]:
    """A received message in the event's own spelling (as the mapping hands it over;
    a FIFO queue's ARN ends ``.fifo``, its records name their group)."""
    return {
        "messageId": m.get("MessageId", ""),
        "receiptHandle": m.get("ReceiptHandle", ""),
        "body": m.get("Body", ""),
        "attributes": dict(m.get("Attributes") or {}),
        "messageAttributes": dict(m.get("MessageAttributes") or {}),
        "eventSource": "aws:sqs",
        "eventSourceARN": QUEUE_ARN + queue_url[len(QUEUE) :],
    }


# --------------------------------------------------------------------------- the sweep


class Sweeper(Actor):
    """The scheduled sweep function (EventBridge, every few minutes): the stranded
    records to the end of the ``unsent`` index, then the DLQ, within its timeout."""

    def __init__(self, world: World, lp: LambdaPlan) -> None:
        super().__init__(world, "sweeper")
        self.lp = lp
        self.runs = 0

    def start(self) -> None:
        self.spawn("schedule", self._schedule())

    def _schedule(self) -> SimGen[None]:
        sweep = self.world.plan.sweep
        assert sweep is not None
        wait = self.lp.sweep_every * self.world.chaos.random()
        for _ in range(_LOOP_LIMIT):
            yield SleepOp(wait)
            wait = self.lp.sweep_every
            self.runs += 1
            env = _sweep_env(self)
            yield from _drive(
                self.world,
                self,
                sweep_pages_flow(
                    env,
                    older_than=sweep.grace,
                    limit=SCHEDULED_SWEEP_PAGE,
                    send_id_prefix=f"sweeper-{self.runs}",
                    dlq_receives=SCHEDULED_DLQ_RECEIVES,
                    until=self.mono() + min(self.lp.fitted_timeout, 300) - END_MARGIN_SECONDS,
                ),
                Origin(self.id, f"sweep{self.runs}", "sweep"),
            )


def _sweep_env(actor: Actor) -> AttemptEnv:
    from ..._core.leasebook import Flag, LeaseBook

    world = actor.world
    ids = iter(range(1, 1_000_000))
    return AttemptEnv(
        table=world.jobs_req,
        intents=world.intents_req,
        queue_url=world.queue_url,
        dlq_url=world.dlq_url,
        worker_id=actor.id,
        book=LeaseBook(),
        rules_of=lambda name: {JOB_CLASS: world.job_class, JOB_CLASS_V2: world.job_class_v2}.get(
            name
        ),
        receive_visibility=world.job_class.lease_seconds,
        unknown_class_receives=0,
        now=lambda: Now(actor.mono(), actor.wall()),
        random=lambda: world.chaos.random(),
        write_id=lambda: f"{actor.id}.{next(ids)}",
        tally=_no_tally,
        new_signal=Flag,
        run_handler=_none,
        observer=None,
        run_parallel=_none,
        deletes=None,
    )


def _no_tally(what: str, n: int | bool = 1) -> None:
    """The sweep function counts nothing of its own (its journal says what it did)."""


def _none(*_: Any) -> Any:  # pragma: no cover - the sweep runs no handler
    raise RuntimeError("the sweep function runs no handler")


# --------------------------------------------------------------------------- the world's hook


def start(world: World) -> None:
    """Start the mapping's pollers, the sweep schedule and the reserved-id producer."""
    lp: LambdaPlan | None = getattr(world.plan, "lambdas", None)
    if lp is None:
        return
    world.record("world", "lambda", {k: v for k, v in vars(lp).items()})
    EventSourceMapping(world, lp).start()
    Sweeper(world, lp).start()
    world.lambda_run = LambdaRun(world, lp)
    if lp.reserved_id:
        world.at(lp.reserved_at, lambda: _submit_reserved(world, lp.reserved_id))


class LambdaRun:
    """The run's operator beside the functions: ``jobs retry`` on a job that failed (not
    cancelled), a little after it failed, at most twice per job, while the functions and
    workers go on (a stale attempt's late writes, its message's redeliveries, the
    sweep). The operator's process may die half way and run the command again, as in
    ``operator_races`` (``Runbook.run``)."""

    def __init__(self, world: World, lp: LambdaPlan) -> None:
        self.world = world
        self.lp = lp
        self.rng = random.Random(f"lambda-ops-{world.seed}")
        self.retried: dict[str, int] = {}

    def job_written(self, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        """The world's hook on every job-table write."""
        if not self.lp.retries or new is None or new.get("state", {}).get("S") != "failed":
            return
        if old is not None and old.get("state", {}).get("S") == "failed":
            return
        job_id = str(new["job_id"]["S"])
        n = self.retried.get(job_id, 0)
        if job_id not in self.world.job_plans or n >= 2:
            return
        if new.get("error_code", {}).get("S") == CANCELLED_CODE:
            return  # refused by the command (a cancelled job is submitted again)
        self.retried[job_id] = n + 1
        delay = self.rng.uniform(0.5, 30.0)
        self.world.at(self.world.now + delay, lambda: self._retry(job_id, n + 1))

    def _retry(self, job_id: str, n: int) -> None:
        from ..._core.stages import retry_failed_flow

        world = self.world
        world.record("operator", "operator_retries", {"job_id": job_id})

        def command(sid: str) -> Any:
            return retry_failed_flow(
                world.jobs_req,
                queue_url=world.queue_url,
                job_id=job_id,
                wall_now=world.operator.wall(),
                send_id=sid,
            )

        origin = Origin("operator", f"retry-{job_id}-{n}", "operator")
        world.runbook.run(origin, command, f"{job_id}.retry{n}")


def _submit_reserved(world: World, job_id: str) -> None:
    """A producer submits a job under a worker's reserved id (defect 12): refused at
    submit; had it been stored, it is a job like any other and must end as one."""
    from ..._core.sending import submit_flow
    from ..._jobs import canonical_json, payload_hash
    from .tasks import drive_plain as _drive_plain

    text = canonical_json({"n": 0})

    def accepted() -> None:
        world.reserved_jobs.add(job_id)

    flow = submit_flow(
        world.jobs_req,
        queue_url=world.queue_url,
        job_id=job_id,
        job_class=JOB_CLASS,
        payload_json=text,
        payload_hash=payload_hash(text),
        wall_now=world.producer.wall(),
        send_id=f"reserved.{job_id}",
        resend_after=producers.resend_after(world),
    )
    origin = Origin("producer", f"submit-{job_id}", "producer")
    world.producer.spawn(
        f"submit-{job_id}", _drive_plain(world, world.producer, _noting(flow, accepted), origin)
    )


def _noting(flow: Flow[Any], accepted: Any) -> Flow[Any]:
    """The submission; once its record write is answered, the job is one to check."""
    instr = next(flow)
    while True:
        out = yield instr
        if isinstance(instr, Call) and instr.service == "dynamodb" and isinstance(out, Ok):
            accepted()
        try:
            instr = flow.send(out)
        except StopIteration as stop:
            return stop.value


# --------------------------------------------------------------------------- the checks

I23 = "I23_dead_lettered_unstarted"
"""lambda: no job is dead-lettered without one attempt ever started: a consumer that
can never start a class refuses it (its invocations fail until the function is
fixed) rather than hand its records back until SQS moves them to the DLQ."""


def finish(world: World, records: MappingT[str, MappingT[str, Any] | None]) -> None:
    """At the end of a lambda run: I23, and every job stored under a reserved id is a
    job record that ended like any other (I4: a liveness item must never replace one)."""
    from ..._core.records import DEAD_LETTERED_CODE, JobState
    from ..._schema.views import view_of
    from .invariants import I4
    from .resources import JOBS

    if world.plan.lambdas is None:
        return
    checker = world.checker
    for job_id, item in records.items():
        if item is None or "state" not in item:
            continue
        v = view_of(item)
        if v.state is JobState.PARKED and v.error_code == DEAD_LETTERED_CODE and v.attempt == 0:
            checker.fail(
                I23,
                f"{job_id} was dead-lettered without an attempt ever started (stage budget "
                f"{world.plan.stage_budget:g} s, function timeout "
                f"{world.plan.lambdas.timeout} s)",
            )
    for job_id in sorted(world.reserved_jobs):
        item = world.ddb.get(JOBS, {"job_id": {"S": job_id}})
        if item is None or "state" not in item:
            kind = item.get("kind", {}).get("S") if item is not None else None
            checker.fail(
                I4,
                f"{job_id} (a reserved id, stored at submit) has no job record at the end"
                + (f": a {kind} item replaced it" if kind else ""),
            )
            continue
        v = view_of(item)
        if not (v.state.terminal or v.state is JobState.PARKED):
            checker.fail(I4, f"{job_id} (a reserved id) is {v.state} after the drain")
