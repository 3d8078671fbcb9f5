"""Clocks, backlogs and dead index entries (issue 26): three features of the widened world.

- ``clocks``: every actor (each worker process, the producer, the operator) has a
  wall clock off by minutes to hours, drifting (up to NTP's 500 ppm slew), and on
  some seeds a worker's clock steps mid-run (an NTP correction). The targets keep
  idempotency keys for a retention drawn to the run's scale (tens of seconds to
  minutes, as a real target's day is to a real run), forget them after it, and their
  reconciliation check, a lookup by key, forgets them too: a repeat outside the
  retention is no longer protected. docs/protocol.md promises that no decision
  compares two machines' clocks; here a decision that did would repeat an effect
  (``I2``) or lose a job.
- ``backlog``: some jobs' first messages waited hours to 13 days in the queue before
  the run (an outage; SQS keeps messages 14 days): their SentTimestamp is that old,
  their first receive is now. SQS's 12-hour cap counts from the receive; an attempt
  charged for the stage budget before its budget ran from its receive breaks
  :data:`I25` (a backlogged job would fail for work that never ran).
- ``dead_entries``: an older version's cancels of never-sent records left many
  entries in the ``unsent`` index (more than one sweep's pages hold), all older than
  any record of the run, and one or two jobs of the run are stranded behind them
  (their producer died before the send): the sweep must page past what it cannot
  act on, or the stranded jobs are never sent (``I10``).

Each is drawn from its own stream (``clocks-SEED``), whatever the run allows, so a
seed with the three off runs byte for byte as before.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..._core.sweeping import SWEEP_PAGES
from ..._jobs import canonical_json, payload_hash

if TYPE_CHECKING:
    from .plan import RunPlan
    from .tasks import Actor
    from .world import World

CLOCK_FEATURES = ("clocks", "backlog", "dead_entries")

I25 = "I25_charged_before_budget"
I25_TEXT = (
    "no attempt charged for the stage budget before its budget ran from its receive "
    "(a backlog's age is not the job's)"
)

DEAD_PREFIX = "outage-"
"""The ids of the dead entries' records (not jobs of the run: the checker skips them)."""

DAY = 86_400.0
MAX_SKEW = 4 * 3600.0  # a wall clock off by up to four hours
MAX_DRIFT = 500e-6  # NTP slews at most 500 ppm
MAX_BACKLOG = 13 * DAY  # SQS keeps a message 14 days


@dataclass(frozen=True)
class Skew:
    """One actor's wall clock against true time: ``offset`` at ``t0``, ``drift`` seconds
    per second after it, and a ``step`` (NTP's correction) from ``step_at`` on."""

    offset: float
    drift: float = 0.0
    step_at: float = math.inf
    step: float = 0.0
    t0: float = 0.0

    def at(self, t: float) -> float:
        return self.offset + self.drift * (t - self.t0) + (self.step if t >= self.step_at else 0.0)


@dataclass(frozen=True)
class ClockPlan:
    """What the three features drew for one run (``features``: the ones on)."""

    features: frozenset[str] = frozenset()
    seed: int = 0
    skew_max: float = 0.0  # clocks: an actor's offset is within +- this
    step_chance: float = 0.0  # clocks: the chance a worker's clock steps mid-run
    key_retention: float | None = None  # clocks: how long the targets keep keys
    backlog: Mapping[str, float] = field(default_factory=dict)  # job -> age at t=0
    dead: int = 0  # dead_entries: how many the older version left
    stranded: tuple[str, ...] = ()  # dead_entries: jobs whose producer dies before the send


def draw(plan: RunPlan, allowed: frozenset[str]) -> None:
    """Draw the three features from their own stream (``clocks-SEED``) and apply what is
    allowed to ``plan`` (its jobs, ``plan.clocks``, ``plan.wide.features``)."""
    r = random.Random(f"clocks-{plan.seed}")
    # One run in about three is an outage's: each of the three features is on in it
    # with 3 chances in 5 (at least one), so each is on in about one run in five.
    outage = r.random() < 0.3
    picks = [r.random() < 0.6 for _ in CLOCK_FEATURES]
    if not any(picks):
        picks[r.randrange(len(picks))] = True
    on = {name: outage and pick for name, pick in zip(CLOCK_FEATURES, picks, strict=True)}
    skew_max = math.exp(r.uniform(math.log(120.0), math.log(MAX_SKEW)))
    step_chance = r.choice([0.0, 0.3, 0.6])
    # Tens of seconds to minutes: to a run of minutes what a target's day is to a real run.
    retention = round(r.uniform(0.2, 2.0) * plan.lease, 1)
    # Answers lost after the target applied: the in-progress intents a takeover
    # reconciles, where a retention read on two clocks would decide a repeat.
    lost_answers = r.uniform(0.05, 0.15)
    # A backlog: about half the jobs waited, from an hour to 13 days (log-uniform).
    ages = {
        jp.job_id: round(math.exp(r.uniform(math.log(3600.0), math.log(MAX_BACKLOG))), 3)
        for jp in plan.job_plans
        if r.random() < 0.5
    }
    arrive = {jp.job_id: round(r.uniform(0.0, 5.0), 3) for jp in plan.job_plans}
    # More dead entries than one sweep's pages hold, on some seeds
    dead = r.randint(plan_limit(plan) + 1, 3 * SWEEP_PAGES * plan_limit(plan) // 2)
    pick = [jp.job_id for jp in plan.job_plans if r.random() < 0.3]
    if not pick and plan.job_plans:
        pick = [plan.job_plans[r.randrange(len(plan.job_plans))].job_id]
    features = frozenset(n for n in CLOCK_FEATURES if on[n] and n in allowed)
    if "backlog" in features and not ages:
        features -= {"backlog"}
    if "dead_entries" in features and not pick:
        features -= {"dead_entries"}
    if not features:
        return
    jobs = []
    for jp in plan.job_plans:
        changes: dict[str, Any] = {}
        if "backlog" in features and jp.job_id in ages:
            changes["submit_at"] = arrive[jp.job_id]  # waiting when the run starts
        if "dead_entries" in features and jp.job_id in pick:
            changes["producer_dies"] = True
        jobs.append(replace(jp, **changes) if changes else jp)
    plan.job_plans = jobs
    if "clocks" in features:
        plan.lost_response = max(plan.lost_response, lost_answers)
    plan.clocks = ClockPlan(
        features=features,
        seed=plan.seed,
        skew_max=skew_max if "clocks" in features else 0.0,
        step_chance=step_chance if "clocks" in features else 0.0,
        key_retention=retention if "clocks" in features else None,
        backlog=ages if "backlog" in features else {},
        dead=dead if "dead_entries" in features else 0,
        stranded=tuple(pick) if "dead_entries" in features else (),
    )
    plan.wide = replace(plan.wide, features=plan.wide.features | features)


def plan_limit(plan: RunPlan) -> int:
    from .plan import SWEEP_LIMIT

    return plan.sweep.limit if plan.sweep is not None else SWEEP_LIMIT


class Clocks:
    """The three features at run time, for one world (inert when none is on)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.plan: ClockPlan = world.plan.clocks or ClockPlan()
        self.on = self.plan.features
        for name in sorted(self.on):
            world.chaos.count(f"world_{name}")  # (a count, no draw)
        self._r = random.Random(f"clocks-run-{self.plan.seed}")
        self._backdated: set[str] = set()
        # I25: (job, token) -> when the receive of the delivery that claimed that token
        # left (true time), and its worker's lease-clock rate
        self._received: dict[tuple[str, int], tuple[float, float]] = {}

    # ------------------------------------------------------------------ clocks

    def attach(self, actor: Actor, *, steps: bool = False) -> None:
        """Give ``actor`` its own wall clock (``clocks``); ``steps``: it may step mid-run."""
        if "clocks" not in self.on:
            return
        r, p, now = self._r, self.plan, self.world.now
        offset = r.choice([-1.0, 1.0]) * math.exp(r.uniform(math.log(30.0), math.log(p.skew_max)))
        drift = r.uniform(-MAX_DRIFT, MAX_DRIFT)
        step_at, step = math.inf, 0.0
        if steps and r.random() < p.step_chance:
            step_at = now + r.uniform(0.0, self.world.plan.cutoff)
            # NTP puts a wrong clock right: most steps undo the offset, some overshoot
            step = -offset * r.uniform(0.5, 1.5)
        actor.clock = Skew(round(offset, 3), drift, step_at, round(step, 3), now)
        if self.world.chaos.active:
            self.world.chaos.count("clock_skew")
        self.world.record(
            actor.id,
            "clock_drawn",
            {
                "offset": round(offset, 3),
                "drift_ppm": round(drift * 1e6, 1),
                "step_at": None if math.isinf(step_at) else round(step_at, 3),
                "step": round(step, 3),
            },
        )

    @property
    def key_retention(self) -> float | None:
        """How long the targets keep keys (None: as the narrow world, for good)."""
        return self.plan.key_retention

    # ------------------------------------------------------------------ backlog

    def sent_before(self, body: str) -> float:
        """How long before now a message with ``body`` was sent: a backlogged job's
        first message waited its age (once per job); any other, not at all."""
        if not self.plan.backlog:
            return 0.0
        for job_id, age in self.plan.backlog.items():
            if job_id not in self._backdated and f'"job_id":"{job_id}"' in body:
                self._backdated.add(job_id)
                if self.world.chaos.active:
                    self.world.chaos.count("backlogged_message")
                self.world.record("sqs", "backlogged", {"job_id": job_id, "age": age})
                return age
        return 0.0

    def delivered(self, worker: Actor, received_mono: float, origin: Any) -> None:
        """A job task of ``worker`` took a delivery received at ``received_mono`` on its
        lease clock (before its ReceiveMessage left): that moment in true time, kept on
        the task's ``origin`` until its claim names the token (I25)."""
        if "backlog" not in self.on:
            return
        true = worker.t0 + (received_mono - worker.mono0) / worker.rate
        origin.received = (true, worker.rate)

    def charged(self, old: Mapping[str, Any] | None, new: Mapping[str, Any], origin: Any) -> None:
        """I25: an attempt charged for the stage budget (its record leaves ``running``
        under the same token, error ``stage_budget_exceeded``) ran its stage budget
        from its receive, less one lease (the watchdog stops a lease short of it), on
        its worker's lease clock (its rate).

        The receive is the one of the delivery that claimed the charged token (a claim
        write of a job task names it), never the worker's latest delivery of the job:
        a duplicate or stray of the same message to the same worker (deferred to its
        live owner, or a stray) comes later, while the attempt still runs on its own."""
        if "backlog" not in self.on or old is None or origin is None:
            return
        job_id = str(new["job_id"]["S"])
        token = int(new.get("token", {}).get("N", 0))
        if (
            new.get("state", {}).get("S") == "running"
            and token != int(old.get("token", {}).get("N", 0))
            and getattr(origin, "received", None) is not None
        ):
            self._received[(job_id, token)] = origin.received  # a claim
            return
        if new.get("error_code", {}).get("S") != "stage_budget_exceeded":
            return
        if old.get("state", {}).get("S") != "running" or new.get("state", {}).get("S") not in (
            "queued",
            "failed",
        ):
            return
        seen = self._received.get((job_id, int(old.get("token", {}).get("N", 0))))
        if seen is None:
            return
        received, rate = seen
        p = self.world.plan
        held = self.world.now - received
        need = (p.stage_budget - p.lease) / rate - 1.0
        if held < need:
            checker = self.world.checker
            checker.now = self.world.now
            age = self.plan.backlog.get(job_id)
            checker.fail(
                I25,
                f"{job_id} charged for its stage budget by {origin.worker} {held:.0f} s after "
                f"its message's receive (budget {p.stage_budget:.0f} s"
                + (f"; its first message waited {age:.0f} s in a backlog" if age else "")
                + ")",
            )

    # ------------------------------------------------------------------ dead entries

    def outside(self, new: Mapping[str, Any] | None, old: Mapping[str, Any] | None) -> bool:
        """A write of a dead entry's record (not a job of the run: not the checker's)."""
        if not self.plan.dead:
            return False
        item = new if new is not None else old
        job_id = item.get("job_id", {}).get("S", "") if item is not None else ""
        return str(job_id).startswith(DEAD_PREFIX)

    def leave_dead_entries(self) -> None:
        """dead_entries: what an older version's cancels left before the run: records
        ``failed`` (cancelled) that never had a message and are still in the ``unsent``
        index, dated a day to a week before the run (older than any record of it).
        Written around the workers, as an outside writer would (nothing checks them)."""
        n = self.plan.dead
        if not n:
            return
        from .resources import EPOCH_S, JOBS

        w = self.world
        ddb, req = w.ddb, w.jobs_req
        saved, ddb.on_write = ddb.on_write, None
        try:
            for i in range(n):
                job_id = f"{DEAD_PREFIX}{i:04d}"
                since = round(EPOCH_S - self._r.uniform(1.0, 7.0) * DAY, 3)
                text = canonical_json({"n": i})
                put = req.put_new(
                    job_id=job_id,
                    job_class=w.job_class.name,
                    payload_json=text,
                    payload_hash=payload_hash(text),
                    wall_now=since,
                    send_id=f"{job_id}.1",
                )
                # (straight to the table: no fault, no draw from the run's streams)
                ddb.now = w.now
                ddb._op_PutItem(put.params, None)
                cancel = req.cancel(job_id, "cleanup after the outage", since + 60.0)
                ddb._op_UpdateItem(cancel.params, None)
                key = ddb.key_of(JOBS, {"job_id": {"S": job_id}})
                item = dict(ddb.items[JOBS][key])
                # the older version's cancel kept the index's attributes
                item.update(
                    unsent={"S": put.params["Item"]["unsent"]["S"]},
                    unsent_since={"N": repr(since)},
                    message_sent={"BOOL": False},
                )
                ddb.items[JOBS][key] = item
        finally:
            ddb.on_write = saved
        if w.chaos.active:
            w.chaos.count("dead_entries", n)
        w.record("world", "dead_entries", {"count": n})


__all__ = ["CLOCK_FEATURES", "I25", "ClockPlan", "Clocks", "Skew", "draw"]
