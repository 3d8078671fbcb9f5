"""Where each mutation is first caught: one search for the long mutation check and for
``python -m simtools mutations`` (which prints the seeds to pin).

``make test`` replays each mutation at its pinned seed only (``CAUGHT_AT`` in
``tests/test_sim_mutations.py``): the mutated protocol must break the expected
invariant there and the real protocol must pass it. The search below, over up to
``SEED_LIMIT`` seeds per mutation, runs in ``make soak`` (pytest marker ``long``); a
change to the protocol's call pattern moves schedules, and with them where each
mutation is first caught: then re-run the search and re-pin.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqs_lease.testing._sim.chaos import Chaos
from sqs_lease.testing._sim.plan import PASSING_FEATURES, draw_plan

from . import run_seed
from .mutations import WITHOUT, WORLDS

SEED_LIMIT = 200
"""Each mutation must be caught within this many seeds of its search."""

FIRST_SEED = {
    "shared_request_tokens": 400,
    "wall_clock_fence": 300,
    "resume_under_count": 1113879,  # found by the fresh-range soak (acb3cec)
    "unconfirmed_lease_given_up": 777600,
    "retention_across_clocks": 500,
    "retention_on_wall": 1041500,
    "sweep_blind_ahead": 1469800,  # found by the fresh-range soak (7640942)
    "repeat_judged_at_check": 1593800,  # found by the fresh-range soak (f9432d7)
}
"""Where a mutation's search starts (else 0). Two owners writing one attempt of a job
on a table that honours request tokens is a rare schedule: since the claim sends no
visibility change (issue 12) the first seed to draw it for shared_request_tokens is
above 400 (a search of seeds 200-999 on 78d16e8 found 435). A commit fenced on the
wall clock is caught only where clocks drift across a takeover with a late commit:
since every widened feature joined the mutation world, seeds 0-299 show none (the
first is 355; with the plans world of issue 26, 329). A decision run again after its
job ran again and went ambiguous again needs an operator who dies after the first
half of a resolve, a resumed attempt that reaches the target and a second ambiguity,
all before the re-run: the soak found the first at seed 57932. An attempt that gives
itself up at an unanswered heartbeat is caught only where a transient cancel comes
just before it with the lease still running (I8): seeds 0-199 show none; the fresh-
range soak of issue 34 found 777674. A repeat past a key the target forgot needs a
lagging clock on the reconciling worker and a takeover of an in-progress intent: since
the duplicate rule (issue 26) a takeover waits for the owner's liveness to stop, and
seeds 0-575 of the clocks world show none (the first is 576). A repeat judged on one
worker's wall clock read twice needs that clock stepped back (or drifting slow) between
its first start and a "not applied" check past the target's retention: seeds 0-599 of
the clocks world show none; the merged worlds' soak found 1041578."""

__all__ = ["FIRST_SEED", "SEED_LIMIT", "Catch", "first_catch", "search_seeds", "world"]


def world(name: str) -> frozenset[str]:
    """The features a mutation runs with: the passing world plus what exposes it (less
    what moves its pinned case away, ``mutations.WITHOUT``)."""
    return (PASSING_FEATURES | WORLDS.get(name, frozenset())) - WITHOUT.get(name, frozenset())


def search_seeds(name: str) -> list[int]:
    """The seeds a mutation's search runs, in order. A mutation that needs a feature
    beyond ``PASSING_FEATURES`` is only exposed by it: seeds that do not draw it are
    the fixed-seed batch's, skipped."""
    features = world(name)
    own = features - PASSING_FEATURES
    start = FIRST_SEED.get(name, 0)
    return [
        s
        for s in range(start, start + SEED_LIMIT)
        if not own or own <= draw_plan(Chaos(s), features=features).wide.features
    ]


@dataclass
class Catch:
    """The first seed that caught a mutation, and what the real protocol did there."""

    name: str
    seed: int | None = None
    violation: str | None = None
    message: str = ""
    protocol_fails: list[int] = field(default_factory=list)
    """Seeds up to the catch that the unmutated protocol fails (must be none)."""


def first_catch(name: str) -> Catch:
    """Search ``name``'s seeds in order; run the unmutated protocol on each seed up to
    the first one that catches it."""
    features = world(name)
    seeds = search_seeds(name)
    found = Catch(name)
    for seed in seeds:
        result = run_seed(seed, mutation=name, features=features)
        if not result.ok:
            first = result.violations[0]
            found.seed, found.violation, found.message = seed, first.name, first.message
            break
    if found.seed is not None:
        found.protocol_fails = [
            s for s in seeds if s <= found.seed and not run_seed(s, features=features).ok
        ]
    return found
