"""What a run looks like, drawn from its seed: sizes, timing, service quirks, faults, jobs."""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Step:
    kind: str  # work | effect
    seconds: float = 0.0
    action: str = ""


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


def draw_plan(chaos: Chaos, *, workers: int | None = None, jobs: int | None = None) -> RunPlan:
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
    return plan


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
