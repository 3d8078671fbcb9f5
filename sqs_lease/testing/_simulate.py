"""Your app's handlers under random fault schedules in the deterministic simulator."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from .._errors import ConfigError
from .._jobs import App
from ._sim.user import UserJob, UserJobs
from ._sim.world import RunResult, World

SIM_FEATURES = frozenset({"cut_responses", "txn_transient"})
"""The simulator's widened faults a user's run has besides the base world: a tool's
answer cut after it applied, and DynamoDB transactions cancelled for throttling."""


@dataclass(frozen=True)
class SeedFailure:
    """An invariant one schedule broke, and the call that replays it."""

    seed: int
    invariant: str
    at: float  # virtual seconds into the run
    message: str
    replay: str


@dataclass(frozen=True)
class SimulationReport:
    """What :func:`simulate` saw over its seeds."""

    seeds: int
    failures: tuple[SeedFailure, ...]
    injected: Mapping[str, int] = field(default_factory=dict)  # faults, over all seeds
    counts: Mapping[str, int] = field(default_factory=dict)  # takeovers, rejections, ...

    @property
    def ok(self) -> bool:
        return not self.failures

    def assert_ok(self) -> None:
        """Fail naming each broken invariant, its seed and the call that replays it."""
        if self.failures:
            lines = [
                f"seed {f.seed}: {f.invariant} at t={f.at:.3f}: {f.message}\n  replay: {f.replay}"
                for f in self.failures
            ]
            raise AssertionError(
                f"{len(self.failures)} of {self.seeds} simulated schedules broke an "
                "invariant:\n" + "\n".join(lines)
            )


def _user_jobs(app: App, jobs: Sequence[tuple[str, BaseModel | Mapping[str, Any]]]) -> UserJobs:
    if not jobs:
        raise ConfigError("simulate: jobs is empty; give (job class, payload) pairs to submit")
    out: list[UserJob] = []
    for name, payload in jobs:
        reg = app.get(name)
        if reg is None:
            known = ", ".join(sorted(app.classes)) or "none"
            raise ConfigError(f"simulate: unknown job class {name!r}; this app knows: {known}")
        if reg.stages is not None or reg.planned is not None:
            raise ConfigError(
                f"simulate: job class {name!r} is staged or planned; the simulator runs "
                "plain job classes only"
            )
        if reg.is_async:
            raise ConfigError(
                f"simulate: job class {name!r} has an async handler; the simulator runs "
                "sync handlers only"
            )
        model = (
            payload if isinstance(payload, BaseModel) else reg.job_class.validate_payload(payload)
        )
        out.append(UserJob(name, model))
    return UserJobs(app, tuple(out))


def _world(user: UserJobs, seed: int, workers: int | None, trace: bool) -> World:
    return World(
        seed, workers=workers, jobs=len(user.jobs), trace=trace, features=SIM_FEATURES, user=user
    )


def _replay_call(seed: int, workers: int | None) -> str:
    extra = "" if workers is None else f", workers={workers}"
    return f"sqs_lease.testing.replay(app, jobs, seed={seed}{extra})"


def simulate(
    app: App,
    jobs: Sequence[tuple[str, BaseModel | Mapping[str, Any]]],
    seeds: Sequence[int] | range,
    *,
    workers: int | None = None,
) -> SimulationReport:
    """Run your app's handlers through the deterministic simulator, one schedule per
    seed, and report every invariant a schedule broke with the call that replays it.

    Each run submits ``jobs`` (``(job class, payload)`` pairs) and runs 2-4 simulated
    workers (``workers`` to fix it) whose handlers are **your** handlers, called with
    a real :class:`~sqs_lease.JobContext`. A failure is reproducible: the same seed
    gives the same schedule (:func:`replay` prints its event log).

    What the simulated world covers: the toolkit's real core flows (claim,
    heartbeat, commit, retry, park, release, the effect flow with its
    reconciliation) on a virtual clock, against a simulated SQS and DynamoDB
    (lost and slow answers, throttled and cancelled transactions, SQS's
    at-least-once delivery) and simulated fenced targets (a call applied and its
    answer lost, a target failing, a stale token refused), with workers paused,
    crashed, partitioned, shut down, clocks drifting, jobs cancelled and poison
    messages. The lease timing (lease, heartbeat, jitter, attempts, budgets) is
    drawn from each seed, not taken from your job classes, so seeds explore
    timings around yours.

    What it does not cover: your tool functions are **not** called. Each
    ``ctx.effect`` runs the real effect flow, but its tool call goes to a
    simulated fenced target (one that keeps idempotency keys when your target
    declares ``key_retention_seconds``, else one that does not; reconciled by the
    target's own answer when your target declares a ``check``), so
    ``EffectResult.response`` is that target's answer, not your tool's. Handlers
    must be deterministic (no wall clock, randomness or I/O of their own) and
    sync; ``ctx.wait`` sleeps in simulated time; staged and planned classes, fleet
    limits, groups and FIFO queues are not simulated. The invariants are the
    protocol's (no effect applied twice by a target, no stale write accepted, no
    result committed by a superseded owner, every job ending, ...), not your
    business rules.
    """
    user = _user_jobs(app, jobs)
    failures: list[SeedFailure] = []
    injected: dict[str, int] = {}
    counts: dict[str, int] = {}
    n = 0
    for seed in seeds:
        n += 1
        result = _world(user, seed, workers, trace=False).run()
        for k, v in result.injected.items():
            injected[k] = injected.get(k, 0) + v
        for k, v in result.counts.items():
            counts[k] = counts.get(k, 0) + v
        failures.extend(
            SeedFailure(seed, v.name, v.time, v.message, _replay_call(seed, workers))
            for v in result.violations
        )
    return SimulationReport(n, tuple(failures), injected, counts)


def replay(
    app: App,
    jobs: Sequence[tuple[str, BaseModel | Mapping[str, Any]]],
    seed: int,
    *,
    workers: int | None = None,
    echo: bool = True,
) -> RunResult:
    """Run one seed's schedule again with its full event log (printed with ``echo``):
    what :func:`simulate` names as the replay of a failure."""
    result = _world(_user_jobs(app, jobs), seed, workers, trace=True).run()
    if echo:
        for line in result.render_log():
            print(line)
        for v in result.violations:
            print(f"VIOLATION {v.name} at t={v.time:.3f}: {v.message}")
    return result
