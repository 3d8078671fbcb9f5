"""Directed worlds for the soak-found cases whose seeds no longer draw them
(``tests/sim_repin.py``): one seeded world with a few knobs set on it before it runs,
so the rare case happens every time, as ``tests/test_sim_deadletter.py`` does.

Each case has two tests: the real protocol passes the world and the case really
occurred there (its journal events, or the book's state when it occurred), and the
mutation that puts the old protocol back is caught with the expected invariant. The
world's schedule is the seed's; the knobs only add what the soak's rare draw had
(a copy of a message, a pause at one instant, a slower network)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from simtools.mutations import applied
from sqs_lease.testing._sim.invariants import I24
from sqs_lease.testing._sim.plan import Step
from sqs_lease.testing._sim.planned import P1
from sqs_lease.testing._sim.world import RunResult, World

PLANS = frozenset({"plans"})

Entry = tuple[str, str, Any]


def _on_record(w: World, hook: Callable[[str, str, Any], None]) -> None:
    """Call ``hook`` after every entry the world records (the world looks its
    ``record`` up at each entry, so the wrapper sees them all)."""
    record = w.record

    def recorded(who: str, kind: str, data: Any) -> None:
        record(who, kind, data)
        hook(who, kind, data)

    w.record = recorded  # type: ignore[method-assign]


@contextmanager
def _world(seed: int, mutation: str | None, *, workers: int, jobs: int) -> Iterator[World]:
    """The plans world of ``seed`` with ``workers`` and ``jobs``, no drawn fault, the
    mutation applied while it is built and run."""
    with applied(mutation):
        w = World(seed, trace=True, features=PLANS, mutation=mutation, workers=workers, jobs=jobs)
        w.plan.fault_events = 0  # only the directed case's own disturbance
        yield w


# --------------------------------------------------------------------------- own_claim_unseen
# Soak seeds 1040258, 1045173 (issue 26's merged worlds): an attempt's claim landed and
# it was still taking its plan's slots (seconds, under a slow network) when a copy of
# the message reached another attempt of the same worker; the copy's claim found the
# record running under its own worker and asked the book, which held nothing yet, and
# took the job over from its live attempt. The book knows a claim from its write to its
# hold (``LeaseBook.owns``): the copy is deferred.
#
# The directed world: seed 2's plans world with one worker (two slots) and one job,
# whose only stage calls ``mail`` (limit 1) for 5 s; every receive leaves a copy behind (SQS's
# at-least-once, until the first copy is deferred) and each call takes 0.2-0.4 s, so
# the copy's claim meets the record while the first attempt is taking its slot.

OWN_SEED = 2


def _own_claim(mutation: str | None = None) -> tuple[RunResult, list[bool]]:
    pending: list[bool] = []  # per copy deferred: the first attempt claimed, not held
    with _world(OWN_SEED, mutation, workers=1, jobs=1) as w:
        (job,) = w.plan.job_plans
        steps = (Step("work", 5.0),)  # not the seed's hung step: the job can end
        job = replace(job, stages=(("1-mail", steps),), steps=steps)
        w.plan.job_plans, w.job_plans = [job], {job.job_id: job}
        w.sqs.behaviour = replace(w.sqs.behaviour, duplicate=1.0)
        w.plan.latency = (0.2, 0.4)

        def deferred(who: str, kind: str, data: Any) -> None:
            if kind != "claim_deferred" or data.get("owner") != who or pending:
                return
            book = w.workers[who].book
            mono = w.workers[who].mono()
            job_id, token = data["job_id"], data["token"]
            pending.append(
                book.claim_pending(job_id, token, mono) and not book.holds_open(job_id, token, mono)
            )
            w.sqs.behaviour = replace(w.sqs.behaviour, duplicate=0.0)  # one copy is the case

        _on_record(w, deferred)
        return w.run(), pending


def test_a_copy_reaching_its_own_worker_before_the_first_attempt_holds_is_deferred() -> None:
    result, pending = _own_claim()
    assert result.ok, result.violations[:1]
    # the copy was deferred while the first attempt had claimed the job and held it not yet
    assert pending == [True], "the directed world no longer draws a copy in the window"
    # and the first attempt, left its job, committed it
    tokens = [e[3]["token"] for e in result.log if e[2] == "result_committed"]
    assert tokens == [1], tokens


def test_the_same_worker_branch_asking_only_the_held_leases_is_caught() -> None:
    result, _ = _own_claim("own_claim_unseen")
    assert result.violations and result.violations[0].name == I24
    assert "from its live owner w1" in result.violations[0].message


# --------------------------------------------------------------------------- handler_starts_lapsed
# Soak seed 1105530: job-000's attempt held a lease already run out when its handler was
# to start (there, a claim made after the receive's visibility lapsed); meanwhile a copy
# of its message took the job over and job-001 took the slot of the tool ``mail``
# (limit 1), and job-000's stale attempt started its tool beside job-001 (P1). An
# attempt whose lease ran out before its handler starts hands the job back uncharged
# and starts nothing (``LeaseBook.lapsed_before_start``).
#
# The directed world: seed 2's plans world with two workers and two jobs, both calling
# ``mail`` first (job-000 for 2 s, job-001 for 120 s). The worker whose slot take of
# ``mail`` lands first is paused right then for 60 s (a stop-the-world pause between the
# slot and the handler's start): its lease runs out, the other worker takes job-000 over
# and finishes it, and job-001 takes the slot and runs while the paused attempt wakes.

LAPSED_SEED = 2
PAUSE = 60.0


def _lapsed(mutation: str | None = None) -> tuple[RunResult, list[tuple[str, float]]]:
    paused: list[tuple[str, float]] = []  # (worker, when it resumes)
    with _world(LAPSED_SEED, mutation, workers=2, jobs=2) as w:
        first, second = w.plan.job_plans
        short, long = (Step("work", 2.0),), (Step("work", 120.0),)
        first = replace(first, stages=(("1-mail", short),), steps=short)
        stages = (("1-mail", long), *second.stages[1:])
        second = replace(second, stages=stages, steps=tuple(s for _, st in stages for s in st))
        w.plan.job_plans = [first, second]
        w.job_plans = {jp.job_id: jp for jp in (first, second)}

        def slot_taken(who: str, kind: str, data: Any) -> None:
            if paused or who != "aws" or kind != "UpdateItem" or data.get("out") != "ok":
                return
            if str(data.get("key", "")).startswith("class:sim:mail#"):
                worker = w.workers[data["from"]]
                worker.paused_until = w.now + PAUSE
                paused.append((worker.id, worker.paused_until))

        _on_record(w, slot_taken)
        return w.run(), paused


def test_a_handler_whose_lease_ran_out_before_it_started_never_starts() -> None:
    result, paused = _lapsed()
    assert result.ok, result.violations[:1]
    assert len(paused) == 1
    who, resumed = paused[0]
    late = [
        (t, e)
        for t, w, kind, e in result.log
        if kind == "lease_dropped_late" and w == who and e["job_id"] == "job-000"
    ]
    assert late, "the directed world no longer pauses an attempt between its slot and start"
    t_late, dropped = late[0]
    assert t_late >= resumed and dropped["charged"] is False
    # job-001 held the tool's slot, its stage running, when the late attempt woke
    claimed = [
        t
        for t, _, kind, e in result.log
        if kind == "job_claimed" and e["job_id"] == "job-001" and t < t_late
    ]
    ended = [
        t
        for t, _, kind, e in result.log
        if kind == "stage_committed" and e["job_id"] == "job-001" and e["stage"] == "1-mail"
    ]
    assert claimed and ended and ended[0] > t_late
    done = {e["job_id"] for _, _, kind, e in result.log if kind == "result_committed"}
    assert done == {"job-000", "job-001"}


def test_a_handler_started_on_a_lapsed_lease_is_caught() -> None:
    result, _ = _lapsed("handler_starts_lapsed")
    assert result.violations and result.violations[0].name == P1
    assert "job-001" in result.violations[0].message


# --------------------------------------------------------------------------- the table


def test_every_directed_mutation_is_caught_here_and_no_longer_being_re_pinned() -> None:
    from sim_repin import DIRECTED, REPINNING

    from simtools.mutations import VARIANTS

    assert not set(DIRECTED) & set(REPINNING)
    assert set(DIRECTED) <= set(VARIANTS)
    for name, test in DIRECTED.items():
        assert callable(globals().get(test)), f"{name}: no test {test} here"
