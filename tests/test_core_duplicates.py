"""A duplicate delivery to a live owner defers instead of taking over (issue 26, signals).

Driven by hand through ``attempt_flow``: a claim takes only a ``queued`` record; a
record running under another token makes the claimer watch the owner's liveness
record (two reads a window of 2H apart on its own clock, no clock of the owner's
compared with its own), then defer (the owner beat and holds the job) or take over
(conditioned on the token it watched). The rule: ``sqs_lease/_core/duplicates.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from core_harness import OTHER, WORKER, condition_text, delivery, job_item, ok, table, unreachable
from test_core_attempt import MONO, Shell, _answers, _up_to_handler

from sqs_lease._core.attempt import attempt_flow
from sqs_lease._core.calls import Call, Emit, Err, ErrorKind, Invoke, Ok, Outcome, Sleep
from sqs_lease._core.duplicates import (
    DUPLICATE_DEFER_CAP,
    OwnerSeen,
    duplicate_defer,
    owner_alive,
    owner_window,
)
from sqs_lease._core.env import HandlerRun
from sqs_lease._core.lease import LeaseEvent
from sqs_lease._core.liveness import HeldJob, Liveness
from sqs_lease._core.messages import Delivery
from sqs_lease._core.records import JobState
from sqs_lease._core.rounds import liveness_flow

H = 10.0  # test_core_attempt.Rules: L = 60, H = 10
L = 60


def _running(token: int = 4, owner: str = OTHER) -> Err:
    """The claim's refusal: the record runs under another token (ALL_OLD)."""
    item = job_item(state=JobState.RUNNING, owner=owner, token=token)
    return Err(ErrorKind.CONDITION_FAILED, "ConditionalCheckFailedException", item=item)


def _liveness(beats: int, held: tuple[tuple[str, int], ...] = (("job-1", 4),)) -> Outcome:
    """A GetItem answer: the owner's liveness record after its ``beats``-th write."""
    jobs = tuple(HeldJob(j, t, 1_700_000_500.0) for j, t in held)
    item = table().liveness(Liveness(OTHER, 1_700_000_400.0 + beats, 0.1, 0, 1, jobs, beats))
    return ok({"Item": item.params["Item"]})


class Run:
    """An attempt driven until its handler would run (or its flow ended)."""

    def __init__(self, shell: Shell, item: Delivery, answer: Callable[[Call], Outcome]) -> None:
        self.calls: list[Call] = []
        self.events: list[Emit] = []
        self.sleeps: list[float] = []
        self.handler: HandlerRun | None = None
        self.flow = attempt_flow(shell.env, item)
        try:
            instr = next(self.flow)
            while not (isinstance(instr, Invoke) and instr.what == "handler"):
                out: Any = None
                if isinstance(instr, Call):
                    self.calls.append(instr)
                    out = answer(instr)
                elif isinstance(instr, Sleep):
                    self.sleeps.append(instr.seconds)
                    shell.mono += instr.seconds
                    out = Ok({})
                elif isinstance(instr, Emit):
                    self.events.append(instr)
                elif isinstance(instr, Invoke):
                    out = ok({"value": instr.fn()})
                instr = self.flow.send(out)
        except StopIteration:
            return
        assert isinstance(instr.fn, HandlerRun)
        self.handler = instr.fn

    def ops(self) -> list[str]:
        return [c.op for c in self.calls]

    def claims(self) -> list[Call]:
        return [c for c in self.calls if c.op == "UpdateItem"]

    def event(self, name: str) -> dict[str, Any]:
        (found,) = [dict(e.fields) for e in self.events if e.event == name]
        return found


def _responder(reads: list[Outcome], take_over: Outcome | None = None) -> Callable[[Call], Outcome]:
    """The first claim is refused (running under OTHER at token 4); liveness reads
    answer ``reads`` in order; a second claim answers ``take_over``."""
    claims = iter([_running(), take_over])
    left = iter(reads)

    def answer(call: Call) -> Outcome:
        if call.op == "UpdateItem":
            out = next(claims)
            assert out is not None, "an unexpected second claim"
            return out
        if call.op == "GetItem":
            return next(left)
        return ok({}, sent_at=MONO, received_at=MONO)  # visibility changes

    return answer


def _taken_over() -> Outcome:
    item = job_item(state=JobState.RUNNING, owner=OTHER, token=4, attempt=1)
    return ok({"Attributes": item}, sent_at=MONO, received_at=MONO)


# ----------------------------------------------------------------------------- the claim


def test_a_claim_takes_a_queued_record_and_a_running_one_only_under_the_token_judged_dead() -> None:
    first = condition_text(table().claim("j", "w", 1.0, 60, job_class="c", send_id="s").params)
    assert "'queued'" in first and "'running'" not in first
    again = table().claim("j", "w", 1.0, 60, job_class="c", send_id="s", take_from=4)
    text = condition_text(again.params)
    assert "'queued'" in text and "'running'" in text and "token = 4" in text


# ----------------------------------------------------------------------------- the rule


def test_the_owner_is_alive_when_its_counter_moved_and_it_still_holds_the_job() -> None:
    assert owner_alive(OwnerSeen(7, True), OwnerSeen(8, True))
    assert owner_alive(OwnerSeen(None, False), OwnerSeen(1, True))  # its first write
    assert not owner_alive(OwnerSeen(7, True), OwnerSeen(7, True))  # no beat: dead
    assert not owner_alive(OwnerSeen(7, True), OwnerSeen(8, False))  # beats, let it go
    assert not owner_alive(OwnerSeen(7, True), OwnerSeen(None, False))  # unread
    assert owner_window(H) == 2 * H


def test_a_duplicate_of_a_job_whose_owner_beats_is_deferred_and_kept() -> None:
    shell = Shell()
    item = delivery(receive_count=2)
    run = Run(shell, item, _responder([_liveness(7), _liveness(8)]))
    assert run.handler is None
    # One claim (refused), a hold on the copy while watching, two reads 2H apart on
    # this worker's own clock, the deferral: no take-over, no delete.
    assert run.ops() == [
        "UpdateItem",
        "ChangeMessageVisibility",
        "GetItem",
        "GetItem",
        "ChangeMessageVisibility",
    ]
    assert run.sleeps == [2 * H]
    hold, defer = (c for c in run.calls if c.op == "ChangeMessageVisibility")
    assert hold.params["VisibilityTimeout"] == math.ceil(2 * H) + L
    assert defer.params["ReceiptHandle"] == item.receipt_handle
    assert defer.params["VisibilityTimeout"] == duplicate_defer(L, 2) == L
    deferred = run.event("claim_deferred")
    assert deferred == {
        "job_id": "job-1",
        "message_id": item.message_id,
        "reason": "owner_alive",
        "owner": OTHER,
        "token": 4,
        "receive_count": 2,
        "delay": L,
        "visibility_set": True,
    }
    assert "job_claimed" not in [e.event for e in run.events]
    assert shell.counts["deferred"] == 1 and shell.counts["claimed"] == 0


def test_a_dead_owner_is_taken_over_after_the_watch_under_the_token_watched() -> None:
    shell = Shell()
    run = Run(shell, delivery(), _responder([_liveness(7), _liveness(7)], _taken_over()))
    assert run.handler is not None and run.handler.claim.token == 5
    assert run.handler.claim.reclaimed and run.handler.claim.previous_owner == OTHER
    first, again = run.claims()
    assert "'running'" not in condition_text(first.params)
    assert "token = 4" in condition_text(again.params)
    # Watched for 2H at most: a death is taken over within L + 2H of its last beat.
    assert run.sleeps == [2 * H]
    assert "claim_deferred" not in [e.event for e in run.events]
    # The receive lease was kept while watching: the claim counts its lease from it.
    assert run.handler.held.lease.deadline >= MONO + 2 * H + L - 1


def test_an_owner_that_beats_but_no_longer_holds_the_job_is_taken_over() -> None:
    shell = Shell()
    gone = _liveness(8, held=(("job-2", 1),))
    run = Run(shell, delivery(), _responder([_liveness(7), gone], _taken_over()))
    assert run.handler is not None and len(run.claims()) == 2


def test_an_owner_holding_the_job_at_an_older_token_is_taken_over() -> None:
    shell = Shell()
    older = _liveness(8, held=(("job-1", 3),))
    run = Run(shell, delivery(), _responder([_liveness(7), older], _taken_over()))
    assert run.handler is not None


def test_a_liveness_record_missing_or_unread_proves_nothing_and_the_claim_takes_over() -> None:
    cases: list[list[Outcome]] = [
        [ok({}), ok({})],
        [unreachable(), unreachable()],
        [_liveness(7), ok({})],
    ]
    for reads in cases:
        shell = Shell()
        run = Run(shell, delivery(), _responder(reads, _taken_over()))
        assert run.handler is not None, reads


def test_a_claim_another_worker_made_during_the_watch_is_a_live_owner() -> None:
    shell = Shell()
    newer = _running(token=5, owner="w-3")
    run = Run(shell, delivery(), _responder([_liveness(7), _liveness(7)], newer))
    assert run.handler is None
    deferred = run.event("claim_deferred")
    assert (deferred["owner"], deferred["token"]) == ("w-3", 5)


def test_a_duplicate_reaching_another_attempt_of_the_owner_is_deferred_by_its_own_book() -> None:
    # One worker id, two attempts (the copy reached another of its threads): no read,
    # no wait; its book says its attempt holds the job with a lease it extends.
    shell = Shell()
    first, _flow = _up_to_handler(shell)
    token = first.claim.token
    mine = _running(token=token, owner=WORKER)
    run = Run(
        shell, delivery(receipt_handle="rh-2"), lambda c: mine if c.op == "UpdateItem" else ok()
    )
    assert run.handler is None and run.ops() == ["UpdateItem", "ChangeMessageVisibility"]
    assert run.sleeps == [] and run.event("claim_deferred")["owner"] == WORKER
    assert shell.book.get("job-1") is first.held  # the live attempt is untouched


def _first_until(shell: Shell, stop: Callable[[Any], bool]) -> Any:
    """Drive a first attempt of job-1 (its claim lands at token 5) until ``stop``
    holds for the instruction it yields; return the suspended flow (keep it)."""
    flow = attempt_flow(shell.env, delivery())
    answers = iter(_answers())
    instr = next(flow)
    while not stop(instr):
        out: Any = None
        if isinstance(instr, Call):
            out = next(answers)
        elif isinstance(instr, Invoke):
            out = ok({"value": instr.fn()})
        instr = flow.send(out)
    return flow


def _own_copy(shell: Shell, token: int) -> Run:
    """A copy of job-1 reaches another attempt of the same worker: its claim finds
    the record running under this worker at ``token``; a take-over would land."""
    claims = iter([_running(token=token, owner=WORKER), _taken_over()])
    return Run(shell, delivery(receipt_handle="rh-2"), lambda c: next(claims))


def test_a_copy_reaching_the_owner_between_its_claim_and_its_hold_is_deferred() -> None:
    # Soak seeds 1040258 and 1045173 (plans world): the first attempt's claim landed,
    # and it was still taking its slots (seconds, under a slow window) when the copy's
    # claim found the record running under its own worker: its book held nothing yet,
    # so the copy took the job over from its own live attempt.
    shell = Shell()
    first = _first_until(shell, lambda i: isinstance(i, Invoke) and i.what == "validate")
    assert shell.book.get("job-1") is None  # claimed, not yet held
    run = _own_copy(shell, token=5)
    assert run.handler is None and run.sleeps == []
    assert run.ops() == ["UpdateItem", "ChangeMessageVisibility"]
    assert run.event("claim_deferred")["owner"] == WORKER
    first.close()


def test_a_copy_reaching_the_owner_while_its_claim_is_under_way_is_deferred() -> None:
    # The copy's refusal can come back before the first claim's answer (two threads,
    # two connections): the record runs at the first claim's token, which this
    # worker does not know yet; the first claim's answer settles the job.
    shell = Shell()
    first = _first_until(shell, lambda i: isinstance(i, Call) and i.op == "UpdateItem")
    run = _own_copy(shell, token=5)
    assert run.handler is None and run.event("claim_deferred")["owner"] == WORKER
    first.close()


def test_an_own_claim_that_ended_before_its_hold_leaves_the_job_to_a_copy() -> None:
    shell = Shell()
    first = _first_until(shell, lambda i: isinstance(i, Invoke) and i.what == "validate")
    first.close()  # that attempt is over (its flow ended) without holding the job
    run = _own_copy(shell, token=5)
    assert run.handler is not None and run.sleeps == []
    assert "token = 5" in condition_text(run.claims()[1].params)


def test_a_copy_reaching_the_owner_while_its_end_write_is_under_way_is_deferred() -> None:
    # The handler returned (DONE: nothing more to extend) and the end write is on its
    # way: a take-over now would refuse that write and throw the finished work away.
    shell = Shell()
    first, _flow = _up_to_handler(shell)
    first.held.lease.process(LeaseEvent.RETURNED)
    run = _own_copy(shell, token=first.claim.token)
    assert run.handler is None and run.event("claim_deferred")["owner"] == WORKER


def test_a_duplicate_reaching_the_owner_after_its_lease_went_is_taken_over_at_once() -> None:
    shell = Shell()
    first, _flow = _up_to_handler(shell)
    first.held.lease.process(LeaseEvent.LOST, "token moved")
    token = first.claim.token
    claims = iter([_running(token=token, owner=WORKER), _taken_over()])
    run = Run(shell, delivery(receipt_handle="rh-2"), lambda c: next(claims))
    assert run.handler is not None and run.sleeps == []
    assert f"token = {token}" in condition_text(run.claims()[1].params)


# ----------------------------------------------------------------------------- receives


def _receives(lease: int, seconds: float) -> int:
    """Receives a deferred copy spends while its owner works ``seconds`` (the copy
    comes back at each deferral's end; the first is its second receive)."""
    count, waited = 0, 0.0
    while waited < seconds:
        count += 1
        waited += duplicate_defer(lease, count + 1)
    return count


def test_a_deferred_copy_spends_few_receives_over_a_long_job() -> None:
    # SQS counts every receive toward maxReceiveCount (the redrive's 50, a backstop):
    # a live owner's long job must not walk its message into the DLQ.
    assert [duplicate_defer(60, n) for n in range(1, 9)] == [60, 60, 120, 240, 480, 960, 1800, 1800]
    for lease in (30, 60, 300, 900):
        assert _receives(lease, 3600) <= 7, lease
        assert _receives(lease, 11.75 * 3600) < 30, lease
    assert duplicate_defer(7200, 5) == 7200  # never shorter than the class's lease
    assert duplicate_defer(30, 60) == DUPLICATE_DEFER_CAP


# ----------------------------------------------------------------------------- the counter


def test_each_liveness_write_counts_up_and_a_round_a_little_early_still_writes() -> None:
    shell = Shell()
    _first, _flow = _up_to_handler(shell)
    written: list[Call] = []

    def write(at: float) -> None:
        from sqs_lease._core.env import Now

        flow = liveness_flow(shell.env, Now(at, 1_700_000_000.0 + at), round_seconds=0.1)
        try:
            instr = next(flow)
            while True:
                assert isinstance(instr, Call)
                written.append(instr)
                instr = flow.send(ok())
        except StopIteration:
            pass

    write(MONO)
    write(MONO + H - 0.3)  # the next round ended a little earlier than H after it
    write(MONO + H - 0.2 + 0.1)  # a round off the schedule right after: not written
    assert [int(c.params["Item"]["beats"]["N"]) for c in written] == [1, 2]


def test_the_liveness_record_lists_a_claim_not_yet_held_at_its_token() -> None:
    # Another worker watching this one for a job it claimed and has not held yet
    # (validating, taking its slots) must find it listed: a live owner, not a dead one.
    shell = Shell()
    _first, _flow = _up_to_handler(shell)  # job-1 held at token 5
    shell.book.claiming("n-other", "job-2")
    shell.book.claimed("n-other", 8, MONO + 50)
    shell.book.claiming("n-flight", "job-3")  # under way: no token to list yet
    from sqs_lease._core.env import Now
    from sqs_lease._core.liveness import liveness_of

    flow = liveness_flow(shell.env, Now(MONO, 1_700_000_000.0), round_seconds=0.1)
    call = next(flow)
    assert isinstance(call, Call)
    live = liveness_of(call.params["Item"])
    assert live is not None
    assert [(h.job_id, h.token) for h in live.held] == [("job-1", 5), ("job-2", 8)]
    shell.book.unclaim("n-other")
    assert not shell.book.claim_pending("job-2", 8, MONO)
