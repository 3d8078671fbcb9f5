"""The ``plans`` world (issue 26): planned jobs whose steps call tools, limits per tool
and per tenant, tools with their own (tighter) lease, and ``async def`` tools mixed
with plain ones, run by thread and async worker shells.

What a seed draws (:func:`draw`, from its own stream ``plans-SEED``, so a seed with the
feature off runs byte for byte as before):

- 2-4 tools (``search``, ``mail``, ``ocr``, ``erp``), each plain or ``async def``, some
  with a fleet-wide ``concurrency_limit`` (1-2), some with a lease tighter than the
  job's; an app-wide tenant limit (1-2) in some runs, each job of a tenant;
- about 2 jobs in 3 become planned jobs: their steps cut into 1-4 plan steps, each a
  stage ``N-tool`` calling a drawn tool, so tools are shared by plans and steps (on a
  FIFO queue whose app does not interleave stages, a job of a session gets one plan
  step: the core refuses a job of several stages in a session there);
- per worker start, the shell (thread or async) and, for an async worker, the
  ``max_loop_lag`` its operator asked for (sized from the job's own timing, as an
  operator reading the job's defaults would); an async tool may hold the event loop
  for part of one of its steps (a stall).

The world builds a real :class:`~sqs_lease.App` from the draw (``app.planned``,
``@job.tool``) and decides everything with the real app's functions, as the real
shells do: a stage's rules and limit (``App.get``, ``App.stage_limit_for``, the
core's ``SlotEnv``), whether a callable is awaited (``Registered.is_async``), what a
thread worker refuses at start (``_shell.async_handlers``), the loop lag an async
worker tolerates (``tolerated_loop_lag`` over ``App.lease_rules``), the pace's
budget and the receive's first lease (``App.job_classes``). The truth the checker
holds against them is the draw itself:

- ``P1_limit_exceeded``: the holders of a tool's limit (or a tenant's) at any
  instant never exceed it, across plans and steps. A holder is an attempt whose
  handler started and whose job's record is still running under its token (the
  slot rule 1 of ``_core/slots.py``: a fenced-out handler holds no slot).
- ``P2_callable_misrun``: no callable is run the way it cannot be run (an ``async
  def`` called and never awaited, a plain function awaited), and a thread worker
  never accepts an app with an ``async def`` in it.
- ``P3_tolerated_stall``: a stall of an async worker's event loop that the worker
  tolerated (no ``loop_blocked``) is never longer than a lease it holds survives
  (the lease's ``L - H - J``): a tolerated stall must never cost a lease.
- ``P4_waiter_dead_lettered``: no job's wait for a slot brings it nearer the DLQ: no
  message that went to the DLQ had a receive that waited (a waiter waits as a fresh
  message; the one it came with is retired).
"""

from __future__ import annotations

import inspect
import json
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..._core.env import HandlerRun, SlotEnv
from ..._core.leasebook import is_open
from ..._core.rounds import watchdog_drops_flow
from ..._core.timing import DEFAULT_LOOP_LAG, Pace, pace_budget, tolerated_loop_lag
from ..._errors import ConfigError
from ..._jobs import App, JobClass, JobPolicy
from ..._schema.slot_requests import SlotTable
from ..._shell import async_handlers
from . import lambdas
from .ddb import TableSpec
from .invariants import Origin
from .plan import JobPlan, RunPlan, serial_bound

if TYPE_CHECKING:
    from .sqs import Message
    from .tasks import SimGen
    from .worker import SimWorker
    from .world import World

FEATURE = "plans"
SLOTS = "sim-slots"
TOOL_NAMES = ("search", "mail", "ocr", "erp")
TENANTS = ("acme", "globex", "initech")

P1 = "P1_limit_exceeded"
P2 = "P2_callable_misrun"
P3 = "P3_tolerated_stall"
P4 = "P4_waiter_dead_lettered"
INVARIANTS = {
    P1: "the holders of a tool's (or tenant's) limit never exceed it, across plans and steps",
    P2: "no callable run as it cannot be (async never awaited, plain awaited); no thread "
    "worker accepts an app with an async def",
    P3: "a loop stall the async worker tolerated never outlasts a lease it holds",
    P4: "no job's wait for a slot sends it to the DLQ",
}


@dataclass(frozen=True)
class ToolDraw:
    name: str
    is_async: bool
    limit: int | None
    # (lease, heartbeat, jitter) tighter than the job's; None: the job's own
    timing: tuple[int, float, float] | None


@dataclass(frozen=True)
class PlansDraw:
    tools: tuple[ToolDraw, ...]
    tenant_limit: int | None
    tenants: tuple[tuple[str, str], ...]  # (job id, tenant)
    shells: tuple[str, ...]  # per worker start, in turn: "thread" | "async"
    # per worker start: the max_loop_lag its operator asks for (None: the default)
    loop_lags: tuple[float | None, ...]
    # (job id, stage, step index) -> seconds an async tool's step holds the loop
    stalls: tuple[tuple[tuple[str, str, int], float], ...]

    def tool(self, name: str) -> ToolDraw:
        return next(t for t in self.tools if t.name == name)


def tool_of(stage: str | None) -> str | None:
    """The tool a planned stage (``N-tool``) calls (None: not a planned stage)."""
    number, sep, tool = (stage or "").partition("-")
    return tool if sep and number.isdigit() and tool in TOOL_NAMES else None


def draw(plan: RunPlan, allowed: frozenset[str]) -> None:
    """Draw the ``plans`` world into ``plan`` (see the module doc)."""
    r = random.Random(f"{FEATURE}-{plan.seed}")
    on = r.random() < 0.35
    n_tools = r.randint(2, 4)
    tools = []
    for name in TOOL_NAMES[:n_tools]:
        is_async = r.random() < 0.5
        limit = r.choice([1, 1, 2]) if r.random() < 0.6 else None
        tight = r.random() < 0.4
        # (the long profile's leases are minutes: a tight tool's is ten times its draw)
        lease = r.choice([10, 15]) * (10 if plan.profile == "long" else 1)
        jitter = round(r.uniform(0.5, 2.0), 2)
        beat = round((lease - jitter) / r.uniform(3.6, 6.0), 2)
        timing = (lease, beat, jitter) if tight and lease < plan.lease else None
        tools.append(ToolDraw(name, is_async, limit, timing))
    tenant_limit = r.choice([1, 2]) if r.random() < 0.4 else None
    picks = [
        (r.random() < 0.65, r.randint(1, 4), r.random(), [r.randrange(n_tools) for _ in range(4)])
        for _ in plan.job_plans
    ]
    tenants = tuple((jp.job_id, r.choice(TENANTS)) for jp in plan.job_plans)
    shells = tuple(r.choice(["thread", "async"]) for _ in range(16))
    # the operator sizes max_loop_lag from the job's own timing (its defaults)
    job_limit = plan.lease - plan.heartbeat - plan.jitter
    loop_lags = tuple(
        round(r.uniform(0.2, 0.9) * job_limit, 3) if r.random() < 0.5 else None for _ in range(16)
    )
    stall_picks = [[r.random() for _ in range(8)] for _ in plan.job_plans]
    if not on or FEATURE not in allowed:
        return
    if plan.fifo is not None and lambdas.takes(plan, allowed):
        # A FIFO seed the lambda world takes stays its own (the two are not drawn
        # together; on a standard queue the plans world came first and keeps it)
        return
    # fifo: a job of several stages goes in a session only where the app interleaves
    # them (the core refuses it otherwise): such a job gets one plan step
    sessions = plan.fifo.sessions if plan.fifo is not None and not plan.fifo.interleave else {}
    jobs: list[JobPlan] = []
    stalls: list[tuple[tuple[str, str, int], float]] = []
    lag = max((x for x in loop_lags if x is not None), default=DEFAULT_LOOP_LAG)
    planned = 0
    for jp, (chosen, n, salt, which), rolls in zip(plan.job_plans, picks, stall_picks, strict=True):
        if not chosen or jp.stages or jp.job_class != "sim":
            jobs.append(jp)
            continue
        n = 1 if jp.job_id in sessions else min(n, len(jp.steps))
        cuts = sorted(random.Random(f"{salt}").sample(range(1, len(jp.steps)), n - 1))
        bounds = [0, *cuts, len(jp.steps)]
        stages = []
        for i in range(n):
            tool = tools[which[i]]
            name = f"{i + 1}-{tool.name}"
            steps = jp.steps[bounds[i] : bounds[i + 1]]
            stages.append((name, steps))
            if tool.is_async:
                # one in four async steps blocks the loop: half of them within the
                # default tolerated lag, half up to the most an operator asked for
                for k, step in enumerate(steps):
                    roll = rolls[(i + k) % len(rolls)]
                    if step.kind != "work" or roll >= 0.25:
                        continue
                    scale = DEFAULT_LOOP_LAG if roll < 0.125 else lag
                    seconds = round((roll % 0.125) * 8.0 * scale, 3)
                    stalls.append(((jp.job_id, name, k), seconds))
        jobs.append(replace(jp, stages=tuple(stages)))
        planned += 1
    if not planned:
        return
    if tenant_limit is not None or any(t.limit is not None for t in tools):
        # a limit runs its holders one after another: the drain's bound counts every
        # planned job in a row (hours each in the long profile)
        plan.max_time = max(plan.max_time, serial_bound(plan, planned))
    plan.job_plans = jobs
    plan.plans = PlansDraw(
        tools=tuple(tools),
        tenant_limit=tenant_limit,
        tenants=tenants,
        shells=shells,
        loop_lags=loop_lags,
        stalls=tuple(stalls),
    )
    plan.wide = replace(plan.wide, features=plan.wide.features | {FEATURE})


# ----------------------------------------------------------------------------- the app


class _StepContext:
    """What a planned step's real wrapper reads of its context (``plans._step_end``)."""

    def __init__(self, payload_json: str) -> None:
        self.job_payload_json = payload_json
        self.results: dict[str, Any] = {}


def _tool_fn(name: str, is_async: bool) -> Any:
    if is_async:

        async def async_tool(ctx: Any, args: Any) -> Any:
            return {"tool": name}

        return async_tool

    def plain_tool(ctx: Any, args: Any) -> Any:
        return {"tool": name}

    return plain_tool


def build_app(world: World, d: PlansDraw) -> App:
    """The real app the draw describes: the job ``sim`` planned, its tools on it."""
    from .resources import JOB_CLASS, SimPayload

    c = world.job_class
    policy: JobPolicy = {
        "lease_seconds": c.lease_seconds,
        "heartbeat_seconds": c.heartbeat_seconds,
        "jitter_seconds": c.jitter_seconds,
        "missed_heartbeats": c.missed_heartbeats,
        "effect_timeout_seconds": c.effect_timeout_seconds,
        "progress_timeout_seconds": c.progress_timeout_seconds,
        "stage_budget_seconds": c.stage_budget_seconds,
        "max_attempts": c.max_attempts,
        "backoff_base_seconds": c.backoff_base_seconds,
        "backoff_max_seconds": c.backoff_max_seconds,
    }
    app = App(tenant_limit=d.tenant_limit)
    job = app.planned(JOB_CLASS, **policy)
    for t in d.tools:
        own: dict[str, Any] = {}
        if t.limit is not None:
            own["concurrency_limit"] = t.limit
        if t.timing is not None:
            lease, beat, jitter = t.timing
            own.update(lease_seconds=lease, heartbeat_seconds=beat, jitter_seconds=jitter)
        job.tool(t.name, args=SimPayload, **own)(_tool_fn(t.name, t.is_async))
    return app


class Planned:
    """The ``plans`` world of one run: its app, the shells, and the checker's rules."""

    def __init__(self, world: World, d: PlansDraw) -> None:
        self.world = world
        self.draw = d
        self.app = build_app(world, d)
        self.rand = random.Random(f"{FEATURE}-run-{world.seed}")
        self.tenants = dict(d.tenants)
        self.stalls = dict(d.stalls)
        self._starts = 0
        # P1: per limit (("tool", name) or ("tenant", name)), the attempts holding it
        self._holders: dict[tuple[str, str], list[_Holder]] = {}
        ddb = world.ddb
        ddb.specs[SLOTS] = TableSpec(SLOTS, "slot")
        ddb.items[SLOTS] = {}
        ddb._prev[SLOTS] = {}
        self.slots = SlotTable(SLOTS)
        # P4: the message each claim came with, and the receives of each that waited
        self._claims: dict[tuple[str, Any], str] = {}
        self._waits: dict[str, int] = {}
        for kind, hook in (("job_claimed", self._claimed), ("job_waiting_for_slot", self._waited)):
            world._journal_hooks[kind] = _chain(world._journal_hooks.get(kind), hook)

    # ------------------------------------------------------------------ hooks

    def tenant(self, job_id: str) -> str | None:
        return self.tenants.get(job_id)

    def stage_rules(self, job_class: str, stage: str) -> JobClass | None:
        """A planned stage's rules: its tool's class, as the app resolves it."""
        reg = self.app.get(job_class, stage)
        return reg.job_class if reg is not None else None

    def worker_started(self, w: SimWorker, info: dict[str, Any]) -> None:
        """Configure a new worker as its real shell would be, from the app: its slots,
        pace, first lease; its shell (a thread worker refuses an app with an ``async
        def``, checked against the draw) and, async, the loop lag it tolerates."""
        i = self._starts
        self._starts += 1
        app = self.app
        classes = app.job_classes() + list(w.classes.values())
        w.receive_visibility = min(c.lease_seconds for c in classes)
        w.env.receive_visibility = w.receive_visibility
        w.book.pace = Pace(
            pace_budget((c.lease_seconds, c.heartbeat_seconds, c.jitter_seconds) for c in classes)
        )
        if app.has_limits:
            w.env.slots = SlotEnv(
                self.slots, app.class_limit_for, app.tenant_limit_for, app.stage_limit_for
            )
        shell = self.draw.shells[i % len(self.draw.shells)]
        truth = sorted(t.name for t in self.draw.tools if t.is_async)
        if shell == "thread":
            refused = async_handlers(app)
            if truth and not refused:
                self._fail(
                    P2,
                    f"thread worker {w.id} accepted an app with async def tools {truth}: "
                    "it cannot await them (it must refuse the app at start)",
                )
            if refused:
                # the operator runs the async worker instead
                self.world.record(w.id, "sim_worker_refused", {"shell": "thread"})
                self._bump("plans_thread_refused")
                shell = "async"
        w.shell = shell
        info["shell"] = shell
        if shell == "async":
            requested = self.draw.loop_lags[i % len(self.draw.loop_lags)]
            timings = [
                (n, c.lease_seconds, c.heartbeat_seconds, c.jitter_seconds)
                for n, c in app.lease_rules()
            ]
            try:
                w.loop_lag = tolerated_loop_lag(requested, timings)
            except ConfigError:
                # refused at start; the operator leaves max_loop_lag to the default
                self.world.record(w.id, "sim_worker_refused", {"max_loop_lag": requested})
                self._bump("plans_loop_lag_refused")
                w.loop_lag = tolerated_loop_lag(None, timings)
            info["max_loop_lag"] = w.loop_lag

    def _claimed(self, worker: str, data: Any) -> None:
        self._claims[(str(data.get("job_id")), data.get("token"))] = str(data.get("message_id"))

    def _waited(self, worker: str, data: Any) -> None:
        job_id = str(data.get("job_id"))
        message = self._claims.get((job_id, data.get("token")))
        if message is not None:
            self._waits[message] = self._waits.get(message, 0) + 1
        self._behind_edited(job_id, str(data.get("pool")), data.get("limit"))

    def _behind_edited(self, job_id: str, pool: str, limit: Any) -> None:
        """unreadable_records: a job that waits for a pool whose every slot is held by a
        job an outside writer broke waits for the operator, as that job does (its record
        stays running under the slot's token, its message went to the DLQ as poison,
        and a slot is never taken on a guess): it is the operator's, like that job
        (``World._edited``: not judged by I4)."""
        edited = self.world._edited
        if not edited or not isinstance(limit, int):
            return
        slots = self.world.ddb.items[SLOTS]
        for i in range(limit):
            item = slots.get((("slot", "S", f"{pool}#{i}"),))
            holder = self.slots.parse(item) if item is not None else None
            if holder is None or holder.job_id not in edited:
                return
            if self.world.truth(holder.job_id) != (holder.token, "running"):
                return
        if job_id not in edited:
            edited.add(job_id)
            self.world.record("world", "sim_waits_behind_edited", {"job_id": job_id, "pool": pool})

    def redriven(self, m: Message) -> None:
        """P4: a message the queue moves to the DLQ had no receive that waited for a
        slot (a wait retires the message it was received with: its receives count
        only claims that could run)."""
        waits = self._waits.get(m.message_id, 0)
        if waits:
            self._fail(
                P4,
                f"message {m.message_id} went to the DLQ after {waits} of its receives "
                "waited for a slot (a wait must retire the message it came with)",
            )

    # ------------------------------------------------------------------ a planned stage

    def start_stage(self, w: SimWorker, run: HandlerRun, jp: JobPlan) -> _Run | None:
        """A planned stage's handler starts: check the limits it holds (P1), then run its
        tool's callable as this shell would, deciding as the real shells do (P2)."""
        claim = run.claim
        job = claim.job
        tool = tool_of(job.stage)
        self._hold(w, run, tool)
        if tool is None:
            return None
        reg = self.app.get(job.job_class, job.stage)
        assert reg is not None
        truly_async = self.draw.tool(tool).is_async
        awaited = w.shell == "async" and reg.is_async
        steps = [{"tool": tool_of(name), "args": {"n": 0}} for name in jp.stage_names]
        try:
            value: Any = reg.handler(_StepContext(json.dumps({"steps": steps})), None)
        except Exception as exc:  # the wrapper's own failure, not this shell's decision
            value = exc
        got_coroutine = inspect.iscoroutine(value)
        ran = False
        if got_coroutine and awaited:
            try:
                value.send(None)  # the simulated tools never suspend
            except StopIteration:
                ran = True
                self._bump("plans_async_awaited")
        for coroutine in _coroutines(value):
            coroutine.close()  # never awaited (as a real shell would drop it)
        what = f"{job.job_id} stage {job.stage} (tool {tool!r}, {w.shell} worker {w.id})"
        if truly_async and not ran:
            self._fail(P2, f"{what}: an async def tool called and never awaited")
            raise TypeError(f"{what}: a coroutine was never awaited (its result is not JSON)")
        if awaited and not got_coroutine:
            self._fail(P2, f"{what}: a plain tool awaited")
            return _Run(misrun=f"{what}: object dict can't be used in 'await' expression")
        return _Run()

    def block(self, w: SimWorker, run: HandlerRun, seconds: float) -> SimGen[None]:
        """An async tool's step holds the event loop ``seconds``: the whole worker (its
        heartbeat, its answers) waits, then the shell judges the stall as the real
        async worker does (``LeaseBook.loop_stalled``, ``loop_blocked``, the drops)."""
        from .tasks import SleepOp

        job_id = run.claim.job.job_id
        began = w.mono()
        held = [h.lease for h in w.book.entries() if is_open(h)]
        # Held until this task wakes (the same instant, scheduled first): as the real
        # async worker judges the stall when the step returns, before any other task
        # of the loop (its heartbeat) runs.
        w.paused_until = max(w.paused_until, self.world.now + max(0.0, seconds) / w.rate)
        yield SleepOp(seconds)
        ended = w.mono()
        stall, dropped = w.book.loop_stalled(job_id, began=began, ended=ended, tolerated=w.loop_lag)
        self._bump("plans_stall" if stall.event is None else "plans_stall_judged")
        if stall.event is None:
            for lease in held:
                survives = lease.lease_seconds - lease.heartbeat_seconds - lease.jitter_seconds
                if ended - began > survives:
                    self._fail(
                        P3,
                        f"{w.id}: the event loop was held {ended - began:.3f} s (by {job_id}), "
                        f"tolerated ({w.loop_lag:g} s, no loop_blocked), longer than "
                        f"{lease.job_id}'s lease survives ({survives:.3f} s)",
                    )
                    break
            return
        w.journal("loop_blocked", **{k: v for k, v in stall.event.items() if k != "lapsed"})
        w.journal("loop_unblocked", **stall.event)
        if dropped:
            w.spawn(
                f"stall-{job_id}",
                w.drive(watchdog_drops_flow(w.env, dropped, ended), Origin(w.id, "stall", "stall")),
            )

    def stall_of(self, w: SimWorker, job_id: str, stage: str | None, k: int) -> float | None:
        """How long step ``k`` of this stage holds the event loop (None: it does not;
        only an async worker runs a handler on its loop)."""
        if w.shell != "async":
            return None
        return self.stalls.get((job_id, stage or "", k))

    # ------------------------------------------------------------------ P1

    def _hold(self, w: SimWorker, run: HandlerRun, tool: str | None) -> None:
        job_id, token = run.claim.job.job_id, run.claim.token
        limits: list[tuple[tuple[str, str], int]] = []
        if tool is not None:
            t = self.draw.tool(tool)
            if t.limit is not None:
                limits.append((("tool", tool), t.limit))
        tenant = self.tenants.get(job_id)
        if tenant is not None and self.draw.tenant_limit is not None:
            limits.append((("tenant", tenant), self.draw.tenant_limit))
        me = _Holder(job_id, token, w, run.held.tag)
        for unit, limit in limits:
            live = [h for h in self._holders.get(unit, []) if h.job_id != job_id and self._live(h)]
            self._holders[unit] = [*live, me]
            self._bump(f"plans_{unit[0]}_limit_held")
            if len(live) >= limit:
                others = ", ".join(sorted(f"{h.job_id}@{h.token}" for h in live))
                self._fail(
                    P1,
                    f"{job_id}@{token} started under the {unit[0]} limit of {unit[1]!r} "
                    f"({limit}) while {len(live)} held it ({others})",
                )

    def _live(self, h: _Holder) -> bool:
        """A holder runs its handler now (not ended, its process alive) and its job's
        record is running under its token (a fenced-out handler holds no slot)."""
        if h.origin.handler_ended or not h.worker.alive:
            return False
        return self.world.truth(h.job_id) == (h.token, "running")

    def _bump(self, what: str) -> None:
        self.world.checker.bump(what, 1)

    def _fail(self, name: str, message: str) -> None:
        checker = self.world.checker
        checker.now = self.world.now
        checker.fail(name, message)


def _chain(first: Any, then: Any) -> Any:
    """A journal hook that runs ``first`` (another feature's, if any) and ``then``."""
    if first is None:
        return then

    def both(worker: str, data: Any) -> None:
        first(worker, data)
        then(worker, data)

    return both


def _coroutines(value: Any) -> list[Any]:
    """The coroutines a callable's return holds (itself, a stage's result, a plan's
    results): what a shell that called an ``async def`` without awaiting it holds."""
    from ..._core.stages import NextStage

    found = [value] if inspect.iscoroutine(value) else []
    if isinstance(value, NextStage):
        found += [value.result] if inspect.iscoroutine(value.result) else []
    elif isinstance(value, dict):
        found += [v for v in value.get("results", []) if inspect.iscoroutine(v)]
    return found


@dataclass(frozen=True)
class _Holder:
    """An attempt that started a handler under a limit (P1)."""

    job_id: str
    token: int
    worker: Any
    origin: Origin


@dataclass(frozen=True)
class _Run:
    """A planned stage's callable, as its shell ran it: ``misrun`` is the error the
    real shell meets once the handler's work is done (a plain function awaited)."""

    misrun: str = ""

    def end(self) -> None:
        if self.misrun:
            raise TypeError(self.misrun)


def setup(world: World) -> Planned | None:
    """The run's ``plans`` world (None: the seed did not draw it)."""
    d = world.plan.plans
    if not isinstance(d, PlansDraw):
        return None
    world.chaos.count(f"world_{FEATURE}")
    return Planned(world, d)


__all__ = ["FEATURE", "INVARIANTS", "P1", "P2", "P3", "P4", "Planned", "PlansDraw", "draw", "setup"]
