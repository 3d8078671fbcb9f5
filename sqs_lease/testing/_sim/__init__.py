"""Deterministic simulation of the protocol (private): see docs/simulation.md.

Its tooling (the run/soak/replay command line, the mutations) is ``simtools`` in the
repository: users do not need it, so the wheel does not ship it.

Runs the real core flows for many simulated workers against simulated SQS,
DynamoDB and fenced receivers on a virtual clock, with faults drawn from a seed,
and checks the protocol's invariants after every step.
"""

from __future__ import annotations

from .invariants import INVARIANTS, Violation
from .world import RunResult, World


def run_seed(
    seed: int,
    *,
    workers: int | None = None,
    jobs: int | None = None,
    mutation: str | None = None,
    trace: bool = False,
    features: frozenset[str] | None = None,
) -> RunResult:
    """Run one schedule and return what happened.

    ``features`` limits the widened world (``plan.WIDE_FEATURES``; None: all of them).
    ``mutation`` only names the variant in the result: the mutations themselves (and
    the run/soak/replay command line) are the project's tooling, ``simtools`` in the
    repository, not shipped: ``simtools.run_seed`` applies one around this call.
    """
    # The collector's thresholds are the process's, not ours: tuning them for speed
    # is opt-in at the simulator's command line (simtools.cli.tuned_gc), never here.
    world = World(
        seed,
        workers=workers,
        jobs=jobs,
        mutation=mutation,
        trace=trace,
        features=features,
    )
    return world.run()


__all__ = ["INVARIANTS", "RunResult", "Violation", "World", "run_seed"]
