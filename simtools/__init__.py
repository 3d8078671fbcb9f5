"""The simulator's tooling (not shipped): run, soak and replay schedules, mutations.

``python -m simtools run|soak|replay`` from the repository's root (see
docs/simulation.md). The simulator itself (worlds, simulated SQS and DynamoDB,
plans, invariants) is ``sqs_lease.testing._sim``.
"""

from __future__ import annotations

from sqs_lease.testing._sim import RunResult, World

from .mutations import applied


def run_seed(
    seed: int,
    *,
    workers: int | None = None,
    jobs: int | None = None,
    mutation: str | None = None,
    trace: bool = False,
    features: frozenset[str] | None = None,
) -> RunResult:
    """Run one schedule, under ``mutation`` (a broken variant of the code) if named."""
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


__all__ = ["run_seed"]
