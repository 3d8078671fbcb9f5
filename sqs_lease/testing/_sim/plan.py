"""What a run looks like, drawn from its seed: sizes, timing, service quirks, faults, jobs."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from ..._core.limits import ITEM_LIMIT
from ..._core.messages import UNSENT_GRACE_SECONDS
from . import clocks as _clocks
from . import fifo as fifo_world
from .chaos import Chaos
from .ddb import DdbFaults
from .receiver import TargetFaults
from .sqs import SqsBehaviour

FAULT_KINDS = (
    "pause",
    "crash",
    "partition_both",
    "partition_oneway",
    "slow_window",
    "shutdown",
    "cancel",
    "poison_message",
)

# The widened world (issue 7): each feature is drawn per seed from the second random
# stream (``Chaos.wide``), so a seed with every feature off runs as it always did.
ISSUE7_FEATURES = (
    "shared_keys",  # 2-3 jobs share a business intent key and a target resource
    "cut_responses",  # the target applied, the answer is cut; user parsing raises on success
    "txn_transient",  # TransactWriteItems cancelled for ThrottlingError / TransactionConflict
    "mixed_versions",  # workers of two app versions on one queue; stray class messages
    "producer_death",  # the producer dies between the job record and its message
)
# Issue 14's features, drawn from a third stream (``Chaos.wide14``) after the others.
ISSUE14_FEATURES = (
    "concurrent_submits",  # 2-3 producers submit one job id within milliseconds
    "operator_races",  # an operator resumes and resolves parked jobs while workers run
    "unreadable_records",  # an outside writer gives a job record an unknown state a while
    "oversize",  # one job's result breaks DynamoDB's 400 KB item limit
)
# Fenced calls a handler makes without an intent (issue 14 item 3), drawn from a fourth
# stream (``plain-SEED``) after everything else.
PLAIN_FEATURES = ("plain_calls",)
# Staged jobs (issue 9), drawn from a fifth stream (``staged-SEED``) after everything else.
STAGED_FEATURES = ("staged",)
# issue 26, fifo: a FIFO queue with sessions (``sqs_lease/testing/_sim/fifo.py``, stream fifo-SEED)
FIFO_FEATURES = fifo_world.FIFO_FEATURES
# --- lambda (issue 26): Lambda consumers, alone or beside the workers (lambdas.py),
# drawn from their own stream (``lambda-SEED``) after everything else.
LAMBDA_FEATURES = ("lambda",)
# --- end lambda
# issue 26: clocks, backlog, dead_entries (clocks.py; own stream clocks-SEED)
CLOCK_FEATURES = _clocks.CLOCK_FEATURES
# --- plans (issue 26: planned jobs, tool and tenant limits, async tools; planned.py),
# drawn from their own stream (``plans-SEED``) after everything else.
PLANS_FEATURES = ("plans",)
# --- end plans
WIDE_FEATURES = (
    ISSUE7_FEATURES
    + ISSUE14_FEATURES
    + PLAIN_FEATURES
    + STAGED_FEATURES
    + FIFO_FEATURES
    + LAMBDA_FEATURES
    + CLOCK_FEATURES
    + PLANS_FEATURES
)

PASSING_FEATURES: frozenset[str] = frozenset(WIDE_FEATURES)
"""The widened features the fixed-seed tests and the mutation check run with: those
whose defects are fixed in the protocol. A feature joins when the fixes for the
invariants it breaks land (and its ``xfail`` seeds in tests/test_sim.py turn into
passing regression tests). Every feature has joined: the second soak's last
failures (tests/test_sim.py ``SOAK_2_FAILING``) were the checker's, fixed. ``make
soak`` and the CLI run every feature."""

# What the widened world injects while faults are on (coverage names, as FAULT_KINDS).
WIDE_FAULT_KINDS = (
    "tool_cut_response",
    "tool_parse_bug",
    "ddb_txn_transient",
    "stray_class_message",
    "producer_died",
    "concurrent_submit",
    "stage_death",
)


# The real worker's stranded-sweep defaults (``sqs_lease._worker.Worker``).
SWEEP_INTERVAL = 60.0
SWEEP_LIMIT = 25


@dataclass(frozen=True)
class Step:
    kind: str  # work | effect | plain (a fenced call without an intent: plain_calls)
    seconds: float = 0.0
    action: str = ""
    # widened world (shared_keys): a business intent key shared with other jobs, the
    # target and resource it acts on, and the amount in its payload ("": per job)
    key: str = ""
    target: str = ""
    resource: str = ""
    amount: int = 0
    # plain_calls: the call's body names the attempt, so a later attempt's repeat of
    # the key is refused 422 (the key was used with another body) instead of replayed
    per_attempt: bool = False


@dataclass(frozen=True)
class JobPlan:
    job_id: str
    submit_at: float
    steps: tuple[Step, ...]
    target: str  # "keyed" | "unkeyed"
    cooperative: bool  # polls its cancellation signal between steps
    p_transient: float
    p_permanent: float
    p_unknown: float
    job_class: str = "sim"  # mixed_versions: some jobs are of the class old workers lack
    producer_dies: bool = False  # producer_death: the record is written, the message never sent
    # concurrent_submits: more producers submit this job id, these seconds after the first
    extra_submits: tuple[float, ...] = ()
    result_bytes: int = 0  # oversize: the handler's result pads to this many bytes
    # staged: the job's stages in order, each (name, its steps); () for a job of one
    # stage (its ``steps``). A staged job's ``steps`` are all its stages' steps.
    stages: tuple[tuple[str, tuple[Step, ...]], ...] = ()

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.stages)


@dataclass(frozen=True)
class Widening:
    """The widened world of one run (all zero when no feature is on)."""

    features: frozenset[str] = frozenset()
    cut_response: float = 0.0  # per applied tool call: the answer is cut (IncompleteRead...)
    parse_bug: float = 0.0  # per successful tool call: the user's parsing raises
    txn_transient: float = 0.0  # per TransactWriteItems: cancelled for throttling/conflict
    old_workers: int = 0  # of the first workers, how many run the old app version
    deploy_at: float = 0.0  # when the old workers are replaced (graceful stop, new version)
    stray_messages: tuple[float, ...] = ()  # times a message names a job with the wrong class
    tool_work: float = 0.0  # shared_keys: a target takes up to this long to apply a call
    # unreadable_records: (when, for how long) a job record has a state no version knows
    unreadable: tuple[tuple[float, float], ...] = ()
    # staged: per continuation a job task sends, the chance its worker dies right
    # before that send (after the checkpoint), and right before the delete after it
    stage_death_before_send: float = 0.0
    stage_death_before_delete: float = 0.0


@dataclass(frozen=True)
class SweepPlan:
    """The stranded-record sweep of every simulated worker (issue 7 item 8): the real
    ``Worker``'s defaults (``sweep_interval``, ``sweep_grace``, ``sweep_limit``; a
    test keeps them in step). Simulated time runs in real seconds, so they apply as
    they are."""

    interval: float = SWEEP_INTERVAL
    grace: float = UNSENT_GRACE_SECONDS
    limit: int = SWEEP_LIMIT


@dataclass
class RunPlan:
    seed: int
    profile: str  # short | budget | long
    workers: int
    jobs: int
    cutoff: float
    max_time: float
    settle: float
    # job class
    lease: int
    heartbeat: float
    jitter: float
    progress_timeout: float | None  # the job class's no-progress limit (None: none)
    stage_budget: float
    max_attempts: int
    backoff_base: float
    backoff_max: float
    # workers
    concurrency: int
    receive_wait: int
    sdk_attempts: int
    read_timeout: float
    tool_http_timeout: float
    latency: tuple[float, float]
    # services
    sqs: SqsBehaviour
    max_receive: int
    ddb: DdbFaults
    targets: TargetFaults
    lost_response: float
    slow_call: float
    # faults
    fault_events: int
    fault_weights: dict[str, float] = field(default_factory=dict)
    job_plans: list[JobPlan] = field(default_factory=list)
    wide: Widening = field(default_factory=Widening)
    sweep: SweepPlan | None = None  # the workers' stranded-record sweep (None: off)
    fifo: fifo_world.FifoPlan | None = None  # issue 26: the fifo world (None: a standard queue)
    lambdas: Any = None  # lambda: the run's LambdaPlan (lambdas.py; None: no functions)
    clocks: _clocks.ClockPlan | None = None  # issue 26: clocks, backlog, dead_entries
    plans: Any = None  # plans: the drawn tools, limits and shells (planned.PlansDraw)


def serial_bound(plan: RunPlan, jobs: float, *, lanes: int = 1) -> float:
    """The drain's bound where ``jobs`` jobs' attempts queue one behind another on each
    of ``lanes`` lanes: a FIFO group runs its jobs in order, a Lambda poller a batch's
    records in order. ``plan.max_time`` counts each job as if it had a worker of its
    own; a world that queues jobs raises it to this (soak seeds 1045968, 1607424)."""
    per_attempt = plan.stage_budget + plan.lease + plan.backoff_max
    return plan.cutoff + jobs * (plan.max_attempts + 2) * per_attempt / lanes + 3600.0


def draw_plan(
    chaos: Chaos,
    *,
    workers: int | None = None,
    jobs: int | None = None,
    features: frozenset[str] | None = None,
) -> RunPlan:
    c = chaos
    # Most runs: leases of seconds, handlers of seconds to minutes. Some runs give
    # the stage a budget the longer handlers overrun (the watchdog must stop them);
    # a few run hours-long jobs with long leases, against the 12-hour cap.
    profile = c.choice(["short"] * 17 + ["budget"] * 2 + ["long"])
    n_workers = workers if workers is not None else c.randint(2, 4)
    if jobs is not None:
        n_jobs = jobs
    else:
        n_jobs = c.randint(1, 3) if profile == "long" else c.randint(3, 10)
    if profile == "long":
        lease = c.choice([600, 900])
        jitter = round(c.uniform(10.0, 60.0), 2)
    else:
        lease = c.choice([20, 30, 45, 60])
        jitter = round(c.uniform(1.0, 4.0), 2)
    # Timing rule: L > missed x H + J with missed = 3, and H <= L/2.
    heartbeat = round((lease - jitter) / c.uniform(3.6, 6.0), 2)
    calm = c.chance(0.15)  # some runs have no faults at all
    intensity = 0.0 if calm else c.uniform(0.3, 1.0)
    if profile == "long":
        cutoff = round(c.uniform(3600.0, 12 * 3600.0), 1)
        stage_budget = 43_200.0 - 900.0
        progress_timeout: float | None = None  # hours-long steps report no progress
    else:
        cutoff = round(c.uniform(90.0, 420.0), 1)
        stage_budget = round(lease * c.uniform(2.0, 6.0)) if profile == "budget" else 3600.0
        # Never above the stage budget (the job class refuses that).
        progress_timeout = min(c.choice([120.0, 240.0, 600.0]), stage_budget)
    plan = RunPlan(
        seed=chaos.seed,
        profile=profile,
        workers=n_workers,
        jobs=n_jobs,
        cutoff=cutoff,
        max_time=0.0,  # set below, from the attempts a job may need
        settle=90.0,
        lease=lease,
        heartbeat=heartbeat,
        jitter=jitter,
        progress_timeout=progress_timeout,
        stage_budget=stage_budget,
        max_attempts=c.randint(2, 3) if profile == "long" else c.randint(3, 6),
        backoff_base=round(c.uniform(0.5, 3.0), 2),
        backoff_max=c.choice([10.0, 30.0, 60.0]),
        concurrency=c.randint(2, 4) if profile == "long" else c.randint(1, 4),
        receive_wait=c.choice([5, 20, 20]),
        sdk_attempts=c.choice([1, 2, 2]),
        read_timeout=max(0.5, min(5.0, heartbeat)),
        tool_http_timeout=c.choice([5.0, 10.0, 30.0]),
        latency=(0.001, c.uniform(0.005, 0.05)),
        sqs=SqsBehaviour(
            stale_mode=c.choice(["moto", "aws"]),
            spelling=c.choice(["json", "query"]),
            expired_cmv=c.choice(["apply", "not_inflight"]),
            duplicate=intensity * c.uniform(0.0, 0.15),
        ),
        max_receive=c.choice([20, 50]),
        ddb=DdbFaults(
            idempotent_tokens=c.choice([True, False]),
            unprocessed=intensity * c.uniform(0.0, 0.3),
            throttle=intensity * c.uniform(0.0, 0.02),
        ),
        targets=TargetFaults(
            error_before=intensity * c.uniform(0.0, 0.05),
            error_after=intensity * c.uniform(0.0, 0.05),
            throttle=intensity * c.uniform(0.0, 0.03),
            cannot_tell=c.uniform(0.0, 0.3),
        ),
        lost_response=intensity * c.uniform(0.0, 0.02),
        slow_call=intensity * c.uniform(0.0, 0.02),
        fault_events=0 if calm else c.randint(1, max(2, min(40, int(intensity * cutoff / 20)))),
    )
    # The drain is bounded: every attempt a job may still need, each as long as the
    # stage may run (plus a lease and the backoff), then some slack.
    per_attempt = (
        stage_budget + lease + plan.backoff_max
        if profile != "short"
        else 6.0 * lease + plan.backoff_max + lease
    )
    plan.max_time = cutoff + (plan.max_attempts + 2) * max(per_attempt, 1800.0) + 3600.0
    plan.fault_weights = {
        "pause": c.uniform(0.5, 3.0),
        "crash": c.uniform(0.2, 1.5),
        "partition_both": c.uniform(0.5, 2.0),
        "partition_oneway": c.uniform(0.5, 2.0),
        "slow_window": c.uniform(0.2, 1.5),
        "shutdown": c.uniform(0.0, 0.8),
        "cancel": c.uniform(0.0, 0.5),
        "poison_message": c.uniform(0.0, 0.4),
    }
    for i in range(n_jobs):
        plan.job_plans.append(_draw_job(c, plan, f"job-{i:03d}"))
    allowed = frozenset(WIDE_FEATURES) if features is None else features
    _widen(c, plan, calm, allowed)
    _widen14(c, plan, calm, allowed)
    _dense(plan)
    _plain(c, plan, allowed)
    _staged(c, plan, allowed, force=fifo_world.forces_staged(plan.seed, allowed))
    fifo_world.draw(c, plan, allowed)  # issue 26, fifo
    _clocks.draw(plan, allowed)  # issue 26: its own stream
    from . import planned  # plans (planned.py imports this module)

    planned.draw(plan, allowed)
    _sweep(plan)
    from .lambdas import draw as _lambdas  # lambda (its module imports this one)

    _lambdas(c, plan, allowed)
    return plan


def _dense(plan: RunPlan) -> None:
    """shared_keys, one run in three: a busy shared resource (issue 7 item 3).

    Every job acts on one ledger resource with its own keys: its effects that have no
    business key move there, and each job appends one more effect there. Tokens
    order one job's owners only, so a fence kept per resource instead of per job
    refuses a job's live first attempt once another job's later attempt reached the
    resource (``fence_per_resource``); a correct fence never does. Drawn from its
    own stream, so every other run, and every other feature's draws, stay as they
    were.
    """
    if "shared_keys" not in plan.wide.features:
        return
    r = random.Random(f"dense-{plan.seed}")
    if r.random() >= 1 / 3:
        return
    target = r.choice(["keyed", "unkeyed"])
    resource = "ledger:shared"
    jobs = []
    for jp in plan.job_plans:
        steps = [
            replace(s, target=target, resource=resource) if s.kind == "effect" and not s.key else s
            for s in jp.steps
        ]
        ledger = Step("effect", action="ledger", target=target, resource=resource)
        steps[-1:-1] = [ledger]  # before the last work step
        jobs.append(replace(jp, steps=tuple(steps)))
    plan.job_plans = jobs


def _plain(c: Chaos, plan: RunPlan, allowed: frozenset[str]) -> None:
    """plain_calls (issue 14 item 3): handlers that also make fenced calls of their own,
    without an intent (``ctx.fence_headers(key)`` on their own HTTP request).

    About 3 jobs in 5 get, after each work step (7 in 10), a call to the keyed target
    under a key of their own that is stable across attempts (``plain:JOB:callN``): a
    later attempt repeating it gets the stored answer replayed, or, for 1 job in 5 whose
    body names the attempt, 422 (the key was used with another body). Nothing but the
    fence stops an older owner that has not yet learnt of a takeover from sending its
    *next* key: the target refuses it (412) only if the newer owner's replay or 422
    raised the job's mark. Drawn from its own stream (``plain-SEED``), whatever is
    allowed, so no other run's schedule, nor any other feature's draw, moved.
    """
    r = random.Random(f"plain-{plan.seed}")
    on = r.random() < 0.3
    picks = [
        (r.random() < 0.6, r.random() < 0.2, [r.random() < 0.7 for _ in jp.steps])
        for jp in plan.job_plans
    ]
    if not on or "plain_calls" not in allowed:
        return
    c.count("world_plain_calls")
    jobs = []
    for jp, (chosen, per_attempt, after) in zip(plan.job_plans, picks, strict=True):
        if not chosen:
            jobs.append(jp)
            continue
        steps: list[Step] = []
        for i, step in enumerate(jp.steps):
            steps.append(step)
            if step.kind == "work" and after[i]:
                steps.append(Step("plain", action=f"call{i}", per_attempt=per_attempt))
        jobs.append(replace(jp, steps=tuple(steps)))
    plan.job_plans = jobs
    plan.wide = replace(plan.wide, features=plan.wide.features | {"plain_calls"})


STAGE_NAMES = ("fetch", "transform", "upload", "notify", "archive")
"""The stages a staged simulated job may have, in order (the world draws a prefix of 2-4)."""


def _staged(c: Chaos, plan: RunPlan, allowed: frozenset[str], *, force: bool = False) -> None:
    """staged (issue 9): about a third of the runs make some jobs jobs of stages.

    About 2 jobs in 3 of such a run have their steps cut into 2-4 consecutive stages
    (``fetch``, ``transform``, ...; a job of one step stays a job of one stage):
    each stage's handler runs its own steps and ends with ``NextStage`` (the last
    with the job's result); its effects are keyed by job id + stage. While faults
    are on, a worker may die right after a stage's checkpoint (before the next
    stage's message is sent) or right after that send (before the old message is
    deleted), as the SIGKILL tests do on moto. Drawn from its own stream
    (``staged-SEED``), whatever is allowed, so no other run's schedule, nor any
    other feature's draw, moved. ``force``: the fifo world wants stages (its draws
    stay the staged stream's).
    """
    r = random.Random(f"staged-{plan.seed}")
    on = r.random() < 0.35 or force
    before_send = r.uniform(0.0, 0.2)
    before_delete = r.uniform(0.0, 0.15)
    picks = [(r.random() < 0.65, r.randint(2, 4), r.random()) for _ in plan.job_plans]
    if not on or "staged" not in allowed:
        return
    jobs = []
    staged = 0
    for jp, (chosen, n, salt) in zip(plan.job_plans, picks, strict=True):
        if not chosen or len(jp.steps) < 2 or jp.job_class != "sim":
            jobs.append(jp)
            continue
        n = min(n, len(jp.steps))
        cuts = sorted(random.Random(f"{salt}").sample(range(1, len(jp.steps)), n - 1))
        bounds = [0, *cuts, len(jp.steps)]
        stages = tuple((STAGE_NAMES[i], jp.steps[bounds[i] : bounds[i + 1]]) for i in range(n))
        jobs.append(replace(jp, stages=stages))
        staged += 1
    if not staged:
        return
    c.count("world_staged")
    plan.job_plans = jobs
    plan.wide = replace(
        plan.wide,
        features=plan.wide.features | {"staged"},
        stage_death_before_send=before_send,
        stage_death_before_delete=before_delete,
    )


def _sweep(plan: RunPlan) -> None:
    """The workers sweep stranded records where the world can strand one.

    The real worker always sweeps. Here it runs in the ``producer_death`` world (the
    producer also waits the real grace before taking over another submission's
    send, as ``submit_flow``'s default does); elsewhere it is off and the producer
    takes over at once, so the narrow world's schedules (and every seed pinned in
    it) stay byte for byte as they were: the sweep's calls would draw from the
    seed's stream and move them. The ``staged`` world needs it too: a continuation
    whose send failed (or whose worker died after the checkpoint) is recovered by
    the sweep and nothing else.
    """
    if plan.wide.features & {"producer_death", "staged", "dead_entries", "plans"}:
        plan.sweep = SweepPlan()


def _widen(c: Chaos, plan: RunPlan, calm: bool, allowed: frozenset[str]) -> None:
    """Draw the widened world from the second stream; mask what ``allowed`` leaves out.

    Everything is drawn whatever is allowed, so a feature's schedule does not depend
    on which other features a batch allows. Faults stay off in calm runs; the shapes
    (shared keys, mixed versions) do not.
    """
    w = c.wide
    on = {name: w.random() < 0.3 for name in ISSUE7_FEATURES}
    for name in ("cut_responses", "txn_transient", "producer_death"):
        on[name] = on[name] and not calm
    # shared_keys: business keys "payment:inv{k}:capture" on resource "invoice:inv{k}"
    n_keys = max(1, len(plan.job_plans) // 3)
    # Per invoice: its target, amount, and whether its jobs arrive together (one
    # business event fanned out to several jobs, a webhook delivered twice...).
    invoices = [
        (
            w.choice(["keyed", "unkeyed"]),
            w.randint(1, 9) * 100,
            round(w.uniform(0.0, 0.6 * plan.cutoff), 3),
            w.random() < 0.8,
        )
        for _ in range(n_keys)
    ]
    shared = [
        (
            w.randrange(n_keys) if w.random() < 0.75 else -1,
            w.randrange(1 << 16),
            w.random() < 0.5,  # its other effects act on the invoice's resource too
            w.random() < 0.1,  # another amount under the same key (a mismatch)
            round(w.uniform(0.0, 0.2), 3),  # arrival jitter when together
        )
        for _ in plan.job_plans
    ]
    tool_work = w.uniform(0.2, 3.0)
    cut_response = w.uniform(0.02, 0.2)
    parse_bug = w.uniform(0.0, 0.1)
    txn_transient = w.uniform(0.02, 0.15)
    old_workers = w.randint(1, max(1, plan.workers - 1))
    deploy_at = round(w.uniform(0.2, 0.9) * plan.cutoff, 3)
    strays = tuple(sorted(round(w.uniform(0.0, plan.cutoff), 3) for _ in range(w.randint(0, 3))))
    v2 = [w.random() < 0.5 for _ in plan.job_plans]
    dies = [w.random() < 0.25 for _ in plan.job_plans]

    features = frozenset(n for n in ISSUE7_FEATURES if on[n] and n in allowed)
    if "mixed_versions" in features and plan.workers < 2:
        features -= {"mixed_versions"}
    if not features:
        return
    for name in sorted(features):
        c.count(f"world_{name}")
    jobs = list(plan.job_plans)
    for i, jp in enumerate(jobs):
        changes: dict[str, object] = {}
        k, salt, whole, other_amount, jitter = shared[i]
        if "shared_keys" in features and k >= 0:
            target, amount, base, together = invoices[k]
            changes["steps"] = _share(
                jp.steps, k, target, amount, salt, whole, other_amount, together
            )
            if together:
                changes["submit_at"] = round(base + jitter, 3)
        if "mixed_versions" in features and v2[i]:
            changes["job_class"] = "sim-v2"
        if "producer_death" in features and dies[i]:
            changes["producer_dies"] = True
        if changes:
            jobs[i] = replace(jp, **changes)  # type: ignore[arg-type]
    plan.job_plans = jobs
    plan.wide = Widening(
        features=features,
        cut_response=cut_response if "cut_responses" in features else 0.0,
        parse_bug=parse_bug if "cut_responses" in features else 0.0,
        txn_transient=txn_transient if "txn_transient" in features else 0.0,
        old_workers=old_workers if "mixed_versions" in features else 0,
        deploy_at=deploy_at if "mixed_versions" in features else 0.0,
        stray_messages=strays if "mixed_versions" in features else (),
        tool_work=tool_work if "shared_keys" in features else 0.0,
    )


def _widen14(c: Chaos, plan: RunPlan, calm: bool, allowed: frozenset[str]) -> None:
    """Issue 14's features, from the third stream (``Chaos.wide14``): drawn whatever is
    allowed, after every other draw, so they change no schedule of the others."""
    w = c.wide14
    on = {name: w.random() < 0.3 for name in ISSUE14_FEATURES}
    # concurrent_submits: about half the jobs get 1-2 more producers (an upstream
    # source delivering its event twice), each a few milliseconds after the first
    extra = [
        tuple(round(w.uniform(0.0, 0.01), 4) for _ in range(w.randint(1, 2)))
        if w.random() < 0.5
        else ()
        for _ in plan.job_plans
    ]
    # operator_races: one or two attempts (parked on the last one is then common), and
    # a check that often cannot tell (parks are what the operator acts on)
    op_attempts = w.choice([1, 1, 2])
    op_cannot_tell = w.uniform(0.3, 0.8)
    unreadable = tuple(
        sorted(
            (
                round(w.uniform(0.1, 0.9) * plan.cutoff, 3),
                round(w.uniform(1.0, 3.0 * plan.lease), 3),
            )
            for _ in range(w.randint(1, 2))
        )
    )
    # oversize: one job returns a result just over the item limit (up to 100 KB over)
    big_job = w.randrange(len(plan.job_plans)) if plan.job_plans else 0
    big_bytes = w.randint(ITEM_LIMIT + 1, 500 * 1024)
    features = frozenset(n for n in ISSUE14_FEATURES if on[n] and n in allowed)
    if "operator_races" in features and calm:
        features -= {"operator_races"}  # nothing parks without faults
    if not features:
        return
    for name in sorted(features):
        c.count(f"world_{name}")
    if "concurrent_submits" in features:
        plan.job_plans = [
            replace(jp, extra_submits=extra[i]) if extra[i] else jp
            for i, jp in enumerate(plan.job_plans)
        ]
    if "oversize" in features and plan.job_plans:
        jobs = list(plan.job_plans)
        jobs[big_job] = replace(jobs[big_job], result_bytes=big_bytes)
        plan.job_plans = jobs
    if "operator_races" in features:
        plan.max_attempts = op_attempts
        plan.targets = replace(
            plan.targets, cannot_tell=max(plan.targets.cannot_tell, op_cannot_tell)
        )
    plan.wide = replace(
        plan.wide,
        features=plan.wide.features | features,
        unreadable=unreadable if "unreadable_records" in features else (),
    )


def _share(
    steps: tuple[Step, ...],
    k: int,
    target: str,
    amount: int,
    salt: int,
    whole: bool,
    other_amount: bool,
    together: bool,
) -> tuple[Step, ...]:
    """One effect of the job becomes the shared capture of invoice ``k``; with
    ``whole`` its other effects act on that invoice's resource too (own keys). Jobs
    that arrive together capture first, after a short step, so their starts race."""
    resource = f"invoice:inv{k}"
    capture = Step(
        "effect",
        action="capture",
        key=f"payment:inv{k}:capture",
        target=target,
        resource=resource,
        amount=amount + (1 if other_amount else 0),  # rarely: another payload, same key
    )
    effects = [i for i, s in enumerate(steps) if s.kind == "effect"]
    out = list(steps)
    if not effects:
        out += [capture, Step("work", round(0.05 + (salt % 100) / 40.0, 3))]
    else:
        out[effects[0] if together else effects[salt % len(effects)]] = capture
    if together:
        out[0] = Step("work", 0.05)
    if whole:
        out = [
            replace(s, target=target, resource=resource) if s.kind == "effect" and not s.key else s
            for s in out
        ]
    return tuple(out)


def _draw_job(c: Chaos, plan: RunPlan, job_id: str) -> JobPlan:
    steps: list[Step] = []
    n_effects = c.choice([0, 1, 1, 2, 2, 3])
    for i in range(n_effects + 1):
        r = c.random()
        if plan.profile == "long":
            secs = c.uniform(60.0, 13 * 3600.0 / (n_effects + 1))
        elif r < 0.6:
            secs = c.uniform(0.05, 5.0)
        elif r < 0.93:
            secs = c.uniform(plan.heartbeat, 3.0 * plan.lease)
        elif r < 0.98:
            secs = c.uniform(3.0 * plan.lease, 6.0 * plan.lease)
        else:  # a hung step: the watchdog must stop extending it
            secs = (plan.progress_timeout or plan.stage_budget) + c.uniform(10.0, 120.0)
        steps.append(Step("work", round(secs, 3)))
        if i < n_effects:
            steps.append(Step("effect", action=f"act{i}"))
    return JobPlan(
        job_id=job_id,
        submit_at=round(c.uniform(0.0, 0.6 * plan.cutoff), 3),
        steps=tuple(steps),
        target=c.choice(["keyed", "unkeyed"]),
        cooperative=c.chance(0.7),
        p_transient=c.choice([0.0, 0.1, 0.25]),
        p_permanent=c.choice([0.0, 0.0, 0.03]),
        p_unknown=c.choice([0.0, 0.0, 0.03]),
    )
