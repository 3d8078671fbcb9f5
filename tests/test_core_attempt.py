"""The core's attempt flow and lease book, driven by hand (no AWS, no clock, no threads).

``attempt_flow`` is the one sequence every worker shell runs: these tests play the
shell with :class:`Script`, answer its calls, run a scripted handler for its
``Invoke("handler")``, and read what it wrote, counted and journaled, for each
way an attempt can end.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from core_harness import (
    DLQ,
    QUEUE,
    TABLE,
    WORKER,
    Script,
    condition_failed,
    delivery,
    err,
    job_item,
    ok,
    put,
    table,
)

from sqs_lease._core.attempt import (
    attempt_flow,
    first_beat_reserve,
    flush_deletes_flow,
    held_effect_flow,
    json_problem,
    result_json,
)
from sqs_lease._core.calls import Call, Err, ErrorKind, Flow, Invoke, Outcome
from sqs_lease._core.claiming import Claimed
from sqs_lease._core.deletes import DeleteBatch
from sqs_lease._core.deploy import SHUTDOWN_RELEASE_MARGIN
from sqs_lease._core.endings import EndKind, ending_for
from sqs_lease._core.env import ActFor, AttemptEnv, HandlerRun, Now
from sqs_lease._core.fencing import Finish, FinishOutcome
from sqs_lease._core.intents import EffectSpec
from sqs_lease._core.lease import Drop, LeaseStatus, Stop
from sqs_lease._core.leasebook import Flag, LeaseBook
from sqs_lease._core.messages import SQS_BATCH, Delivery, Poison, receive_batch
from sqs_lease._core.receiving import RECEIVE_FILL_WAIT, ReceivePacer, receive_size
from sqs_lease._core.records import JobState, JobView
from sqs_lease._core.retention import Unprotected, repeat_unprotected
from sqs_lease._core.rounds import heartbeat_round_flow
from sqs_lease._core.shutdown import (
    Drive,
    WaitAttempts,
    WaitEndWrites,
    received_flow,
    shutdown_flow,
    shutdown_order,
)
from sqs_lease._core.sweeps import redrive_rules
from sqs_lease._core.timing import backoff_delay
from sqs_lease._errors import (
    IntentAmbiguous,
    LeaseLost,
    OwnershipUnknown,
    PayloadError,
    PermanentError,
    ToolOutcomeUnknown,
    TransientError,
)
from sqs_lease._schema.intent_requests import IntentTable

MONO = 1000.0
WALL = 1_700_000_100.0


class Rules:
    """A job class as the attempt flow reads it."""

    lease_seconds = 60
    heartbeat_seconds = 10.0
    jitter_seconds = 5.0
    stage_budget_seconds = 3600.0
    progress_timeout_seconds: float | None = None
    max_attempts = 3
    backoff_base_seconds = 4.0
    backoff_max_seconds = 300.0
    keep_rejected_results = False

    def validate_payload(self, payload_json: str) -> Any:
        data = json.loads(payload_json)
        if "page" not in data:
            raise PayloadError("payload: field 'page' is required")
        return data


class Shell:
    """The test's shell: a book, counters, a fixed clock and a scripted handler."""

    def __init__(
        self,
        handler: Callable[[HandlerRun], Any] = lambda run: {"text": "ok"},
        *,
        known: bool = True,
        rand: float = 0.5,
    ) -> None:
        self.book = LeaseBook()
        self.counts: Counter[str] = Counter()
        self.mono = MONO
        self.rules = Rules()
        self.nonces = itertools.count(1)
        self.env = AttemptEnv(
            table=table(),
            intents=IntentTable("intents-test", "attempts-test"),
            queue_url=QUEUE,
            dlq_url=DLQ,
            worker_id=WORKER,
            book=self.book,
            rules_of=lambda name: self.rules if known else None,
            receive_visibility=30,
            unknown_class_receives=5,
            now=lambda: Now(self.mono, WALL),
            random=lambda: rand,
            write_id=lambda: f"n-{next(self.nonces)}",
            tally=self.tally,
            new_signal=Flag,
            run_handler=handler,
        )

    def tally(self, name: str, n: int) -> None:
        if n:
            self.counts[name] += n


RELEASED = ok({"Successful": [{"Id": "0"}]})


def _claimed(token: int = 4, attempt: int = 1, **kw: Any) -> Outcome:
    """The claim's answer (ALL_OLD: the record before the claim moved the token)."""
    return ok(
        {
            "Attributes": job_item(
                state=JobState.QUEUED, owner=None, token=token, attempt=attempt, **kw
            )
        },
        sent_at=MONO,
        received_at=MONO,
    )


def _answers(*rest: Outcome) -> list[Outcome]:
    """A claim that lands (the receive's lease kept: no visibility change), then ``rest``."""
    return [_claimed(), *rest]


def _run(shell: Shell, answers: list[Outcome], item: Delivery | Poison | None = None) -> Script:
    s = Script(answers)
    end = s.run(attempt_flow(shell.env, item or delivery()))
    s.end, s.result = end, end.fin  # type: ignore[attr-defined]
    return s


def _ops(s: Script) -> list[str]:
    return [c.op for c in s.calls]


# ----------------------------------------------------------------------------- endings


def test_a_handler_that_returns_commits_its_result_fenced_and_forgets_the_lease() -> None:
    seen: list[HandlerRun] = []

    def handler(run: HandlerRun) -> Any:
        seen.append(run)
        assert shell.book.get("job-1") is run.held  # held while it runs
        return {"text": "ok"}

    shell = Shell(handler)
    s = _run(shell, _answers(ok(), ok()))
    assert _ops(s) == ["UpdateItem", "UpdateItem", "DeleteMessage"]  # claim, commit, delete
    assert s.result == Finish(FinishOutcome.DONE, deleted=True)  # type: ignore[attr-defined]
    assert seen[0].payload == {"page": 1} and seen[0].claim.token == 5
    values = s.calls[1].params["ExpressionAttributeValues"].values()
    assert {"S": '{"text":"ok"}'} in values  # the canonical JSON of what it returned
    assert shell.counts == Counter(claimed=1, committed=1)
    assert len(shell.book) == 0
    assert seen[0].held.lease.status is LeaseStatus.DONE
    kinds = s.kinds
    assert kinds.index("invoke:validate") < kinds.index("invoke:handler")


def test_a_rejected_commit_counts_rejected_and_journals_the_loss_once() -> None:
    shell = Shell()
    moved = condition_failed(job_item(token=9, owner="w-2"))
    s = _run(shell, _answers(moved, ok()))  # the commit, then the rejected result kept
    assert s.result.outcome is FinishOutcome.REJECTED  # type: ignore[attr-defined]
    lost = s.event("heartbeat_lost")
    assert (lost["detected_by"], lost["token"]) == ("commit", 5)
    kept = s.event("rejected_result_kept")
    assert (kept["token"], kept["content"], kept["stored"]) == (5, False, True)
    assert shell.counts == Counter(claimed=1, rejected=1)


def test_a_transient_error_retries_with_the_backoff_the_random_draw_gives() -> None:
    def handler(run: HandlerRun) -> Any:
        raise TransientError("flaky", code="flaky")

    shell = Shell(handler, rand=0.25)
    s = _run(shell, _answers(ok(), ok()))
    assert _ops(s)[1:] == ["UpdateItem", "ChangeMessageVisibility"]  # attempt 2 of 3
    delay = backoff_delay(2, Rules.backoff_base_seconds, Rules.backoff_max_seconds, 0.25)
    assert s.calls[2].params["VisibilityTimeout"] == delay
    assert shell.counts == Counter(claimed=1, retried=1)
    assert "invoke:random" in s.kinds


def test_an_unknown_tool_outcome_parks_the_job() -> None:
    def handler(run: HandlerRun) -> Any:
        raise ToolOutcomeUnknown("timed out", code="timeout")

    shell = Shell(handler)
    s = _run(shell, _answers(ok(), ok()))
    assert shell.counts == Counter(claimed=1, parked=1)
    assert "PARKED" in json.dumps(s.calls[1].params).upper()


def test_a_permanent_error_fails_the_job() -> None:
    def handler(run: HandlerRun) -> Any:
        raise PermanentError("no such page", code="no_page")

    shell = Shell(handler)
    s = _run(shell, _answers(ok(), ok()))
    assert _ops(s)[1:] == ["UpdateItem", "DeleteMessage"]
    assert shell.counts == Counter(claimed=1, failed=1)
    assert "no_page" in json.dumps(s.calls[1].params)


def test_a_result_that_is_not_json_fails_the_job_as_bad_result_naming_the_field() -> None:
    shell = Shell(lambda run: {"rows": [1, {"when": object()}]})
    s = _run(shell, _answers(ok(), ok()))
    written = json.dumps(s.calls[1].params)
    assert "bad_result" in written
    assert "result['rows'][1]['when']: object is not JSON" in written
    assert shell.counts == Counter(claimed=1, failed=1)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"a": [1, "x", None, 2.5, True]}, None),
        ((1, 2), None),
        ({"ok": {1: "x"}}, None),
        ({"ok": {1: "x", "b": 2}}, "result['ok']: keys of several types (int, str)"),
        ({("t",): 1}, "result: key ('t',) (tuple) is not a JSON key"),
        ([{1, 2}], "result[0]: set is not JSON"),
    ],
)
def test_json_problem_names_the_first_place_a_value_stops_being_json(
    value: Any, named: str | None
) -> None:
    problem = json_problem(value)
    assert (problem if problem is None else problem.split(" (return")[0]) == named
    assert (problem is None) == (result_json(value) is not None)


def test_a_poison_message_goes_to_the_dlq_without_a_claim() -> None:
    shell = Shell()
    poison = Poison("m-1", "rh-1", "not JSON", None, "garbage")
    s = _run(shell, [ok(), ok()], poison)
    assert _ops(s) == ["SendMessage", "DeleteMessage"]
    assert s.calls[0].params["QueueUrl"] == DLQ
    assert shell.counts == Counter(poisoned=1)


class StrictRules(Rules):
    def validate_payload(self, payload_json: str) -> Any:
        raise PayloadError("payload: field 'pages' is required")


def test_an_invalid_payload_is_poisoned_and_failed_without_running_the_handler() -> None:
    ran: list[HandlerRun] = []
    shell = Shell(ran.append)
    shell.rules = StrictRules()
    s = _run(shell, _answers(ok(), ok()))
    assert ran == []
    assert s.event("message_poisoned")["error_code"] == "invalid_payload"
    assert _ops(s)[1:] == ["UpdateItem", "DeleteMessage"]  # failed, fenced
    assert shell.counts == Counter(claimed=1, poisoned=1)
    assert len(shell.book) == 0  # never held


def test_an_unknown_class_is_left_for_another_worker_with_a_drawn_backoff() -> None:
    shell = Shell(known=False, rand=0.0)
    s = _run(shell, [ok()])
    assert _ops(s) == ["ChangeMessageVisibility"]  # never claimed
    assert s.kinds[:2] == ["invoke:now", "invoke:random"]
    assert shell.counts == Counter(deferred=1)
    assert s.result is None  # type: ignore[attr-defined]


def test_a_stop_told_during_the_handler_releases_the_job_and_spends_no_attempt() -> None:
    def handler(run: HandlerRun) -> Any:
        shell.book.request_stop()  # the worker shuts down while the handler runs
        assert run.held.cancelled.is_set()
        return {"partial": True}

    shell = Shell(handler)
    s = _run(shell, _answers(ok(), RELEASED))
    assert _ops(s)[1:] == ["UpdateItem", "ChangeMessageVisibilityBatch"]  # back to queued
    assert shell.counts == Counter(claimed=1, released=1)
    assert "partial" not in json.dumps([c.params for c in s.calls])  # never committed
    assert s.result is None  # type: ignore[attr-defined]


def test_a_result_returned_after_the_lease_was_lost_is_discarded_unwritten() -> None:
    def handler(run: HandlerRun) -> Any:
        shell.book.intent_refused(run.held, "token moved to 6")
        return {"late": True}

    shell = Shell(handler)
    s = _run(shell, _answers())
    assert _ops(s) == ["UpdateItem"]  # nothing after the handler
    ev = s.event("result_discarded")
    assert (ev["stop"], ev["error_code"]) == (Stop.LEASE_LOST.value, "result_discarded")
    assert shell.counts == Counter(claimed=1, lost=1)


def test_an_attempt_claimed_while_stopping_never_starts_its_handler() -> None:
    ran: list[HandlerRun] = []
    shell = Shell(ran.append)
    shell.book.stopping = True
    s = _run(shell, _answers(ok(), RELEASED))
    assert ran == []
    assert shell.counts == Counter(claimed=1, released=1)
    assert "invoke:handler" not in s.kinds


# ----------------------------------------------------------------------------- the book


def _up_to_handler(shell: Shell, visibility: int = 30) -> tuple[HandlerRun, Flow[Any]]:
    """Drive an attempt until its handler would run; return that run (the lease held)
    and the suspended flow (keep it: a flow collected forgets its lease)."""
    flow = attempt_flow(shell.env, delivery(visibility=visibility))
    answers = iter(_answers())
    instr = next(flow)
    while not (isinstance(instr, Invoke) and instr.what == "handler"):
        out: Any = None
        if isinstance(instr, Call):
            out = next(answers)
        elif isinstance(instr, Invoke):
            out = ok({"value": instr.fn()})
        instr = flow.send(out)
    assert isinstance(instr.fn, HandlerRun)
    return instr.fn, flow


def test_a_newer_own_claim_supersedes_the_held_attempt_of_the_same_job() -> None:
    shell = Shell()
    run, _flow = _up_to_handler(shell)
    held = run.held  # the first attempt runs; a second claim lands
    s2 = _run(shell, [_claimed(token=5), ok(), ok()])
    assert held.lease.status is LeaseStatus.LOST and held.cancelled.is_set()
    assert s2.event("heartbeat_lost")["detected_by"] == "own_claim"
    assert shell.counts["own_claim_superseded"] == 1


def _stage_claim(stage: str, token: int, committed: list[tuple[str, int]]) -> Claimed:
    """A claim of job-1 at ``stage`` whose record's stage log holds ``committed``
    (stage, token) checkpoints."""
    log = [{"stage": s, "token": t, "attempt": 1} for s, t in committed]
    view = JobView(
        job_id="job-1",
        job_class="ocr",
        state=JobState.RUNNING,
        token=token,
        attempt=1,
        owner=WORKER,
        payload_hash="hash-aaa",
        stage=stage,
        stage_log=json.dumps(log) if log else None,
    )
    return Claimed(delivery(), view, token, 1, False, None, MONO + 60, "n-0")


def test_the_next_stage_claimed_while_the_stage_before_finishes_its_ending_is_no_lost_lease() -> (
    None
):
    """The stage's own checkpoint sent the next stage's message, which this worker
    received and claimed before the ending attempt left the book: a stage boundary,
    not a heartbeat_lost alert (seen on a loaded machine, tests/test_stages_virtual_time.py)."""
    book = LeaseBook()
    fetch = book.hold(_stage_claim("fetch", 4, []), Rules(), MONO, Flag()).held
    book.mark(fetch)  # its handler returned NextStage("render")
    render = book.hold(_stage_claim("render", 5, [("fetch", 4)]), Rules(), MONO, Flag())
    assert (render.superseded, render.event) == (False, None)
    assert fetch.lease.status is LeaseStatus.DONE and not fetch.cancelled.is_set()
    assert book.get("job-1") is render.held


def test_the_next_stage_claimed_after_another_owner_committed_the_stage_still_tells_the_loss() -> (
    None
):
    """The checkpoint in the log is another owner's (a newer token took the stage
    over): the attempt this book held did lose its lease, and hears it."""
    book = LeaseBook()
    fetch = book.hold(_stage_claim("fetch", 4, []), Rules(), MONO, Flag()).held
    render = book.hold(_stage_claim("render", 6, [("fetch", 5)]), Rules(), MONO, Flag())
    assert render.superseded and render.event is not None
    assert render.event.event == "heartbeat_lost"
    assert render.event.fields["detected_by"] == "own_claim"
    assert fetch.lease.status is LeaseStatus.LOST and fetch.cancelled.is_set()


def test_the_watchdog_drop_retries_the_job_and_gives_the_lease_back() -> None:
    shell = Shell(lambda run: None)
    shell.rules.progress_timeout_seconds = 5.0
    run, _flow = _up_to_handler(shell, visibility=60)  # the lease outlasts the 30 s
    held = run.held
    shell.mono = MONO + 30  # no progress for 30 s
    s = Script([ok(), ok()])
    s.run(heartbeat_round_flow(shell.env))
    dropped = s.event("lease_dropped")
    assert dropped["reason"] == Drop.NO_PROGRESS.value
    assert _ops(s) == ["UpdateItem", "ChangeMessageVisibility"]  # the counted retry
    acts = [i.fn for i in s.invoked if isinstance(i.fn, ActFor)]
    assert [a.tokens for a in acts] == [{"job-1": 5}, None]
    assert held.lease.status is LeaseStatus.LOST and held.cancelled.is_set()
    assert shell.counts == Counter(claimed=1, retried=1)


def _refused_then_read(state: JobState, token: int) -> Callable[[Any], Outcome]:
    """SQS refuses the extension (InvalidParameterValue, as for its 12-hour cap); the
    ownership read finds the record ``state`` under ``token``; every write lands."""

    def answer(c: Any) -> Outcome:
        if c.op == "ChangeMessageVisibilityBatch":
            bad = {"Id": "0", "Code": "InvalidParameterValue", "SenderFault": True}
            return ok({"Successful": [], "Failed": [bad]}, sent_at=MONO)
        if c.op == "BatchGetItem":
            item = job_item(state=state, token=token, attempt=1)
            return ok({"Responses": {TABLE: [item]}})
        return ok({"MessageId": "m-2"} if c.op == "SendMessage" else {})

    return answer


def test_an_extension_sqs_refuses_for_its_cap_goes_on_under_a_new_message_uncharged() -> None:
    shell = Shell(lambda run: None)
    run, _flow = _up_to_handler(shell, visibility=60)
    held = run.held
    shell.mono = held.lease.next_beat  # the beat is due
    s = Script(_refused_then_read(JobState.RUNNING, held.lease.token))
    s.run(heartbeat_round_flow(shell.env))
    assert held.lease.dropped is Drop.MESSAGE_CAP and held.cancelled.is_set()
    assert s.event("lease_dropped")["reason"] == "message_cap"
    write = next(c for c in s.calls if c.op == "UpdateItem")
    text = json.dumps(write.params)
    assert "cap.5" in text and '"queued"' in text  # a new send id, back to queued
    assert "attempt - " in write.params["UpdateExpression"] or "attempt" in text
    assert [c.op for c in s.calls if c.op != "PutItem"][-3:] == [
        "SendMessage",
        "UpdateItem",
        "DeleteMessage",
    ]  # the new message, marked sent; the old one deleted
    resent = s.event("job_resent")
    assert (resent["send_id"], resent["sent"]) == ("cap.5", True)
    assert "heartbeat_lost" not in s.event_names()  # not a loss: nobody else took it
    assert shell.counts["resent"] == 1 and shell.counts["retried"] == 0
    # The handler, still running, hears why, and that its attempt is not spent.
    stop = held.lease.stop_error()
    assert stop is not None and "12-hour visibility cap" in str(stop)


def test_an_extension_sqs_refuses_after_another_claim_took_the_job_is_a_loss() -> None:
    shell = Shell(lambda run: None)
    run, _flow = _up_to_handler(shell, visibility=60)
    held = run.held
    shell.mono = held.lease.next_beat
    s = Script(_refused_then_read(JobState.RUNNING, held.lease.token + 1))
    s.run(heartbeat_round_flow(shell.env))
    assert held.lease.status is LeaseStatus.LOST and held.lease.dropped is None
    assert s.event("heartbeat_lost")["detected_by"] == "heartbeat"
    assert [c.op for c in s.calls if c.op not in ("PutItem",)] == [
        "ChangeMessageVisibilityBatch",
        "BatchGetItem",
    ]  # nothing written, nothing sent


def test_shutdown_lets_go_of_every_open_lease_and_releases_them() -> None:
    shell = Shell()
    s0 = Script([])
    assert s0.run(shutdown_flow(shell.env)) is None  # nothing held: nothing to do
    run, _flow = _up_to_handler(shell)
    held = run.held
    s = Script(lambda call: ok())
    s.run(shutdown_flow(shell.env))
    assert held.lease.dropped is Drop.SHUTDOWN and held.cancelled.is_set()
    assert held.lease.reason == "given back: shutdown"  # a late write reports no loss
    assert s.invoked[0].fn == ActFor("release", {"job-1": 5})
    assert "UpdateItem" in _ops(s)  # the record goes back to queued


def test_a_message_received_while_stopping_is_released_unclaimed_not_started() -> None:
    # One rule for every shell (thread, async, simulated): received_flow decides.
    shell = Shell()
    s = Script([])
    assert s.run(received_flow(shell.env, delivery())) is True  # started by the shell
    assert s.calls == [] and shell.counts["received"] == 1
    shell.book.request_stop()
    s = Script([RELEASED])
    assert s.run(received_flow(shell.env, delivery())) is False
    assert _ops(s) == ["ChangeMessageVisibilityBatch"]  # back at once, nothing claimed
    assert s.calls[0].params["Entries"][0]["VisibilityTimeout"] == 0
    assert shell.counts["received"] == 2 and shell.counts["released"] == 1
    poison = Poison("m-1", "rh-1", "not JSON", None, "garbage")
    s = Script([])
    assert s.run(received_flow(shell.env, poison)) is False  # left to its redelivery
    assert s.calls == []


@pytest.mark.parametrize("asked", [True, False])
def test_shutdown_order_tells_waits_hands_back_waits_for_end_writes_then_deletes(
    asked: bool,
) -> None:
    # One order for every shell: each only performs the steps it is given.
    shell = _Batched()
    _run(shell, _answers(ok()), delivery("job-a", receipt_handle="rh-a"))  # ended: a delete
    run, _flow = _up_to_handler(shell)
    held = run.held
    steps = shutdown_order(shell.env, asked=asked, grace=20.0)
    assert next(steps) == WaitAttempts(20.0)
    # Told before the grace is waited when asked; otherwise the handlers finish.
    assert held.cancelled.is_set() is asked
    release = next(steps)
    assert isinstance(release, Drive) and release.kind == "release"
    Script(lambda call: ok()).run(release.flow)
    assert held.lease.dropped is Drop.SHUTDOWN  # still held after the grace: handed back
    writes = next(steps)
    assert isinstance(writes, WaitEndWrites)
    assert writes.seconds == SHUTDOWN_RELEASE_MARGIN / 2 and writes.writing() == 0
    deletes = next(steps)
    assert isinstance(deletes, Drive) and deletes.kind == "deletes"
    s = Script([ok({"Successful": [{"Id": "0"}]})])
    assert s.run(deletes.flow) == 1  # forced: not due yet, sent at the stop
    assert next(steps, None) is None


# ----------------------------------------------------------------------------- rules


@pytest.mark.parametrize(
    ("max_receives", "bound", "warned"),
    [(None, 20, False), (100, 20, False), (6, 5, True), (1, 1, True)],
)
def test_the_redrive_bounds_unknown_class_receives_and_warns_when_tight(
    max_receives: int | None, bound: int, warned: bool
) -> None:
    got, warning = redrive_rules(max_receives, 3, 20)
    assert got == bound
    assert (warning is not None) is warned
    if warning is not None:
        assert warning.event == "redrive_too_tight"


def test_result_json_is_canonical_or_none() -> None:
    assert result_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'
    assert result_json({1, 2}) is None


@pytest.mark.parametrize(
    ("retention", "first_started", "now", "own_age", "why"),
    [
        (None, None, 100.0, 10.0, Unprotected.NO_KEYS),
        # Aged on the lease clock of the process that made the first start: the only proof.
        (60.0, 50.0, 100.0, 50.0, None),
        (60.0, 30.0, 100.0, 70.0, Unprotected.EXPIRED),
        # The walls say 50 s, that clock says 70 s (it was stepped back): the lease clock.
        (60.0, 50.0, 100.0, 70.0, Unprotected.EXPIRED),
        # The walls say 70 s, that clock says 50 s (it jumped ahead): the lease clock.
        (60.0, 30.0, 100.0, 50.0, None),
        # Inside the window only by comparing two clocks (or one wall clock twice): not
        # proof. Past it by them: refused in those words (the operator's --retry).
        (60.0, 50.0, 100.0, None, Unprotected.OTHER_CLOCK),
        (60.0, 30.0, 100.0, None, Unprotected.EXPIRED),
        (60.0, None, 100.0, None, Unprotected.OTHER_CLOCK),  # started at an unknown time
    ],
)
def test_key_retention_is_one_rule_for_the_effect_flow_and_the_operator(
    retention: float | None,
    first_started: float | None,
    now: float,
    own_age: float | None,
    why: Unprotected | None,
) -> None:
    assert repeat_unprotected(retention, first_started, now, own_age=own_age) is why


# ----------------------------------------------------------------------------- the floor


def test_a_claim_keeps_the_receives_lease_and_its_first_beat_is_due_at_once_when_shorter() -> None:
    seen: list[HandlerRun] = []
    shell = Shell(lambda run: seen.append(run))
    s = _run(shell, _answers(ok(), ok()))
    assert "ChangeMessageVisibility" not in _ops(s)  # no visibility change per claim
    lease = seen[0].held.lease
    # The receive granted 30 s from before it was sent: the local lease counts from there.
    assert lease.deadline == 1000.0 + 30
    assert s.event("job_claimed")["lease_seconds"] == 30
    # 30 s granted, the class wants 60: due at once (the round brings it to L).
    assert lease.next_beat <= MONO
    assert lease.stage_deadline == 1000.0 + Rules.stage_budget_seconds


def test_a_receive_lease_as_long_as_the_class_lease_is_beaten_h_after_the_receive() -> None:
    seen: list[HandlerRun] = []
    shell = Shell(lambda run: seen.append(run))
    _run(shell, _answers(ok(), ok()), delivery(visibility=60))
    lease = seen[0].held.lease
    assert lease.deadline == 1060.0
    assert lease.next_beat == 1000.0 + Rules.heartbeat_seconds


def test_a_message_whose_receive_lease_left_no_beat_reserve_gets_the_class_lease_at_claim() -> None:
    seen: list[HandlerRun] = []
    shell = Shell(lambda run: seen.append(run))
    # It waited: the claim was answered 11 s after the receive, 19 s of 30 left, less
    # than 30 - H = 20 s (a first beat, due at once, would have less reserve than a
    # later beat gets): the claim sets L now, as before the floor.
    late = ok(_claimed().response, sent_at=1010.0, received_at=1011.0)  # type: ignore[union-attr]
    s = _run(shell, [late, ok(sent_at=1021.0), ok(), ok()])
    assert _ops(s)[:2] == ["UpdateItem", "ChangeMessageVisibility"]
    assert s.calls[1].params["VisibilityTimeout"] == Rules.lease_seconds
    assert seen[0].held.lease.deadline == 1021.0 + Rules.lease_seconds
    assert s.event("job_claimed")["lease_seconds"] == Rules.lease_seconds


class _Batched(Shell):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.env.deletes = DeleteBatch(window=0.25)


def test_ended_jobs_messages_are_deleted_ten_per_batch_by_the_attempt_that_fills_it() -> None:
    shell = _Batched()
    ops: list[list[str]] = []
    for i in range(10):
        d = delivery(f"job-{i}", receipt_handle=f"rh-{i}")
        batch = [ok({"Successful": [{"Id": str(n)} for n in range(10)]})] if i == 9 else []
        s = _run(shell, [_claimed(job_id=f"job-{i}"), ok(), *batch], d)
        ops.append(_ops(s))
    entries = s.calls[-1].params["Entries"]
    assert [e["ReceiptHandle"] for e in entries] == [f"rh-{i}" for i in range(10)]
    assert ops[:9] == [["UpdateItem", "UpdateItem"]] * 9  # claim, commit: no delete yet
    assert ops[9] == ["UpdateItem", "UpdateItem", "DeleteMessageBatch"]
    assert len(shell.env.deletes or []) == 0


def test_a_pending_delete_goes_once_its_window_passed_and_all_go_at_stop() -> None:
    shell = _Batched()
    _run(shell, _answers(ok()), delivery("job-a", receipt_handle="rh-a"))
    assert shell.env.deletes is not None and len(shell.env.deletes) == 1
    s = Script([])
    assert s.run(flush_deletes_flow(shell.env)) == 0  # not due yet: no call
    assert s.calls == []
    shell.mono = MONO + 0.3  # the window passed
    s = Script([ok({"Successful": [{"Id": "0"}]})])
    assert s.run(flush_deletes_flow(shell.env)) == 1
    assert s.calls[0].params["Entries"] == [{"Id": "0", "ReceiptHandle": "rh-a"}]
    _run(shell, _answers(ok()), delivery("job-b", receipt_handle="rh-b"))
    s = Script([ok({"Successful": [{"Id": "0"}]})])
    assert s.run(flush_deletes_flow(shell.env, force=True)) == 1  # a stop: not due, sent
    assert s.calls[0].op == "DeleteMessageBatch"


def test_a_refused_delete_entry_is_journaled_and_left_for_its_redelivery() -> None:
    shell = _Batched()
    _run(shell, [_claimed(job_id="job-a"), ok()], delivery("job-a", receipt_handle="rh-a"))
    _run(shell, [_claimed(job_id="job-b"), ok()], delivery("job-b", receipt_handle="rh-b"))
    refused = ok(
        {
            "Successful": [{"Id": "0"}],
            "Failed": [{"Id": "1", "Code": "ReceiptHandleIsInvalid", "SenderFault": True}],
        }
    )
    s = Script([refused])
    assert s.run(flush_deletes_flow(shell.env, force=True)) == 1
    failed = s.event("message_delete_failed")
    assert (failed["job_id"], failed["token"], failed["error_code"]) == (
        "job-b",
        5,
        "ReceiptHandleIsInvalid",
    )
    assert len(s.calls) == 1  # never retried: the redelivery meets a terminal record
    assert len(shell.env.deletes or []) == 0


def test_a_job_that_failed_has_its_delete_batched_too() -> None:
    def handler(run: HandlerRun) -> Any:
        raise PermanentError("no such page", code="no_page")

    shell = _Batched()
    shell.env.run_handler = handler
    s = _run(shell, _answers(ok()), delivery("job-x", receipt_handle="rh-x"))
    assert _ops(s) == ["UpdateItem", "UpdateItem"]  # claim, fail: the delete waits
    assert shell.counts == Counter(claimed=1, failed=1)
    assert shell.env.deletes is not None and len(shell.env.deletes) == 1


def test_a_job_given_back_for_a_retry_keeps_its_message() -> None:
    def handler(run: HandlerRun) -> Any:
        raise TransientError("flaky", code="flaky")

    shell = _Batched()
    shell.env.run_handler = handler
    _run(shell, _answers(ok(), ok()), delivery("job-r", receipt_handle="rh-r"))
    assert shell.env.deletes is not None and len(shell.env.deletes) == 0


@pytest.mark.parametrize(
    ("free", "concurrency", "left", "waited", "want"),
    [
        (1, 10, None, 0.0, 0),  # one slot of 10 free: wait for a full receive
        (10, 10, None, 0.0, 10),
        (12, 50, None, 0.0, 12),  # SQS caps a receive at 10; the flow asks for 10
        (3, 3, None, 0.0, 3),  # a small worker fills its own concurrency
        (1, 10, None, RECEIVE_FILL_WAIT, 1),  # waited long enough: take what fits
        (2, 10, 2, 0.0, 2),  # only 2 messages left to receive
        (0, 10, None, 99.0, 0),  # never more than the concurrency
    ],
)
def test_a_receive_asks_for_a_full_batch_of_free_slots(
    free: int, concurrency: int, left: int | None, waited: float, want: int
) -> None:
    assert receive_size(free, concurrency, left, waited) == want


def test_the_pacer_waits_for_a_full_receive_at_most_the_fill_wait() -> None:
    pacer = ReceivePacer(10)
    assert pacer.want(100.0, 1) == 0
    assert pacer.pause(100.0, 1) == pytest.approx(RECEIVE_FILL_WAIT)
    assert pacer.want(100.2, 1) == 0
    assert pacer.pause(100.2, 1) == pytest.approx(RECEIVE_FILL_WAIT - 0.2)
    assert pacer.want(100.0 + RECEIVE_FILL_WAIT, 1) == 1
    # The wait starts again from the next short moment, not from the first one.
    assert pacer.want(200.0, 2) == 0
    assert pacer.want(200.0, 10) == 10
    assert pacer.pause(300.0, 0) == 1.0  # no slot free: woken by a freed slot


def test_a_fifo_queues_pacer_asks_for_one_at_a_free_slot_in_every_shell() -> None:
    # Issue 28: the simulator's pacer waited for ten free slots on a FIFO queue whose
    # receives the shells held to one: one rule (messages.receive_batch) serves both.
    fifo = "https://sqs.test/123/work.fifo"
    assert receive_batch(fifo) == 1 and receive_batch(QUEUE) == SQS_BATCH
    pacer = ReceivePacer.for_queue(10, fifo)
    assert pacer.want(100.0, 1) == 1  # no fill wait: one is a full receive there
    assert ReceivePacer.for_queue(10, QUEUE).want(100.0, 1) == 0


def test_a_short_receive_opens_the_batching_window() -> None:
    pacer = ReceivePacer(50, window=2.0)
    assert pacer.want(0.0, 50) == 50
    pacer.received(0.1, asked=50, got=1)  # a trickle: one message per long poll
    assert pacer.want(0.2, 49) == 0
    assert pacer.pause(0.2, 49) == pytest.approx(1.9)
    assert pacer.want(2.0, 49) == 0
    assert pacer.want(2.1, 49) == 49  # the window is over: messages gathered meanwhile
    pacer.received(2.2, asked=49, got=9)
    assert pacer.want(2.3, 40) == 0
    assert pacer.want(4.2, 40) == 40
    # Ten is a full receive, whatever it asked for: SQS returns at most ten.
    pacer.received(4.3, asked=40, got=10)
    assert pacer.want(4.3, 30) == 30


@pytest.mark.parametrize(("asked", "got"), [(10, 0), (10, 10), (1, 1)])
def test_an_empty_or_full_receive_opens_no_window(asked: int, got: int) -> None:
    # Empty: its long poll already waited. Full: more may be waiting right now.
    pacer = ReceivePacer(10, window=5.0)
    pacer.received(0.0, asked=asked, got=got)
    assert pacer.want(0.0, 10) == 10


def test_without_a_window_a_short_receive_is_followed_at_once() -> None:
    pacer = ReceivePacer(10)
    pacer.received(0.0, asked=10, got=1)
    assert pacer.want(0.0, 10) == 10


@pytest.mark.parametrize(
    ("visibility", "reserve"),
    [
        (60, 50.0),  # V = L: kept while the claim answered within H of the receive
        (30, 20.0),  # V < L: the first beat, due at once, with V - H left at least
        (20, 15.0),  # never less than H + J (one missed beat survived)
        (600, 50.0),  # V > L: the first beat comes H after the receive and sets L
    ],
)
def test_the_receives_lease_is_kept_while_its_first_beat_has_a_full_reserve(
    visibility: int, reserve: float
) -> None:
    assert first_beat_reserve(Rules(), visibility) == reserve


def test_an_ended_jobs_delete_is_queued_before_its_attempt_leaves_the_book() -> None:
    # A stop waits while attempts are ending (LeaseBook.ending), then flushes the
    # deletes: one queued after its entry left the book could miss that flush.
    shell = _Batched()
    ending_at_add: list[int] = []
    shell.env.deletes = DeleteBatch(
        window=0.25, on_add=lambda: ending_at_add.append(shell.env.book.ending())
    )
    _run(shell, _answers(ok()), delivery("job-a", receipt_handle="rh-a"))
    assert ending_at_add == [1]
    assert len(shell.env.book) == 0 and len(shell.env.deletes) == 1


def test_a_fifo_receive_takes_its_one_message_as_soon_as_one_slot_is_free() -> None:
    # A FIFO queue gives one message per receive: waiting for 10 free slots would
    # only delay it (the floor's full batch met the FIFO rule on the rebase).
    assert receive_size(1, 10, None, 0.0) == 0
    assert receive_size(1, 10, None, 0.0, batch=1) == 1


def test_a_retry_after_the_lease_lapsed_changes_no_visibility_with_the_old_handle() -> None:
    """Past its conservative deadline the message may be another receive's: a visibility
    change with this attempt's old receipt handle could move that receive's lease (moto
    applies it), so the retry is recorded and the message left to its lapse."""

    def overran(run: HandlerRun) -> Any:
        shell.mono = run.held.lease.conservative_deadline + 1.0  # a held loop, a pause
        raise RuntimeError("the tool failed")

    shell = Shell(overran)
    s = _run(shell, [_claimed(token=5), ok({"Attributes": {}})])
    assert _ops(s) == ["UpdateItem", "UpdateItem"]  # claim, requeue: no visibility change
    scheduled = s.event("job_retry_scheduled")
    assert scheduled["visibility_set"] is False and scheduled["lease_lapsed"] is True


def test_a_retry_while_the_lease_holds_sets_the_backoff_as_the_visibility() -> None:
    def failed(run: HandlerRun) -> Any:
        raise RuntimeError("the tool failed")

    shell = Shell(failed)
    s = _run(shell, [_claimed(token=5), ok({"Attributes": {}}), ok()])
    assert _ops(s) == ["UpdateItem", "UpdateItem", "ChangeMessageVisibility"]
    scheduled = s.event("job_retry_scheduled")
    assert scheduled["visibility_set"] is True and scheduled["lease_lapsed"] is False


def test_shutdown_releases_a_lapsed_lease_by_its_record_alone() -> None:
    shell = Shell()
    live, _f1 = _up_to_handler(shell)
    s = Script(lambda call: ok({"Successful": [{"Id": "0"}]}) if "Batch" in call.op else ok())
    shell.mono = live.held.lease.conservative_deadline + 0.1  # the worker was suspended
    s.run(shutdown_flow(shell.env))
    assert _ops(s) == ["UpdateItem"]  # the record back to queued; the handle not used
    assert s.event("messages_released")["lapsed"] == 1


# ----------------------------------------------------------------------------- three signals
#
# What an operator reads about a stopped attempt must be what the worker knows:
# ``heartbeat_lost`` + ``job_abandoned LeaseLost`` when a refusal proved another owner,
# ``job_abandoned OwnershipUnknown`` (no ``heartbeat_lost``) when nothing answered,
# ``ToolOutcomeUnknown`` (a park) when the call may have applied.


def _held_attempt(shell: Shell) -> Any:
    book = shell.book
    claim = _stage_claim("main", 5, [])
    return book.hold(claim, Rules(), MONO, Flag()).held


def _effect_spec(shell: Shell, held: Any, tool: Callable[[], Any], **kw: Any) -> Any:
    return EffectSpec(
        key="job-1:main:charge:psp",
        job_id="job-1",
        stage="main",
        action="charge",
        target="psp",
        payload_json="{}",
        payload_hash="h-1",
        tool=tool,
        lease_check=lambda: held.lease.check(shell.mono),
        may_record=lambda: held.lease.may_record(shell.mono),
        **kw,
    )


def _run_effect(shell: Shell, held: Any, spec: Any, answer: Callable[[Call], Outcome]) -> Script:
    s = Script(answer)
    s.result = s.run(  # type: ignore[attr-defined]
        held_effect_flow(shell.env, held, spec, wall_clock=lambda: WALL, flow_id="f-1")
    )
    return s


def _run_effect_raising(
    shell: Shell, held: Any, spec: Any, answer: Callable[[Call], Outcome]
) -> tuple[Script, BaseException]:
    s = Script(answer)
    with pytest.raises(Exception) as caught:
        s.run(held_effect_flow(shell.env, held, spec, wall_clock=lambda: WALL, flow_id="f-1"))
    return s, caught.value


def test_a_receiver_refusal_after_the_watchdog_let_the_lease_go_is_a_lease_loss() -> None:
    """The before-send scenario: the intent started, the worker paused before its
    call went out, the watchdog let the lapsed lease go, then the receiver refused
    the late call (412 stale_token: another owner). That refusal proves a new owner:
    ``heartbeat_lost`` (detected_by intent_start) and ``LeaseLost``, not
    ``OwnershipUnknown`` from the lease check of the failed call's record."""
    shell = Shell()
    held = _held_attempt(shell)

    def tool() -> Any:
        shell.mono = held.lease.conservative_deadline + 5  # paused past the reserve
        held.lease.drop(Drop.RESERVE_SPENT)  # the heartbeat's watchdog woke first
        raise LeaseLost("http://psp: the receiver rejected fencing token 5")

    s, exc = _run_effect_raising(shell, held, _effect_spec(shell, held, tool), lambda c: ok())
    assert isinstance(exc, LeaseLost)
    lost = s.event("heartbeat_lost")
    assert (lost["detected_by"], lost["token"]) == ("intent_start", 5)
    assert held.lease.status is LeaseStatus.LOST and held.cancelled.is_set()
    assert isinstance(held.lease.stop_error(), LeaseLost)
    end = ending_for(exc)
    assert (end.kind, end.code) == (EndKind.ABANDON, "LeaseLost")


def test_a_start_refused_on_the_token_after_the_watchdog_let_the_lease_go_is_a_lease_loss() -> None:
    """The start transaction's condition on the job record failed (another token):
    whatever the local lease says by then (here: dropped while the start was on its
    way), the loss is journaled once and the attempt stops with ``LeaseLost``."""
    shell = Shell()
    held = _held_attempt(shell)
    tool_calls: list[int] = []

    def answer(c: Call) -> Outcome:
        if c.op == "TransactWriteItems":
            held.lease.drop(Drop.RESERVE_SPENT)
            return Err(
                ErrorKind.TRANSACTION_CANCELLED,
                code="TransactionCanceledException",
                message="cancelled",
                reasons=({"Code": "ConditionalCheckFailed"}, {"Code": "None"}, {"Code": "None"}),
            )
        return ok()

    spec = _effect_spec(shell, held, lambda: tool_calls.append(1))
    s, exc = _run_effect_raising(shell, held, spec, answer)
    assert isinstance(exc, LeaseLost) and tool_calls == []
    assert [e.fields["detected_by"] for e in s.events if e.event == "heartbeat_lost"] == [
        "intent_start"
    ]
    assert s.event("intent_start_refused")["reason"] == "token_moved"
    assert isinstance(held.lease.stop_error(), LeaseLost)


def test_an_unconfirmed_lease_whose_reserve_ran_out_is_ownership_unknown_not_a_loss() -> None:
    """Nothing answered and nothing refused: the worker does not know who owns the
    job. ``OwnershipUnknown``, no intent write, no ``heartbeat_lost``."""
    shell = Shell()
    held = _held_attempt(shell)
    put(held.lease, LeaseStatus.UNKNOWN)
    shell.mono = held.lease.conservative_deadline + 1
    tool_calls: list[int] = []
    spec = _effect_spec(shell, held, lambda: tool_calls.append(1))
    s, exc = _run_effect_raising(shell, held, spec, lambda c: ok())
    assert isinstance(exc, OwnershipUnknown) and tool_calls == []
    assert s.calls == []  # nothing was written
    assert not [e for e in s.events if e.event == "heartbeat_lost"]
    end = ending_for(exc)
    assert (end.kind, end.code) == (EndKind.ABANDON, "OwnershipUnknown")


def test_a_call_whose_outcome_is_unknown_parks_as_tool_outcome_unknown_not_a_loss() -> None:
    """The call may have applied and nobody can tell: the intent is marked ambiguous
    and the job parks; the lease was never lost."""
    shell = Shell()
    held = _held_attempt(shell)

    def tool() -> Any:
        raise ToolOutcomeUnknown("read timed out", code="timeout")

    s, exc = _run_effect_raising(shell, held, _effect_spec(shell, held, tool), lambda c: ok())
    assert isinstance(exc, IntentAmbiguous)
    failed = s.event("tool_request_failed")
    assert (failed["outcome_unknown"], failed["error_code"]) == (True, "ToolOutcomeUnknown")
    assert not [e for e in s.events if e.event == "heartbeat_lost"]
    assert held.lease.status is LeaseStatus.OK
    end = ending_for(exc)
    assert (end.kind, end.code) == (EndKind.PARK, "intent_ambiguous")


def test_a_handler_s_own_fence_refusal_is_told_as_a_lease_loss_once() -> None:
    """A handler's own fenced call (``ctx.fence_headers``) refused with 412 raises
    ``LeaseLost`` outside ``ctx.effect``: the same proof of another owner, journaled
    ``heartbeat_lost`` (detected_by handler) before ``job_abandoned LeaseLost``."""

    def handler(run: HandlerRun) -> Any:
        raise LeaseLost("https://psp: 412 stale_token (highest 6)")

    shell = Shell(handler)
    s = _run(shell, _answers())
    lost = [e.fields for e in s.events if e.event == "heartbeat_lost"]
    assert [(e["detected_by"], e["token"]) for e in lost] == [("handler", 5)]
    ended = s.event("job_abandoned")
    assert (ended["error_code"], ended["stop"]) == ("LeaseLost", "lease_lost")


def test_a_handler_s_lease_lost_after_the_heartbeat_told_it_is_not_told_twice() -> None:
    def handler(run: HandlerRun) -> Any:
        shell.book.intent_refused(run.held, "token moved to 6")
        raise LeaseLost("told")

    shell = Shell(handler)
    s = _run(shell, _answers())
    assert [e.event for e in s.events].count("heartbeat_lost") == 0  # the first went to the test
    assert s.event("job_abandoned")["error_code"] == "LeaseLost"


def test_a_handler_whose_lease_ran_out_before_it_started_never_starts() -> None:
    # Soak seed 1105530: a message received 40 s before (a 30 s visibility) is claimed
    # only now; the visibility change that would bring the lease to L finds the message
    # no longer in flight, so the lease the attempt holds has already run out. Its
    # handler (a planned tool under a limit of 1) started anyway, beside the slot's
    # next holder. An attempt whose lease ran out before its handler starts hands the
    # job back, uncharged, as its heartbeat would have (the worker was late, not the job).
    started: list[HandlerRun] = []
    shell = Shell(started.append)
    lapsed = delivery(received_at=MONO - 40.0, visibility=30)
    refused = err(ErrorKind.INVALID, "AWS.SimpleQueueService.MessageNotInflight")
    s = _run(shell, [_claimed(), refused, RELEASED], lapsed)
    assert started == []
    assert "invoke:handler" not in s.kinds
    late = s.event("lease_dropped_late")
    assert (late["token"], late["charged"]) == (5, False)
    # The claim, its refused visibility change, the fenced release (no visibility
    # change with a handle that may be another receive's).
    assert _ops(s) == ["UpdateItem", "ChangeMessageVisibility", "UpdateItem"], _ops(s)
    assert shell.counts["released_late"] == 1 and shell.counts["committed"] == 0


def test_a_model_a_handler_returns_is_committed_as_its_json_data_whatever_the_shell() -> None:
    # One place turns a returned model into data (stages.plain_data, in the core): the
    # thread, async and simulated shells each did it themselves before.
    from pydantic import BaseModel

    class Out(BaseModel):
        text: str
        pages: int

    shell = Shell(lambda run: Out(text="ok", pages=2))
    s = _run(shell, _answers(ok(), ok()))
    assert s.result == Finish(FinishOutcome.DONE, deleted=True)  # type: ignore[attr-defined]
    values = s.calls[1].params["ExpressionAttributeValues"].values()
    assert {"S": '{"pages":2,"text":"ok"}'} in values
