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

import pytest

from simtools.mutations import applied
from sqs_lease.testing._sim.clocks import Skew
from sqs_lease.testing._sim.invariants import I2, I10, I12, I24
from sqs_lease.testing._sim.plan import JobPlan, Step, SweepPlan
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
def _world(
    seed: int,
    mutation: str | None,
    *,
    workers: int,
    jobs: int,
    features: frozenset[str] = PLANS,
) -> Iterator[World]:
    """The world of ``seed`` (the plans world unless ``features`` says) with
    ``workers`` and ``jobs``, no drawn fault, the mutation applied while it is built
    and run."""
    with applied(mutation):
        w = World(
            seed, trace=True, features=features, mutation=mutation, workers=workers, jobs=jobs
        )
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


def _calm(job: JobPlan) -> JobPlan:
    """No scripted failure: what happens to the job is what the test directs."""
    return replace(job, p_transient=0.0, p_permanent=0.0, p_unknown=0.0)


def _own_claim(
    mutation: str | None = None, latency: tuple[float, float] = (0.2, 0.4), *, hung: bool = False
) -> tuple[RunResult, list[bool]]:
    pending: list[bool] = []  # per copy deferred: the first attempt claimed, not held
    with _world(OWN_SEED, mutation, workers=1, jobs=1) as w:
        if not hung:  # (the seed's stage hangs for 785 s; 5 s: the job can end)
            (job,) = w.plan.job_plans
            steps = (Step("work", 5.0),)
            job = _calm(replace(job, stages=(("1-mail", steps),), steps=steps))
            w.plan.job_plans, w.job_plans = [job], {job.job_id: job}
        w.sqs.behaviour = replace(w.sqs.behaviour, duplicate=1.0)
        w.plan.latency = latency

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


@pytest.mark.xfail(
    strict=False,
    reason=(
        "I24, not judged yet: the copy's owns() ran past the first attempt's conservative "
        "deadline while its heartbeat round (extension sent in time) was unconfirmed; the "
        "round confirmed it 1.3 s before the take-over landed. Not strict since slot rule "
        "7's read moved this world's schedule (the case is no longer drawn here, so the "
        "run passes): a world that draws it again is owed with the verdict"
    ),
)
def test_found_a_copy_judging_its_own_lease_between_a_late_round_and_its_confirmation() -> None:
    """Found while building the world above, with every call taking 1-2 s and the seed's
    own stage (a step hung for 785 s): at t=53.1 a
    copy of job-000 (deferred once) came back to w1; its claim met the record running
    under w1's token 1 and asked the book at about t=57, when the first attempt's lease
    was past its conservative deadline (its round's extension had landed at 51.5, its
    ownership read was retried as unprocessed): not live, so it took the job over at
    once. The round confirmed the lease at 58.1 (``heartbeat_ok``, 20 s left) and the
    take-over landed at 59.4, from an attempt its own book again held open (I24). Either
    the book's answer to a copy should wait for the round in flight (as a watch of
    another worker waits), or the checker's live owner should be judged when the copy
    decided: to be judged (a strict xfail until then)."""
    result, _ = _own_claim(latency=(1.0, 2.0), hung=True)
    assert result.ok, result.violations[:1]


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
# ``mail`` lands first is paused for 60 s once its claim is confirmed (slot rule 7's
# read: a stop-the-world pause between that read and the handler's start): its lease
# runs out, the other worker takes job-000 over and finishes it, and job-001 takes the
# slot and runs while the paused attempt wakes.

LAPSED_SEED = 2
PAUSE = 60.0


def _lapsed(mutation: str | None = None) -> tuple[RunResult, list[tuple[str, float]]]:
    paused: list[tuple[str, float]] = []  # (worker, when it resumes)
    with _world(LAPSED_SEED, mutation, workers=2, jobs=2) as w:
        first, second = w.plan.job_plans
        short, long = (Step("work", 2.0),), (Step("work", 120.0),)
        first = _calm(replace(first, stages=(("1-mail", short),), steps=short))
        stages = (("1-mail", long), *second.stages[1:])
        second = _calm(
            replace(second, stages=stages, steps=tuple(s for _, st in stages for s in st))
        )
        w.plan.job_plans = [first, second]
        w.job_plans = {jp.job_id: jp for jp in (first, second)}

        armed: list[str] = []  # the worker whose slot take landed first

        def slot_taken(who: str, kind: str, data: Any) -> None:
            if paused or who != "aws" or data.get("out") != "ok":
                return
            key = str(data.get("key", ""))
            if not armed and kind == "UpdateItem" and key.startswith("class:sim:mail#"):
                armed.append(data["from"])
            elif armed and kind == "GetItem" and data["from"] == armed[0] and key == "job-000":
                # Its claim confirmed (slot rule 7): paused between that and the start.
                worker = w.workers[armed[0]]
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


# --------------------------------------------------------------------------- sweep_blind_ahead
# Soak seed 1469822 (the fresh-range soak on 7640942): worker w5, its wall clock 3.9 h
# ahead, wrote job-000's slot wait (``unsent_since`` on its own wall) and died before
# the send. The sweep asked the ``unsent`` index only for entries older than the grace
# on its own wall: the entry stayed hidden until the sweepers' clocks passed the stamp,
# hours, and the job waited for its message past the drain (I10). The sweep now reads
# the index without a cut on the stamp; an entry stamped beyond its clock is stamped
# again on it (``sweeping._restamp_ahead``) and sent a grace later.
#
# The directed world: seed 19's staged world with one worker and one job of two stages
# (``fetch``, ``transform``). The first worker's wall clock runs 6 h ahead (further
# than the drain's bound, so a blind sweep never reaches the stamp), and it dies right
# after the ``fetch`` checkpoint, before the continuation's send (the staged world's
# own death, made certain for that one send); its replacement's clock is the seed's.

AHEAD_SEED = 19
AHEAD = 6 * 3600.0
STAGED = frozenset({"staged"})


def _ahead(mutation: str | None = None) -> RunResult:
    with _world(AHEAD_SEED, mutation, workers=1, jobs=1, features=STAGED) as w:
        (job,) = w.plan.job_plans
        assert job.stage_names == ("fetch", "transform")
        w.plan.wide = replace(w.plan.wide, stage_death_before_send=1.0)

        def ahead(who: str, kind: str, data: Any) -> None:
            if kind == "worker_started" and who == "w1":
                w.workers[who].wall_offset = AHEAD
            elif kind == "sim_stage_death":
                w.plan.wide = replace(w.plan.wide, stage_death_before_send=0.0)  # one death

        _on_record(w, ahead)
        return w.run()


def test_an_unsent_entry_stamped_hours_ahead_is_stamped_again_and_the_job_sent() -> None:
    result = _ahead()
    assert result.ok, result.violations[:1]
    deaths = [(t, who) for t, who, kind, _ in result.log if kind == "sim_stage_death"]
    assert [who for _, who in deaths] == ["w1"]
    restamped = [
        (t, who, d["ahead_by"])
        for t, who, kind, d in result.log
        if kind == "unsent_restamped" and d["job_id"] == "job-000"
    ]
    assert restamped, "the directed world no longer strands an entry stamped ahead"
    t, who, ahead_by = restamped[0]
    assert who != "w1" and ahead_by > 5 * 3600
    taken = [
        t2
        for t2, _, kind, d in result.log
        if kind == "job_send_taken" and d["job_id"] == "job-000" and d["by"] == "sweep"
    ]
    assert any(t2 > t for t2 in taken), "the stranded job was never sent again"
    assert any(e[2] == "result_committed" for e in result.log)


def test_a_sweep_blind_to_entries_stamped_ahead_is_caught() -> None:
    result = _ahead("sweep_blind_ahead")
    assert result.violations and result.violations[0].name == I10
    assert "job-000" in result.violations[0].message


# --------------------------------------------------------------------------- retention_on_wall
# Soak seed 1041578 (issue 26's merged worlds): a worker started an intent, its call
# timed out after 30 s, past the keyed target's 28.2 s key retention, and its wall clock
# had moved back meanwhile; key retention's same-worker exception read that wall clock
# twice, judged the forgotten key kept, and repeated the effect (I2). The age is read on
# the lease clock of the process that made the first start (``retention.OwnStarts``),
# and the intent parks with the reason.
#
# The directed world: seed 0's narrow world with one worker and one job whose one
# effect goes to the keyed target, which keeps keys 3 s (shorter than the run's 5 s
# tool timeout). When the request leaves, the target's answers to the worker are cut
# for 5 s (the request applies, its answer is lost: the call times out) and the
# worker's wall clock steps back 10 minutes a second later (an NTP correction).

RETENTION_SEED = 0
RETENTION = 3.0
STEP_BACK = -600.0


def _retention(mutation: str | None = None) -> RunResult:
    with _world(RETENTION_SEED, mutation, workers=1, jobs=1, features=frozenset()) as w:
        assert w.plan.tool_http_timeout > RETENTION
        (job,) = w.plan.job_plans
        steps = (Step("work", 1.0), Step("effect", action="act0"), Step("work", 1.0))
        job = replace(
            job, target="keyed", steps=steps, p_transient=0.0, p_permanent=0.0, p_unknown=0.0
        )
        w.plan.job_plans, w.job_plans = [job], {job.job_id: job}
        w.clocks.plan = replace(w.clocks.plan, key_retention=RETENTION)  # the intents' spec
        w.receivers.retention = RETENTION  # the target's

        def sent(who: str, kind: str, data: Any) -> None:
            if kind != "tool_request_started" or data["attempt"] != 1:
                return
            worker = w.workers[who]
            worker.partitions.append((w.now, w.now + 5.0, "response", ("target",)))
            worker.clock = Skew(0.0, step_at=w.now + 1.0, step=STEP_BACK, t0=w.now)

        _on_record(w, sent)
        return w.run()


def test_a_repeat_past_the_retention_is_not_sent_though_the_wall_clock_stepped_back() -> None:
    result = _retention()
    assert result.ok, result.violations[:1]
    failed = [e for e in result.log if e[2] == "tool_request_failed"]
    assert failed and failed[0][3]["outcome_unknown"], "the directed call no longer times out"
    reconciled = [e[3]["verdict"] for e in result.log if e[2] == "intent_reconciled"]
    assert reconciled == ["not_applied"]  # the target forgot the key
    started = [e[3]["attempt"] for e in result.log if e[2] == "tool_request_started"]
    assert started == [1]  # no repeat
    parked = [e[3]["reason"] for e in result.log if e[2] == "intent_ambiguous"]
    assert parked and f"past the {RETENTION:g} s" in parked[0]


def test_a_repeat_judged_on_the_wall_clock_read_twice_is_caught() -> None:
    result = _retention("retention_on_wall")
    assert result.violations and result.violations[0].name == I2
    assert "job-000:main:act0:keyed" in result.violations[0].message


# --------------------------------------------------------------------------- resume_under_count
# Soak seed 1113879 (the fresh-range soak, acb3cec): claims that landed unanswered
# counted attempts that never ran, past the job's allowance; the job went to the DLQ
# and a worker's sweep parked it; an operator resumed it, and the resume's grant of
# one attempt on top of the grants only left the count past them: its first claim
# failed the job "attempts exhausted" (I12). The attempt a resume starts is allowed
# whatever the count (``records.attempts_allowed`` with ``resumed_at_attempt``).
#
# The directed world: seed 0's narrow world with one worker and one job, the workers'
# sweep on, an operator who resumes parked jobs (``operator_races``), and a redrive at
# the receive after ``max_attempts + 1``. Until the job parks, the answer of each of the
# worker's claims that lands is cut (the claim counted an attempt, the worker never
# knew): ``max_attempts + 1`` attempts counted, none run, then the DLQ and the park.
# The worker is paused 2 s when the operator's resume sends the job's message, so the
# resume's writes land before its claim (the checker's I12 watches the resume's claim
# from the record's step out of ``queued``).

RESUME_SEED = 0
JOB = "job-000"


def _resume(mutation: str | None = None) -> tuple[RunResult, list[int]]:
    cut: list[int] = []  # the attempts counted by claims whose answer was cut
    parked: list[float] = []
    with _world(RESUME_SEED, mutation, workers=1, jobs=1, features=frozenset()) as w:
        w.plan.wide = replace(w.plan.wide, features=w.plan.wide.features | {"operator_races"})
        w.plan.sweep = SweepPlan()
        w.sqs.queues[w.queue_url].max_receive = w.plan.max_attempts + 1

        def directed(who: str, kind: str, data: Any) -> None:
            worker = w.workers.get("w1")
            if who == "aws" and kind == "SendMessage" and data["from"] == "operator":
                assert worker is not None
                worker.paused_until = max(worker.paused_until, w.now + 2.0)
            truth = w.truth(JOB)
            if parked or truth is None:
                return
            if truth[1] == "parked":
                parked.append(w.now)
            elif (
                who == "aws"
                and kind == "UpdateItem"
                and (data["from"], data["key"], data["out"]) == ("w1", JOB, "ok")
                and truth[1] == "running"
            ):
                assert worker is not None
                back = w.now + w.plan.latency[1] + 0.001  # this answer's way back
                worker.partitions.append((w.now, back, "response", ("dynamodb",)))
                cut.append(truth[0])

        _on_record(w, directed)
        return w.run(), cut


def _attempts(result: RunResult) -> list[int]:
    return [d["attempt"] for _, _, kind, d in result.log if kind == "job_claimed"]


def test_the_attempt_a_resume_starts_is_allowed_past_attempts_no_handler_ran() -> None:
    result, cut = _resume()
    assert result.ok, result.violations[:1]
    allowed = World(RESUME_SEED, features=frozenset(), workers=1, jobs=1).plan.max_attempts
    assert len(cut) == allowed + 1, "the directed world no longer counts attempts unanswered"
    kinds = [kind for _, _, kind, d in result.log if d and d.get("job_id") == JOB]
    assert kinds.index("job_dead_lettered") < kinds.index("operator_resumes")
    # the resume's claim is the job's first claim the worker knew of, past the allowance
    assert _attempts(result) == [allowed + 2]
    assert kinds[-1] == "result_committed"


def test_a_resume_granting_one_attempt_on_top_of_the_grants_only_is_caught() -> None:
    result, _ = _resume("resume_under_count")
    assert result.violations and result.violations[0].name == I12


# --------------------------------------------------------------------------- the table


def test_every_directed_mutation_is_caught_here_and_no_longer_being_re_pinned() -> None:
    from sim_repin import DIRECTED, REPINNING

    from simtools.mutations import VARIANTS

    assert not set(DIRECTED) & set(REPINNING)
    assert set(DIRECTED) <= set(VARIANTS)
    for name, test in DIRECTED.items():
        assert callable(globals().get(test)), f"{name}: no test {test} here"
