"""Heartbeat rounds shared by the leases of one heartbeat interval (issue 12 item 1).

Leases claimed at different moments have different schedules; a round that
extended only the leases due at that moment sent half-empty visibility batches and
small ownership reads. A group's shared round also extends the leases of its group
that would come due before the next one (``timing.shared_round``), so they converge
onto one round per interval. These tests drive ``heartbeat_round_flow`` by hand
over simulated time (a tick every 0.1 s, as the thread worker's loop) and read
every call it makes; and they hold the rule to its bounds: no lease extended past
its stage budget, with a lapsed handle, or after it ended; no lease renewed more
than its own schedule asks but once when it joins; every lease's ownership read at
least as often as its own schedule asks.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

from core_harness import (
    DLQ,
    QUEUE,
    TABLE,
    WORKER,
    Script,
    job_item,
    job_view,
    local_lease,
    ok,
    put,
    table,
)

from sqs_lease._core.calls import Call, Outcome
from sqs_lease._core.claiming import Claimed
from sqs_lease._core.env import AttemptEnv, Now
from sqs_lease._core.lease import Drop, LeaseStatus
from sqs_lease._core.leasebook import Flag, Held, LeaseBook
from sqs_lease._core.messages import Delivery
from sqs_lease._core.rounds import heartbeat_round_flow
from sqs_lease._core.timing import may_join, plan_heartbeat, shared_round
from sqs_lease._schema.intent_requests import IntentTable

T0 = 1000.0
WALL = 1_700_000_000.0
TICK = 0.1


@dataclass
class Rules:
    """A job class as the book reads it (L = 60, H = 10, J = 5 unless told)."""

    lease_seconds: int = 60
    heartbeat_seconds: float = 10.0
    jitter_seconds: float = 5.0
    stage_budget_seconds: float = 3600.0
    progress_timeout_seconds: float | None = None
    max_attempts: int = 3
    backoff_base_seconds: float = 4.0
    backoff_max_seconds: float = 300.0


@dataclass
class Round:
    at: float
    cmv: list[list[str]] = field(default_factory=list)  # receipt handles per batch
    reads: list[list[str]] = field(default_factory=list)  # job ids per BatchGetItem
    liveness: int = 0


class World:
    """A worker's book and heartbeat, driven tick by tick; every call answered as
    AWS would for leases this worker owns, and recorded per round."""

    def __init__(self) -> None:
        self.mono = T0
        self.book = LeaseBook()
        self.tokens: dict[str, int] = {}
        self.rounds: list[Round] = []
        self.extended: dict[str, list[float]] = defaultdict(list)  # handle -> CMV send times
        self.read_at: dict[str, list[float]] = defaultdict(list)  # job id -> read times
        self.counts: dict[str, int] = defaultdict(int)
        self.env = AttemptEnv(
            table=table(),
            intents=IntentTable("intents-test", "attempts-test"),
            queue_url=QUEUE,
            dlq_url=DLQ,
            worker_id=WORKER,
            book=self.book,
            rules_of=lambda name: None,
            receive_visibility=60,
            unknown_class_receives=5,
            now=lambda: Now(self.mono, WALL + self.mono - T0),
            random=lambda: 0.5,
            write_id=lambda: "n-1",
            tally=self._tally,
            new_signal=Flag,
            run_handler=lambda run: None,
        )

    def _tally(self, name: str, n: int) -> None:
        self.counts[name] += n

    def hold(
        self, job_id: str, rules: Rules | None = None, *, visibility: float | None = None
    ) -> Held:
        """Claim ``job_id`` now: its lease comes from a receive sent now that granted
        ``visibility`` (the class's L unless told)."""
        rules = rules or Rules()
        self.tokens[job_id] = 3
        d = Delivery(
            message_id=f"m-{job_id}",
            receipt_handle=f"rh-{job_id}",
            job_id=job_id,
            job_class="ocr",
            receive_count=1,
            received_at=self.mono,
            visibility=int(visibility or rules.lease_seconds),
            send_id="send-1",
        )
        claim = Claimed(
            d,
            job_view(job_id, token=3),
            3,
            1,
            False,
            None,
            self.mono + (visibility or rules.lease_seconds),
        )
        return self.book.hold(claim, rules, self.mono, Flag()).held

    def end(self, held: Held) -> None:
        """The attempt's handler returned and its end was written: the book forgets it."""
        self.book.mark(held)
        self.book.forget(held, None)

    def answer(self, c: Call) -> Outcome:
        r = self.rounds[-1]
        if c.op == "ChangeMessageVisibilityBatch":
            handles = [e["ReceiptHandle"] for e in c.params["Entries"]]
            r.cmv.append(handles)
            for h in handles:
                self.extended[h].append(self.mono)
            entries = [{"Id": e["Id"]} for e in c.params["Entries"]]
            return ok({"Successful": entries, "Failed": []}, sent_at=self.mono)
        if c.op == "BatchGetItem":
            keys = [k["job_id"]["S"] for k in c.params["RequestItems"][TABLE]["Keys"]]
            r.reads.append(keys)
            for k in keys:
                self.read_at[k].append(self.mono)
            found = [job_item(k, owner=WORKER, token=self.tokens[k]) for k in keys]
            return ok({"Responses": {TABLE: found}, "UnprocessedKeys": {}}, sent_at=self.mono)
        assert c.op == "PutItem", c.op  # the worker's liveness record
        r.liveness += 1
        return ok(sent_at=self.mono)

    def tick(self) -> Round | None:
        """One tick of the heartbeat loop at the current time; the round, if it made
        calls. Then the clock moves on by one tick."""
        self.rounds.append(Round(self.mono))
        Script(self.answer).run(heartbeat_round_flow(self.env))
        r: Round | None = self.rounds[-1]
        if r is not None and not (r.cmv or r.reads or r.liveness):
            self.rounds.pop()
            r = None
        self.mono = round(self.mono + TICK, 6)
        return r

    def run_until(self, t: float) -> list[Round]:
        made: list[Round] = []
        while self.mono < t:
            r = self.tick()
            if r is not None:
                made.append(r)
        return made


def _staggered(world: World, n: int, spread: float) -> list[Held]:
    """``n`` leases claimed one after another over ``spread`` seconds."""
    held: list[Held] = []
    step = spread / n
    for i in range(n):
        held.append(world.hold(f"job-{i:02d}"))
        world.run_until(round(world.mono + step, 6))
    return held


# ----------------------------------------------------------------------------- convergence


def test_leases_claimed_at_staggered_times_converge_onto_one_full_round_per_interval() -> None:
    world = World()
    held = _staggered(world, 40, spread=10.0)  # one claim every 0.25 s over one H
    steady = world.run_until(T0 + 80.0)
    later = [r for r in steady if r.at >= T0 + 30.0]
    # One round per heartbeat interval, extending all 40: four full visibility
    # batches and one ownership read of the 40, one liveness write.
    assert len(later) == 5
    for r in later:
        assert [len(b) for b in r.cmv] == [10, 10, 10, 10]
        assert [len(keys) for keys in r.reads] == [40]
        assert r.liveness == 1
    gaps = [b.at - a.at for a, b in itertools.pairwise(later)]
    assert all(abs(g - 10.0) < 2 * TICK for g in gaps)
    # Converged within the first interval: from the second round on, every round
    # extends every lease held.
    full = [r for r in world.rounds if sum(len(b) for b in r.cmv) == 40]
    assert world.rounds.index(full[0]) <= 1 and len(world.book) == len(held) == 40


def test_the_first_round_of_leases_claimed_together_takes_the_stragglers_along() -> None:
    world = World()
    for i in range(10):  # one receive of ten, claimed over 1.5 s
        world.hold(f"job-{i}")
        world.run_until(round(world.mono + 0.15, 6))
    rounds = world.run_until(T0 + 25.0)
    assert [sum(len(b) for b in r.cmv) for r in rounds] == [10, 10]
    assert [len(r.cmv) for r in rounds] == [1, 1]  # one full batch each, not ten
    assert world.counts["beats_early"] == 9  # the first round took nine ahead of time


def test_each_lease_is_renewed_no_more_often_than_its_schedule_asks_but_once_to_join() -> None:
    world = World()
    held = _staggered(world, 30, spread=10.0)
    # Meanwhile, every 3 s a short job whose receive granted less than its class's
    # lease: due at once, off the schedule, each makes a round of its own.
    for i in range(60):
        odd = world.hold(f"odd-{i}", visibility=30)
        world.run_until(round(world.mono + 3.0, 6))
        world.end(odd)
    assert world.mono >= T0 + 190.0
    world.run_until(T0 + 195.0)
    for h in held:
        times = world.extended[h.lease.receipt_handle]
        claimed = h.lease.started_at
        # Its own schedule: one beat per H from the claim; joining adds at most one.
        own = int((T0 + 195.0 - claimed) // 10.0)
        assert own <= len(times) <= own + 1, (h.lease.job_id, times)
        # After joining, never two renewals less than H apart.
        gaps = [b - a for a, b in itertools.pairwise(times[1:])]
        assert all(g >= 10.0 - 1e-9 for g in gaps), gaps


def test_a_lease_due_off_the_schedule_goes_alone_and_never_pulls_the_group_ahead() -> None:
    world = World()
    for i in range(20):
        world.hold(f"job-{i}")
    (first,) = world.run_until(T0 + 10.05)  # the group's shared round at T0 + 10
    assert sum(len(b) for b in first.cmv) == 20
    world.run_until(T0 + 15.0)
    # A receive granted 30 s to a class of L = 60: its first beat is due at once.
    odd = world.hold("odd", visibility=30)
    (alone,) = world.run_until(T0 + 15.05)
    assert alone.cmv == [["rh-odd"]] and alone.reads == [["odd"]]
    # The group's next shared round takes it along (due at T0 + 25, before T0 + 30).
    (shared,) = world.run_until(T0 + 20.05)
    assert sum(len(b) for b in shared.cmv) == 21 and "rh-odd" in shared.cmv[-1]
    assert odd.lease.next_beat == shared.at + 10.0
    # Two leases due off the schedule before the group's next round share one.
    world.run_until(T0 + 22.0)
    early = world.hold("early", visibility=56)  # due at T0 + 28 (56 - 60 + 10 = 6 s)
    world.run_until(T0 + 25.0)
    world.hold("odd2", visibility=30)  # due at once, at T0 + 25
    (both,) = world.run_until(T0 + 25.05)
    assert sorted(both.cmv[0]) == ["rh-early", "rh-odd2"] and len(both.reads) == 1
    assert early.lease.next_beat == T0 + 35.0
    (shared2,) = world.run_until(T0 + 30.05)
    assert sum(len(b) for b in shared2.cmv) == 23  # all of them, at the group's round
    shared = shared2
    # An ownership retry after an unanswered round is off the schedule too.
    put(world.book.get("job-3").lease, LeaseStatus.UNKNOWN)  # type: ignore[union-attr]
    world.book.get("job-3").lease.next_beat = shared.at + 1.0  # type: ignore[union-attr]
    (retry,) = world.run_until(shared.at + 1.05)
    assert retry.cmv == [["rh-job-3"]]


def test_each_heartbeat_interval_has_its_own_shared_round() -> None:
    world = World()
    fast, slow = Rules(heartbeat_seconds=10.0), Rules(lease_seconds=120, heartbeat_seconds=30.0)
    for i in range(5):
        world.hold(f"f-{i}", fast)
        world.hold(f"s-{i}", slow)
        world.run_until(round(world.mono + 1.0, 6))
    rounds = world.run_until(T0 + 65.0)
    by_round = [sorted(h[3] for b in r.cmv for h in b) for r in rounds]
    # The fast group shares a round every 10 s; the slow one every 30 s, alone or
    # with the fast one when their rounds meet, never pulled by the fast group's.
    assert by_round[0] == ["f"] * 5
    assert all(len(set(r)) == 1 or r.count("s") == 5 for r in by_round)
    slow_rounds = [r for r in by_round if "s" in r]
    assert len(slow_rounds) == 2 and all(r.count("s") == 5 for r in slow_rounds)


def test_leases_that_end_before_their_first_beat_cost_no_round() -> None:
    world = World()
    for i in range(50):  # short jobs: each ends 2 s after its claim
        world.hold(f"job-{i}")
        world.run_until(round(world.mono + 1.0, 6))
        if i >= 2:
            world.end(world.book.get(f"job-{i - 2}"))  # type: ignore[arg-type]
    assert world.rounds == []


# ----------------------------------------------------------------------------- bounds


def test_a_lease_is_never_joined_to_a_shared_round_past_its_stage_budget() -> None:
    due = local_lease("due", next_beat=1010.0)
    # Not due until 1015; one more lease (60 s) from 1010 would end at 1070 > 1069.
    tight = local_lease("tight", next_beat=1015.0, stage_deadline=1069.0)
    fits = local_lease("fits", next_beat=1015.0, stage_deadline=1070.0)
    assert not may_join(tight, 1010.0, 1020.0) and may_join(fits, 1010.0, 1020.0)
    early, _ = shared_round([due], [tight, fits], 1010.0, {})
    assert early == [fits]
    # Through the round's plan: the tight one is the watchdog's (dropped, never extended).
    plan = plan_heartbeat([due, tight, fits], 1010.0, {})
    assert plan.extend == (due, fits) and plan.drop == ((tight, Drop.STAGE_BUDGET),)


def test_a_lease_whose_handle_may_have_lapsed_is_never_joined_to_a_shared_round() -> None:
    due = local_lease("due", next_beat=1010.0)
    # An unanswered round left its deadline at 1014: past 1009 (1014 - J) the message
    # may be another receive's, and a visibility change with its handle would move it.
    lapsed = local_lease("lapsed", deadline=1014.0, next_beat=1011.0)
    put(lapsed, LeaseStatus.UNKNOWN)
    assert not lapsed.handle_ours(1010.0)
    assert not may_join(lapsed, 1010.0, 1020.0)
    early, _ = shared_round([due], [lapsed], 1010.0, {})
    assert early == []


def test_a_lease_that_ended_or_was_let_go_is_never_joined_to_a_shared_round() -> None:
    due = local_lease("due", next_beat=1010.0)
    gone = [local_lease(f"x-{s.value}", next_beat=1015.0) for s in LeaseStatus]
    for lease, status in zip(gone, LeaseStatus, strict=True):
        put(lease, status)
    early, _ = shared_round([due], gone, 1010.0, {})
    assert sorted(lease.job_id for lease in early) == ["x-ok", "x-unknown"]


def test_no_visibility_change_goes_out_with_a_lapsed_or_ended_leases_handle() -> None:
    world = World()
    held = [world.hold(f"job-{i}") for i in range(6)]
    world.run_until(T0 + 5.0)
    budget, late, done = held[0], held[1], held[2]
    budget.lease.stage_deadline = T0 + 69.0  # one more lease at T0 + 10 would cross it
    late.lease.deadline = T0 + 14.0  # an unanswered round left it short (J = 5) ...
    put(late.lease, LeaseStatus.UNKNOWN)
    late.lease.next_beat = T0 + 11.0  # ... its retry due after the group's round
    world.book.mark(done)  # its handler returned; its end write runs
    world.run_until(T0 + 12.0)
    sent = [h for r in world.rounds for b in r.cmv for h in b]
    assert sorted(sent) == [f"rh-job-{i}" for i in (3, 4, 5)]  # the shared round, once
    assert budget.lease.dropped is Drop.STAGE_BUDGET
    assert late.lease.dropped is Drop.RESERVE_SPENT  # at 1009, never extended early


def test_every_lease_has_its_ownership_read_at_least_as_often_as_its_schedule_asks() -> None:
    world = World()
    held = _staggered(world, 30, spread=10.0)
    odd = world.hold("odd", visibility=20)  # due at once, off the schedule
    world.run_until(T0 + 120.0)
    for h in [*held, odd]:
        reads = world.read_at[h.lease.job_id]
        claimed = h.lease.started_at
        # First read no later than its first beat; then never more than H apart
        # (the tick of the loop apart): a lease is never held back for the group.
        granted = 20.0 if h is odd else 60.0
        first_due = max(claimed, min(claimed + 10.0, claimed + granted - 60.0 + 10.0))
        assert reads[0] <= first_due + TICK + 1e-9, (h.lease.job_id, reads[0], first_due)
        gaps = [b - a for a, b in itertools.pairwise(reads)]
        assert max(gaps) <= 10.0 + TICK + 1e-9, (h.lease.job_id, gaps)


def test_a_lease_dropped_while_its_round_is_in_flight_is_told_no_heartbeat_verdict() -> None:
    # The async shell, a fresh clone's `make test` beside two CPU hogs: a handler held
    # the event loop while a round was in flight; as the loop came back the watchdog
    # dropped the blocker's lease (loop_blocked), and then the round's answers told
    # heartbeat_ok for the attempt it had just ended. The verdicts are told only for
    # leases still held open; the book applies none to the dropped one either.
    world = World()
    blocker, other = world.hold("job-0"), world.hold("job-1")
    world.mono = max(blocker.lease.next_beat, other.lease.next_beat)  # both due
    world.rounds.append(Round(world.mono))

    def answer(c: Call) -> Outcome:
        if c.op == "BatchGetItem":  # the loop is back: the blocker's step is judged
            _, dropped = world.book.loop_stalled(
                "job-0", began=T0 + 7.0, ended=world.mono, tolerated=0.75
            )
            assert [h.lease.job_id for h, _ in dropped] == ["job-0"]
        return world.answer(c)

    s = Script(answer)
    s.run(heartbeat_round_flow(world.env))
    assert world.rounds[-1].cmv == [["rh-job-0", "rh-job-1"]]  # both were extended
    told = [(e.event, e.fields["job_id"]) for e in s.events if "job_id" in e.fields]
    assert ("heartbeat_ok", "job-1") in told
    assert [t for t in told if t[1] == "job-0"] == [], told
    assert blocker.lease.dropped is Drop.LOOP_BLOCKED
    assert other.lease.status is LeaseStatus.OK
