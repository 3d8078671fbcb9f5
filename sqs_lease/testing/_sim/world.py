"""The simulated world: a discrete-event scheduler, the services, the actors, the run.

The world answers each op a task yields (``tasks``) at a virtual time: a call
travels through the network (``network``) to the simulated SQS and DynamoDB or a
target; faults (``faults``), the producer (``producers``) and the operator
(``operators``) act on their schedule; the checker hears every write and effect
(``hooks``) and judges the end of the run (``drain``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..._core.calls import Err, Ok
from ..._schema.intent_requests import IntentTable
from ..._schema.job_requests import JobTable
from . import drain, faults, network, producers
from . import fifo as fifo_world
from . import plan as plans
from .chaos import Chaos
from .clocks import Clocks
from .ddb import SimDynamo
from .hooks import Hooks
from .invariants import E_BUDGET, E_EXC, Checker, Violation
from .operators import Runbook
from .plan import RunPlan
from .receiver import Receivers
from .render import plan_summary, render_entry
from .resources import (
    ATTEMPTS,
    DLQ,
    INTENTS,
    JOB_CLASS,
    JOB_CLASS_V2,
    JOBS,
    QUEUE,
    sim_job_class,
    table_specs,
)
from .sqs import SimSQS
from .tasks import Actor, CallOp, Op, SleepOp, Task

if TYPE_CHECKING:
    from .user import UserJobs

MAX_EVENTS = 3_000_000


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


class World:
    """One seeded run: the plan drawn from the seed, the services, the actors, the
    event heap; :meth:`run` plays it to the end and returns what happened."""

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
        plan: RunPlan | None = None,
    ) -> None:
        self.seed = seed
        # A user's app: its handlers run instead of the scripted plans (user.py).
        self.user = user
        self.mutation = mutation
        self.trace = trace
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = 0
        self.events = 0
        self.chaos = Chaos(seed)
        # ``plan``: a world built, not drawn (a fleet: fleet.py)
        self.plan: RunPlan = plan or plans.draw_plan(
            self.chaos, workers=workers, jobs=jobs, features=features
        )
        self.chaos.cutoff = self.plan.cutoff
        self.log: list[tuple[float, str, str, Any]] = []
        self.checker = Checker(JOBS, INTENTS)
        self.hooks = Hooks(self)
        self.checker.known_classes = self.hooks.known_classes
        self.checker.live_owner = self.hooks.live_owner  # I24 (dup-defer)
        self.counts = self.checker.counts
        self.ddb = SimDynamo(
            table_specs(),
            self.chaos,
            self.plan.ddb,
            on_write=self.hooks.on_write,
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
        self.sqs.on_redrive = self.hooks.on_redrive
        self.receivers = Receivers(self.chaos, self.plan.targets)
        self.receivers.add("keyed", keyed=True)
        self.receivers.add("unkeyed", keyed=False)
        self.receivers.listeners.append(self.hooks.on_effect)
        self.receivers.admitted.append(self.checker.request_admitted)
        self.jobs_req = JobTable(JOBS)
        self.intents_req = IntentTable(INTENTS, ATTEMPTS)
        p = self.plan
        self.job_class = sim_job_class(JOB_CLASS, p)
        self.job_class_v2 = sim_job_class(JOB_CLASS_V2, p)
        self.job_plans = {jp.job_id: jp for jp in p.job_plans}
        # staged: each staged job's stages, in order (the checker's I18)
        self.checker.staged = {jp.job_id: jp.stage_names for jp in p.job_plans if jp.stages}
        self._old_left = p.wide.old_workers  # mixed_versions: first workers on the old app
        self._journal_hooks = self.hooks.journal()
        from . import planned  # plans: the drawn app, its limits and shells (None: off)

        self.planned = planned.setup(self)
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
        self.runbook = Runbook(self)  # operator_races: the operator's decisions
        self._edited: set[str] = set()  # unreadable_records: jobs an outside writer edited
        # oversize: job -> token of the attempt whose handler returned it
        self.oversize_returned: dict[str, int] = {}
        self.failed_tasks = 0
        self.reserved_jobs: set[str] = set()  # lambda: jobs stored under a reserved id
        self.lambda_run: Any = None  # lambda: the operator's retries (lambdas.LambdaRun)
        self.max_events = MAX_EVENTS  # the run's event budget (a fleet's is its size's)
        # A fleet's producers: after a failed submit, the wait before the next try (None:
        # a drawn world's producer, 1 s and at most 30 tries)
        self.producer_backoff: Callable[[int], float] | None = None
        # A fleet's SDK: the wait before it resends a throttled call (None: at once)
        self.sdk_backoff: Callable[[int], float] | None = None

    # ------------------------------------------------------------------ scheduling

    def at(self, t: float, fn: Callable[[], None]) -> None:
        self.seq += 1
        now = self.now
        heapq.heappush(self._heap, (t if t > now else now, self.seq, fn))

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
            value = network.stamped(value, value.sent_at if sent is None else sent, actor.mono())
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
            network.call(self, task, op)
        else:
            network.remote(self, task, op.remote)

    # ------------------------------------------------------------------ what is true now

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

    # ------------------------------------------------------------------ the run

    def run(self) -> RunResult:
        p = self.plan
        self.record("world", "plan", plan_summary(p))
        self.clocks.leave_dead_entries()  # issue 26 (dead_entries)
        for jp in p.job_plans:
            self.at(jp.submit_at, lambda j=jp.job_id: producers.submit(self, j))  # type: ignore[misc]
        for _ in range(p.workers):
            self.new_worker()
        times = sorted(self.chaos.uniform(0.0, p.cutoff) for _ in range(p.fault_events))
        for t in times:
            self.at(t, lambda: faults.fault(self))
        # issue 14's features (docs/simulation.md, "The widened world")
        faults.schedule_unreadable(self)
        producers.schedule_extra_submits(self)
        if self.fifo is not None:
            self.fifo.schedule()  # the fifo world's resubmits
        from . import lambdas  # lambda: the event source mapping and the sweep function

        lambdas.start(self)
        if "mixed_versions" in p.wide.features:
            self.at(p.wide.deploy_at, lambda: faults.deploy(self))
            for t in p.wide.stray_messages:
                self.at(t, lambda: faults.stray(self))
        n_jobs = len(p.job_plans)
        self._last_submit = max((jp.submit_at for jp in p.job_plans), default=0.0)
        settle_end: float | None = None
        # The loop runs once per event: the names it reads every time are local.
        heap, pop, chaos, checker = self._heap, heapq.heappop, self.chaos, self.checker
        violations, final_jobs = checker.violations, checker.final_jobs
        max_time, last_submit, max_events = p.max_time, self._last_submit, self.max_events
        while heap:
            t, _, fn = pop(heap)
            if t > max_time:
                break
            self.now = t
            chaos.now = t
            self.events += 1
            if self.events > max_events:
                checker.now = t
                checker.fail(E_BUDGET, f"more than {max_events} events")
                break
            fn()
            if violations:
                break
            finished = drain.finished(self) if self._edited else len(final_jobs)
            finished -= len(self.reserved_jobs)  # lambda: a reserved id's job is not a plan's
            if settle_end is None:
                if finished == n_jobs and t >= last_submit:
                    self.done_at = t
                    settle_end = t + p.settle
            elif finished < n_jobs:
                settle_end = None  # operator_races: a resumed job runs again
            elif t >= settle_end:
                break
        drain.check_end(self)
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
