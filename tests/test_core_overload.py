"""A worker never fails work because it is overloaded (issue 12 item 3), in the core.

Two rules, driven by hand: backpressure (the worker takes on no more than its
heartbeat keeps on time: ``Pace``, asked through ``LeaseBook.room``), and the
lateness drop (a confirmed lease that this worker's own heartbeat let run out is
handed back with the attempt its claim counted given back, never charged).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from core_harness import OTHER, TABLE, WORKER, Script, delivery, job_item, ok, put
from test_core_attempt import MONO, Shell, _up_to_handler

from sqs_lease._core.attempt import attempt_flow
from sqs_lease._core.calls import Call, Emit, Flow, Invoke, Outcome
from sqs_lease._core.env import HandlerRun, Parallel
from sqs_lease._core.lease import Drop, LeaseStatus
from sqs_lease._core.leasebook import HAND_BACK_STALE, LeaseBook
from sqs_lease._core.messages import Delivery
from sqs_lease._core.records import JobState
from sqs_lease._core.rounds import heartbeat_round_flow
from sqs_lease._core.timing import LATE_HANDBACK_LIMIT, Pace, pace_budget

# ----------------------------------------------------------------------------- backpressure


def test_pace_budget_is_half_the_tightest_class_slack_or_heartbeat() -> None:
    # L - H - J = 3 - 1 - 0.5 = 1.5 > H = 1: the heartbeat bounds it.
    assert pace_budget([(3, 1.0, 0.5), (120, 10.0, 5.0)]) == 0.5
    # 12 - 5 - 5 = 2 < H = 5: the slack bounds it.
    assert pace_budget([(12, 5.0, 5.0)]) == 1.0


def test_a_round_later_than_its_budget_stops_all_new_work_until_one_is_on_time() -> None:
    pace = Pace(budget=0.5)
    assert pace.room(0) == 100  # nothing measured yet: the starting allowance
    # 300 leases due at t=10 extended by t=10.2: on time, room to grow.
    assert not pace.observe(extended=300, due=10.0, started=10.0, ended=10.2)
    assert pace.room(300) > 0
    # The next round completes 0.8 s after its most overdue beat was due: late.
    assert pace.observe(extended=400, due=20.0, started=20.1, ended=20.8)
    assert pace.throttled
    assert pace.room(1) == 0 and pace.room(250) == 0  # nothing new, however few held
    # Holding nothing, no round can be late (nor lift the throttle): it takes work.
    assert pace.room(0) > 0
    # On time again: it takes work again, up to what a round keeps on time.
    assert pace.observe(extended=200, due=30.0, started=30.0, ended=30.1)
    assert not pace.throttled and pace.room(200) > 0


def test_on_time_the_worker_may_hold_what_the_cost_projects_and_no_more() -> None:
    pace = Pace(budget=0.5)
    # 100 leases in 0.25 s: 2.5 ms each, 200 fit in a budget of 0.5 s.
    pace.observe(extended=100, due=10.0, started=10.0, ended=10.25)
    assert pace.capacity == 200
    assert pace.room(150) == 50 and pace.room(200) == 0
    # A round of a few leases is all latency: it never starves a worker that keeps up.
    pace.observe(extended=2, due=20.0, started=20.0, ended=20.2)
    assert pace.capacity == 200  # twice the largest round kept on time
    # A late round forgets what was proven: no more than the projection allows.
    pace.observe(extended=100, due=30.0, started=30.0, ended=31.0)
    assert pace.capacity == 50 and pace.room(40) == 0


def test_the_book_gives_the_receive_loop_no_more_room_than_the_pace() -> None:
    shell = Shell(lambda run: None)
    pace = shell.book.pace = Pace(budget=0.5)
    assert shell.book.room(10) == 10 and shell.book.room(500) == 100
    _run, _flow = _up_to_handler(shell)  # one lease held
    pace.observe(extended=50, due=1.0, started=1.5, ended=2.0)  # 1 s late
    assert shell.book.room(10) == 0
    assert LeaseBook().room(500) == 500  # no pace: no backpressure


def _bgi(token: int) -> Outcome:
    found = [job_item(state=JobState.RUNNING, owner=WORKER, token=token)]
    return ok({"Responses": {TABLE: found}, "UnprocessedKeys": {}})


def _round(shell: Shell, token: int, *, starts: float, takes: float) -> Script:
    """One heartbeat round that starts at ``starts`` and whose calls take ``takes`` s."""
    shell.mono = starts

    def answer(call: Call) -> Outcome:
        if call.op == "BatchGetItem":
            shell.mono += takes
            return _bgi(token)
        return ok({"Successful": [{"Id": "0"}]}, sent_at=shell.mono)

    s = Script(answer)
    s.run(heartbeat_round_flow(shell.env))
    return s


def test_a_late_heartbeat_round_turns_backpressure_on_in_the_round_flow() -> None:
    shell = Shell(lambda run: None)
    shell.book.pace = Pace(budget=0.5)
    run, _flow = _up_to_handler(shell, visibility=60)  # the receive granted L
    due = run.held.lease.next_beat
    # The round starts on time, and its calls take a second: it completes late.
    s = _round(shell, run.claim.token, starts=due + 0.2, takes=1.0)
    on = s.event("backpressure_on")
    assert on["held"] == 1 and on["round_late"] > on["budget"] == 0.5
    assert shell.book.room(10) == 0  # the receive loop takes nothing new


def test_backpressure_lets_go_once_every_lease_it_protected_was_taken_over() -> None:
    # Issue 26 defect 11: a pause made a round late (backpressure on), and the job was
    # taken over meanwhile. Its handler, fenced out, still runs (it may for long: a
    # hung call), but its lease is no longer extended: no round is left to be on
    # time, and the worker took no job until that handler returned. The throttle
    # protects the leases the heartbeat extends; with none left it lets go.
    shell = Shell(lambda run: None)
    shell.book.pace = Pace(budget=0.5)
    run, _flow = _up_to_handler(shell, visibility=60)
    due = run.held.lease.next_beat
    _round(shell, run.claim.token, starts=due + 0.2, takes=1.0)
    assert shell.book.pace.throttled and shell.book.room(10) == 0
    # The next round, late too, finds the job under another owner's token.
    shell.mono = run.held.lease.next_beat + 0.2

    def taken_over(call: Call) -> Outcome:
        if call.op != "BatchGetItem":
            return ok({"Successful": [{"Id": "0"}]}, sent_at=shell.mono)
        shell.mono += 1.0
        found = [job_item(state=JobState.RUNNING, owner=OTHER, token=run.claim.token + 1)]
        return ok({"Responses": {TABLE: found}, "UnprocessedKeys": {}})

    s = Script(taken_over)
    s.run(heartbeat_round_flow(shell.env))
    assert run.held.lease.status is LeaseStatus.LOST
    assert shell.book.get("job-1") is run.held  # its handler has not returned
    # Nothing left to protect: it takes work again, as much as the late round
    # showed a round keeps (one lease); that lease is protected again, and the
    # first round that keeps it on time lifts the throttle (backpressure_off).
    assert shell.book.room(10) == 1
    assert shell.book.pace.room(1) == 0


def test_a_first_beat_due_before_its_lease_began_is_late_only_from_the_claim() -> None:
    # The receive granted 30 s of a 60 s lease: the first beat is due at once, its
    # schedule 20 s before the claim. A round run at once is on time; measured from
    # that schedule it would read 20 s late and stop all new work after every claim
    # (a thread worker took 420 s to hold 720 jobs so, 4 per heartbeat).
    shell = Shell(lambda run: None)
    shell.book.pace = Pace(budget=0.5)
    run, _flow = _up_to_handler(shell, visibility=30)
    lease = run.held.lease
    assert lease.next_beat < lease.started_at - 10
    s = _round(shell, run.claim.token, starts=lease.started_at + 0.1, takes=0.1)
    assert "backpressure_on" not in s.event_names() and not shell.book.pace.throttled
    assert shell.book.room(10) == 10
    # Still late when the worker's own rounds are: counted from when it held the lease.
    later = Shell(lambda run: None)
    later.book.pace = Pace(budget=0.5)
    run2, _flow2 = _up_to_handler(later, visibility=30)
    s2 = _round(later, run2.claim.token, starts=run2.held.lease.started_at + 0.3, takes=0.5)
    assert 0.5 < s2.event("backpressure_on")["round_late"] < 1.0


def test_a_rounds_parts_run_through_the_shells_parallel_runner() -> None:
    shell = Shell(lambda run: None)
    ran: list[int] = []

    def runner(flows: Any) -> list[Any]:
        ran.append(len(flows))
        return [Script(lambda c: _answer_part(c)).run(f) for f in flows]

    def _answer_part(call: Call) -> Outcome:
        if call.op == "BatchGetItem":
            keys = call.params["RequestItems"][TABLE]["Keys"]
            found = [
                job_item(k["job_id"]["S"], state=JobState.RUNNING, owner=WORKER, token=5)
                for k in keys
            ]
            return ok({"Responses": {TABLE: found}, "UnprocessedKeys": {}})
        return ok({"Successful": [{"Id": e["Id"]} for e in call.params["Entries"]]})

    shell.env.run_parallel = runner
    flows: list[Flow[Any]] = []
    for i in range(250):
        d = delivery(f"job-{i}", receipt_handle=f"rh-{i}")
        claimed = ok({"Attributes": job_item(f"job-{i}", state=JobState.QUEUED, token=4)})
        flows.append(_hold(shell, d, claimed))
    shell.mono = MONO + 10.0
    s = Script([ok()])  # the parts ran in the runner; then the one liveness write
    s.run(heartbeat_round_flow(shell.env))
    assert [c.op for c in s.calls] == ["PutItem"]
    assert ran == [3]  # 250 leases: three parts of at most 100, run at once
    assert [i.fn for i in s.invoked if isinstance(i.fn, Parallel)]
    assert all(h.lease.next_beat == MONO + 20.0 for h in shell.book.entries())


def _hold(shell: Shell, d: Any, claimed: Outcome) -> Flow[Any]:
    from sqs_lease._core.attempt import attempt_flow
    from sqs_lease._core.calls import Invoke

    flow = attempt_flow(shell.env, d)
    answers = iter([claimed, ok(sent_at=MONO)])
    instr = next(flow)
    while not (isinstance(instr, Invoke) and instr.what == "handler"):
        out: Any = None
        if isinstance(instr, Call):
            out = next(answers)
        elif isinstance(instr, Invoke):
            out = ok({"value": instr.fn()})
        instr = flow.send(out)
    return flow


# ----------------------------------------------------------------------------- lateness


@pytest.mark.parametrize("before", [0, LATE_HANDBACK_LIMIT - 2, LATE_HANDBACK_LIMIT - 1])
def test_late_hand_backs_are_counted_and_the_one_at_the_limit_is_charged(before: int) -> None:
    # A handler that holds the GIL makes its worker late on every attempt: uncharged
    # each time, it would walk into the DLQ with its attempts never spent. The
    # record counts its late hand-backs; the LATE_HANDBACK_LIMIT-th keeps the attempt.
    shell = Shell(lambda run: None)
    run, _flow = _up_to_handler(shell)
    held = run.held
    held.job = replace(held.job, late_handbacks=before)
    shell.mono = held.lease.conservative_deadline + 0.5
    s = Script([ok({"Attributes": {}})])
    s.run(heartbeat_round_flow(shell.env))
    charged = before + 1 == LATE_HANDBACK_LIMIT
    late = s.event("lease_dropped_late")
    assert (late["late_handbacks"], late["charged"]) == (before + 1, charged)
    (release,) = s.calls
    names = release.params["ExpressionAttributeNames"].values()
    assert "late_handbacks" in names  # counted on the record, fenced like the release
    assert ("attempt" in names) is not charged  # given back, or kept when charged
    if charged:
        told = s.event("worker_late_charged")
        assert (told["job_class"], told["late_handbacks"]) == ("ocr", LATE_HANDBACK_LIMIT)
        assert "GIL" in told["fix"]
        assert "attempt charged" in s.event("messages_released")["reason"]
    else:
        assert s.events_named("worker_late_charged") == []


def test_a_lease_the_worker_let_run_out_by_its_own_lateness_is_handed_back_uncharged() -> None:
    shell = Shell(lambda run: None)
    run, _flow = _up_to_handler(shell)
    held = run.held
    assert held.lease.status is LeaseStatus.OK  # confirmed: no call failed
    shell.mono = held.lease.conservative_deadline + 0.5  # no round ran in time
    s = Script([ok({"Attributes": {}})])
    s.run(heartbeat_round_flow(shell.env))
    late = s.event("lease_dropped_late")
    assert (late["job_id"], late["token"]) == ("job-1", 5) and late["late_by"] > 0
    # Its first beat was due at once (the receive granted 30 s of 60): late from then,
    # not from a schedule that fell before the worker held it.
    assert held.lease.next_beat < held.lease.started_at
    assert late["late_by"] == round(shell.mono - held.lease.started_at, 3)
    assert s.events_named("lease_dropped") == []  # not the watchdog's drop
    # The record alone hands it back: past the conservative deadline the message may
    # be another receive's, so no visibility change is sent with the old handle.
    (release,) = s.calls
    assert release.op == "UpdateItem"
    assert s.event("messages_released") == {
        "count": 1,
        "lapsed": 1,
        "reason": "worker late: its heartbeat fell behind; attempt not charged",
    }
    text = json.dumps(release.params)
    # Fenced: only while the token is this attempt's and the job is running ...
    assert ":" in release.params["ConditionExpression"] and "5" in text
    # ... back to queued with the attempt the claim counted given back.
    update = release.params["UpdateExpression"]
    assert "-" in update and "queued" in text
    assert held.lease.dropped is Drop.WORKER_LATE and held.cancelled.is_set()
    assert shell.counts == Counter(claimed=1, released_late=1)  # no retry, no failure


def test_a_lease_whose_ownership_went_unconfirmed_is_still_just_let_go() -> None:
    shell = Shell(lambda run: None)
    run, _flow = _up_to_handler(shell)
    held = run.held
    put(held.lease, LeaseStatus.UNKNOWN)  # SQS or DynamoDB did not answer
    shell.mono = held.lease.conservative_deadline + 0.5
    s = Script([])
    s.run(heartbeat_round_flow(shell.env))
    assert s.event("lease_dropped")["reason"] == Drop.RESERVE_SPENT.value
    assert s.calls == [] and held.lease.dropped is Drop.RESERVE_SPENT


# ------------------------------------------------------- a claim never overtakes the hand-back


def _drive(
    shell: Shell, item: Delivery, answers: list[Outcome]
) -> tuple[HandlerRun | None, list[Call], list[Emit], Flow[Any]]:
    """Drive an attempt of ``item`` until its handler would run (or the flow ends):
    the run (None if it ended), the calls and events on the way, the flow (keep it)."""
    flow = attempt_flow(shell.env, item)
    scripted = iter(answers)
    calls: list[Call] = []
    events: list[Emit] = []
    try:
        instr = next(flow)
        while not (isinstance(instr, Invoke) and instr.what == "handler"):
            out: Any = None
            if isinstance(instr, Call):
                calls.append(instr)
                out = next(scripted)
            elif isinstance(instr, Emit):
                events.append(instr)
            elif isinstance(instr, Invoke):
                out = ok({"value": instr.fn()})
            instr = flow.send(out)
    except StopIteration:
        return None, calls, events, flow
    assert isinstance(instr.fn, HandlerRun)
    return instr.fn, calls, events, flow


def _claim_answer(token: int, attempt: int) -> Outcome:
    return ok(
        {"Attributes": job_item(state=JobState.QUEUED, owner=None, token=token, attempt=attempt)},
        sent_at=MONO,
        received_at=MONO,
    )


def test_a_message_back_while_its_lapsed_attempt_is_held_here_is_claimed_after_the_hand_back() -> (
    None
):
    # The worker's own lateness let a confirmed lease run out (a held event loop, a
    # suspended process), and its receive brings the job's message back before any
    # heartbeat round dropped the lease. A claim first would take the job over from
    # the lapsed attempt; the release would then find the token moved, and the job
    # would be charged a second attempt for the worker's lateness.
    shell = Shell(lambda run: None)
    first, _flow = _up_to_handler(shell)
    assert first.held.lease.status is LeaseStatus.OK
    shell.mono = first.held.lease.conservative_deadline + 0.5
    again = delivery(receipt_handle="rh-2", received_at=shell.mono)
    released = ok({"Attributes": {}})
    run, calls, events, _flow2 = _drive(shell, again, [released, _claim_answer(5, 0)])
    assert run is not None
    release, claim = calls
    # First the fenced release of the lapsed attempt (token 5): back to queued, its
    # attempt given back, by the record alone (no visibility change with either handle).
    assert release.op == "UpdateItem" and claim.op == "UpdateItem"
    assert "-" in release.params["UpdateExpression"]
    assert "queued" in json.dumps(release.params) and "5" in json.dumps(release.params)
    # Then the claim of the delivery now in hand, which counts attempt 1 again.
    assert "send-1" in json.dumps(claim.params) and "rh-2" not in json.dumps(release.params)
    names = [e.event for e in events]
    assert names.index("lease_dropped_late") < names.index("job_claimed")
    claimed = next(e.fields for e in events if e.event == "job_claimed")
    assert (claimed["token"], claimed["attempt"]) == (6, 1)
    # The lapsed attempt handed the job back itself: nothing was lost to our claim.
    assert "heartbeat_lost" not in names
    assert first.held.lease.dropped is Drop.WORKER_LATE and first.held.lease.given_back
    assert first.held.cancelled.is_set()
    assert shell.book.get("job-1") is run.held and run.held.lease.token == 6
    assert shell.counts == Counter(claimed=2, released_late=1)


def test_a_message_back_while_a_round_hands_its_lapsed_attempt_back_is_left_for_a_moment() -> None:
    # A heartbeat round dropped the lapsed lease and its release is still in flight
    # (another task or thread of this worker): the delivery waits, unclaimed.
    shell = Shell(lambda run: None)
    first, _flow = _up_to_handler(shell)
    shell.mono = first.held.lease.conservative_deadline + 0.5
    _plan, dropped = shell.book.plan_round(shell.mono)
    assert [why for _h, why in dropped] == [Drop.WORKER_LATE]
    again = delivery(receipt_handle="rh-2", received_at=shell.mono)
    run, calls, events, _ = _drive(shell, again, [ok()])
    assert run is None
    (cmv,) = calls
    assert cmv.op == "ChangeMessageVisibility"
    assert cmv.params["ReceiptHandle"] == "rh-2" and cmv.params["VisibilityTimeout"] == 1
    (deferred,) = [e.fields for e in events if e.event == "claim_deferred"]
    assert deferred["reason"] == "hand_back_under_way" and deferred["visibility_set"] is True
    assert shell.counts["deferred"] == 1
    # Once the hand-back landed, the next delivery is claimed at once.
    shell.book.gave_back([first.held], "worker late")
    run, calls, _events, _flow3 = _drive(shell, again, [_claim_answer(5, 0)])
    assert run is not None and [c.op for c in calls] == ["UpdateItem"]


def test_a_lapsed_lease_whose_ownership_went_unconfirmed_does_not_hold_the_claim_back() -> None:
    # Not the worker's lateness (SQS or DynamoDB did not answer): no hand-back is
    # owed, and the claim takes the job over as any claim would, counted.
    shell = Shell(lambda run: None)
    first, _flow = _up_to_handler(shell)
    put(first.held.lease, LeaseStatus.UNKNOWN)
    shell.mono = first.held.lease.conservative_deadline + 0.5
    again = delivery(receipt_handle="rh-2", received_at=shell.mono)
    run, calls, events, _flow2 = _drive(shell, again, [_claim_answer(5, 1)])
    assert run is not None and [c.op for c in calls] == ["UpdateItem"]
    assert "lease_dropped_late" not in [e.event for e in events]


def test_a_hand_back_that_never_said_it_ended_holds_a_claim_back_only_so_long() -> None:
    # The round that dropped the lease raised before its release (heartbeat_error):
    # nothing will ever mark that hand-back over, and the job must not wait forever.
    shell = Shell(lambda run: None)
    first, _flow = _up_to_handler(shell)
    shell.mono = first.held.lease.conservative_deadline + 0.5
    shell.book.plan_round(shell.mono)
    again = delivery(receipt_handle="rh-2", received_at=shell.mono)
    shell.mono += HAND_BACK_STALE - 1
    run, calls, _events, _ = _drive(shell, again, [ok()])
    assert run is None and [c.op for c in calls] == ["ChangeMessageVisibility"]
    shell.mono += 2
    again = delivery(receipt_handle="rh-3", received_at=shell.mono)  # received once more
    run, calls, _events, _flow2 = _drive(shell, again, [_claim_answer(5, 1)])
    assert run is not None and [c.op for c in calls] == ["UpdateItem"]


def test_a_slow_hand_back_spends_few_of_the_jobs_receives() -> None:
    # Found by the soak (seed 64626): a round's hand-back took 30 s (its calls timing
    # out under a partition), and a delivery deferred for 1 s at a time came back 22
    # times; SQS counts each receive toward maxReceiveCount and moved the healthy job
    # to the DLQ, where it stayed `queued` with no message. Each wait now lasts as long
    # as the hand-back has taken so far: the whole stale window costs a few receives.
    shell = Shell(lambda run: None)
    first, _flow = _up_to_handler(shell)
    shell.mono = first.held.lease.conservative_deadline + 0.5
    shell.book.plan_round(shell.mono)
    dropped_at = shell.mono
    delays: list[int] = []
    while shell.mono - dropped_at < HAND_BACK_STALE:
        again = delivery(receipt_handle=f"rh-{len(delays)}", received_at=shell.mono)
        run, calls, events, _ = _drive(shell, again, [ok()])
        assert run is None and [c.op for c in calls] == ["ChangeMessageVisibility"]
        (deferred,) = [e.fields for e in events if e.event == "claim_deferred"]
        assert deferred["delay"] == calls[0].params["VisibilityTimeout"] >= 1
        delays.append(deferred["delay"])
        shell.mono += deferred["delay"]
    # The waits grow with the hand-back's age, never past the stale bound.
    assert delays == sorted(delays) and delays[0] == 1 and len(delays) <= 8, delays
    assert shell.mono - dropped_at <= HAND_BACK_STALE + 1
    # Past the bound the delivery is claimed.
    run, calls, _events, _flow2 = _drive(
        shell, delivery(receipt_handle="rh-x", received_at=shell.mono), [_claim_answer(5, 1)]
    )
    assert run is not None and [c.op for c in calls] == ["UpdateItem"]
