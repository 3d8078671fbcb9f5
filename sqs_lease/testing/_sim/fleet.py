"""A fleet: hundreds of workers on one queue and its tables, against AWS's limits.

Where a drawn world (plan.py) looks for a protocol's defects in a few jobs and many
faults, a fleet looks for what binds past one machine: a burst of jobs, each a real
``submit_flow`` and a real worker's attempt, on a queue and tables that carry what
AWS publishes (``capacity.py``: each partition's 1,000 write and 3,000 read units a
second, a table's warm throughput and its doubling every 30 minutes, an index key's
back-pressure; SQS's in-flight limit). Nothing else fails: no pause, crash or
partition, so what a fleet reports is the price of its size alone.

The invariant checker watches as in every world (no job lost, no effect applied
twice, nothing dead-lettered that a worker could have run); the report adds the
time to drain, the throttles by limit, the units each job cost and the busiest
second of each kind of partition. ``python -m simtools fleet`` runs it; the figures
are in docs/scale.md.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .capacity import Limits, Throughput
from .ddb import DdbFaults
from .plan import JobPlan, RunPlan, Step, SweepPlan
from .receiver import TargetFaults
from .resources import JOBS
from .sqs import SqsBehaviour

STANDARD_IN_FLIGHT = 120_000  # SQS: messages in flight per standard queue
"""AWS's in-flight limit of a standard queue (a FIFO queue's is 120,000 too since 2024)."""


EVENTS_PER_JOB = 400
"""A fleet's event budget per job: a job of a few seconds takes about 40 events, ten
times that covers a throttled fleet's retries and still ends a run that loops."""


@dataclass(frozen=True)
class FleetSpec:
    """One fleet: its size, its burst, its jobs and its table."""

    workers: int = 500
    jobs: int = 100_000
    burst: float = 60.0  # the jobs are submitted over this many seconds
    concurrency: int = 4  # jobs a worker runs at once
    work: tuple[float, float] = (1.0, 10.0)  # each job's work, seconds (uniform)
    effects: float = 0.5  # the share of jobs that make one fenced effect
    table: str = "new"  # "new": a new on-demand table's warm throughput; "quota": warmed
    in_flight_limit: int = STANDARD_IN_FLIGHT
    seed: int = 0
    lease: int = 30
    heartbeat: float = 5.0
    limits: Limits | None = None  # DynamoDB's limits (None: AWS's, warm as ``table`` says)


def plan(spec: FleetSpec) -> RunPlan:
    """The fleet's run: the real worker's defaults, no fault, the jobs in a burst."""
    r = random.Random(f"fleet-{spec.seed}")
    jitter = 1.0
    p = RunPlan(
        seed=spec.seed,
        profile="short",
        workers=spec.workers,
        jobs=spec.jobs,
        cutoff=spec.burst,
        max_time=spec.burst + 12 * 3600.0,
        settle=90.0,
        lease=spec.lease,
        heartbeat=spec.heartbeat,
        jitter=jitter,
        progress_timeout=600.0,
        stage_budget=3600.0,
        max_attempts=5,
        backoff_base=1.0,
        backoff_max=30.0,
        concurrency=spec.concurrency,
        receive_wait=20,
        sdk_attempts=3,
        read_timeout=5.0,
        tool_http_timeout=10.0,
        latency=(0.002, 0.02),
        sqs=SqsBehaviour(),
        max_receive=50,
        ddb=DdbFaults(),
        targets=TargetFaults(),
        lost_response=0.0,
        slow_call=0.0,
        fault_events=0,
    )
    lo, hi = spec.work
    for i in range(spec.jobs):
        first = Step("work", round(r.uniform(lo, hi) / 2, 3))
        steps: tuple[Step, ...] = (first,)
        if r.random() < spec.effects:
            steps += (Step("effect", action="act0"), Step("work", first.seconds))
        else:
            steps += (Step("work", first.seconds),)
        p.job_plans.append(
            JobPlan(
                job_id=f"job-{i:03d}",
                submit_at=round(r.uniform(0.0, spec.burst), 3),
                steps=steps,
                target="keyed",
                cooperative=True,
                p_transient=0.0,
                p_permanent=0.0,
                p_unknown=0.0,
            )
        )
    p.sweep = SweepPlan()  # the real worker sweeps stranded records
    return p


PRODUCER_BACKOFF = (0.5, 20.0)
"""A fleet's producers retry a failed submit as a user's loop would (and botocore's
standard mode does): full jitter, from 0.5 s doubling up to 20 s, never giving up."""


SDK_BACKOFF = (1.0, 20.0)
"""botocore's standard retry mode between a call's attempts: full jitter,
from 1 s doubling up to 20 s (the simulated SDK makes ``sdk_attempts`` in all)."""


def _backoff(r: random.Random, shape: tuple[float, float]) -> Callable[[int], float]:
    base, cap = shape

    def wait(tries: int) -> float:
        return r.uniform(0.0, min(cap, base * 2 ** min(max(0, tries - 1), 16)))

    return wait


@dataclass
class FleetReport:
    """What a fleet's run shows (``python -m simtools fleet`` prints it as JSON)."""

    spec: dict[str, Any]
    ok: bool
    violations: list[str]
    submitted: int
    finished: int
    states: dict[str, int]
    dead_lettered: int  # messages SQS moved to the dead-letter queue
    drained_at: float | None  # virtual seconds from the first submit to the last job's end
    events: int
    throttled: dict[str, int]
    units_per_job: dict[str, float]  # consumed units of each table and kind, per job
    busiest_second: dict[str, float]  # units in the busiest second, per bucket kind
    warmed: list[tuple[float, str, float, float]]
    sqs_calls_per_job: dict[str, float]
    producer_retries: int  # submits tried again after a failure (throttled, mostly)
    last_submit_at: float  # when the last job's submit succeeded (virtual seconds)
    over_limit: int  # receives SQS refused for its in-flight limit
    peak_in_flight: int
    injected: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run(spec: FleetSpec, *, mutation: str | None = None) -> FleetReport:
    """Run one fleet to its end (every job final, or the time bound) and report."""
    from .world import World

    if spec.table not in ("new", "quota"):
        raise ValueError(f"FleetSpec.table must be 'new' or 'quota', not {spec.table!r}")
    limits = spec.limits or Limits()
    if spec.table == "quota":  # a table already warmed to the account's quota
        limits = replace(limits, warm_write=limits.quota_write, warm_read=limits.quota_read)
    world = World(spec.seed, plan=plan(spec), mutation=mutation, trace=False)
    world.ddb.throughput = Throughput(limits)
    world.ddb.indexed = True
    world.sqs.indexed = True
    world.sqs.in_flight_limit = spec.in_flight_limit
    world.max_events = max(world.max_events, EVENTS_PER_JOB * spec.jobs)
    world.producer_backoff = _backoff(
        random.Random(f"fleet-producer-{spec.seed}"), PRODUCER_BACKOFF
    )
    world.sdk_backoff = _backoff(random.Random(f"fleet-sdk-{spec.seed}"), SDK_BACKOFF)
    result = world.run()
    n = max(1, spec.jobs)
    tp = world.ddb.throughput
    tp.fold()
    states: dict[str, int] = {}
    for jp in world.plan.job_plans:
        item = world.ddb.get(JOBS, {"job_id": {"S": jp.job_id}})
        s = "never written" if item is None else str(item["state"]["S"])
        states[s] = states.get(s, 0) + 1
    return FleetReport(
        spec=asdict(spec),
        ok=result.ok,
        violations=[f"{v.name}: {v.message}" for v in result.violations][:20],
        submitted=spec.jobs - states.get("never written", 0),
        finished=len(world.checker.final_jobs),
        states=dict(sorted(states.items())),
        dead_lettered=result.injected.get("redrive_dlq", 0),
        drained_at=None if world.done_at is None else round(world.done_at, 3),
        events=result.events,
        throttled=dict(sorted(tp.throttled.items())),
        units_per_job={k: round(v / n, 3) for k, v in sorted(tp.consumed.items())},
        busiest_second=dict(sorted(tp.hot.items())),
        warmed=tp.warmed,
        sqs_calls_per_job={k: round(v / n, 3) for k, v in sorted(world.sqs.calls.items())},
        producer_retries=result.injected.get("producer_retry", 0),
        last_submit_at=round(_last_submit(world), 3),
        over_limit=result.injected.get("sqs_over_limit", 0),
        peak_in_flight=world.sqs.peak_in_flight,
        injected=dict(sorted(result.injected.items())),
    )


def _last_submit(world: Any) -> float:
    """When the last job record was written (its ``created_at``, the producer's clock)."""
    offset = float(world.producer.wall() - world.now)
    made = [
        float(i["created_at"]["N"]) for i in world.ddb.items[JOBS].values() if "created_at" in i
    ]
    return max(made, default=offset) - offset


__all__ = ["STANDARD_IN_FLIGHT", "FleetReport", "FleetSpec", "plan", "run"]
