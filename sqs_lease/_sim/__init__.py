"""Deterministic simulation of the protocol (private): see docs/simulation.md.

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
    """Run one schedule (optionally under a mutation) and return what happened.

    ``features`` limits the widened world (``plan.WIDE_FEATURES``; None: all of them).
    """
    from .mutations import applied

    # The collector's thresholds are the process's, not ours: tuning them for speed
    # is opt-in at the simulator's command line (cli.tuned_gc), never here.
    with applied(mutation):
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
