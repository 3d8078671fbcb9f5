"""Operator flows and the stranded-record sweep, driven by hand (no AWS, no network).

``resume_flow``, ``resolve_flow`` and ``sweep_flow``: the calls they make (built
by the real ``JobTable``/``IntentTable``), the events, and what they tell the
operator, for every answer DynamoDB and SQS can give.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from core_harness import (
    QUEUE,
    TABLE,
    Script,
    condition_failed,
    condition_text,
    err,
    job_item,
    ok,
    table,
    unreachable,
    update_removes,
    update_sets,
)

from sqs_lease._core.calls import Err, ErrorKind
from sqs_lease._core.intents import IntentState
from sqs_lease._core.records import JobState
from sqs_lease._core.resolving import Resolution, Resolved, resolve_flow
from sqs_lease._core.resuming import Resumed, resume_flow
from sqs_lease._core.sweeping import SweepReport, sweep_flow
from sqs_lease._errors import (
    AwsCallFailed,
    IntentError,
    IntentNotAmbiguous,
    IntentNotFound,
    JobNotFound,
    OwnershipUnknown,
    ResourceMissing,
)
from sqs_lease._schema.intent_requests import IntentTable
from sqs_lease._schema.models import IntentRecord

WALL = 1_700_000_500.0
JOB = "job-1"
KEY = "payment:inv-1:capture"
INTENTS, ATTEMPTS = "intents-test", "attempts-test"
WHO, WHY = "alice@ops", "bank statement shows the capture"


def itable() -> IntentTable:
    return IntentTable(INTENTS, ATTEMPTS)


def intent_item(
    state: IntentState,
    *,
    resolution: str | None = None,
    resolved_by: str | None = None,
    attempts: int = 1,
) -> dict[str, Any]:
    record = IntentRecord(
        intent_key=KEY,
        job_id=JOB,
        stage="main",
        action="capture",
        target="payments",
        state=state.value,
        payload="{}",
        payload_hash="h",
        attempts=attempts,
        last_token=attempts,
        created_at=WALL - 100,
        updated_at=WALL - 50,
        resolution=resolution,
        resolved_by=resolved_by,
    )
    item: dict[str, Any] = record.serialize()
    return item


def got_item(item: Mapping[str, Any] | None) -> Any:
    return ok({"Item": dict(item)} if item is not None else {})


def cancelled(*codes: str, job: Mapping[str, Any] | None = None) -> Err:
    reasons: list[dict[str, Any]] = [{"Code": c} for c in codes]
    if job is not None:
        reasons[1]["Item"] = dict(job)
    return Err(
        ErrorKind.TRANSACTION_CANCELLED,
        code="TransactionCanceledException",
        reasons=tuple(reasons),
    )


def parked(**kw: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"state": JobState.PARKED, "token": 1, "attempt": 1}
    fields.update(kw)
    return job_item(JOB, **fields)


def queued_after_unpark(**kw: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "state": JobState.QUEUED,
        "token": 1,
        "attempt": 1,
        "send_id": "send-new",
        "unsent_since": WALL,
        "granted_attempts": 1,
    }
    fields.update(kw)
    return job_item(JOB, **fields)


# =========================================================================== resume_flow


def _resume(s: Script) -> Resumed:
    return s.run(
        resume_flow(table(), queue_url=QUEUE, job_id=JOB, wall_now=WALL, send_id="send-new")
    )


def test_resume_unparks_granting_an_attempt_then_sends_under_a_new_send_id() -> None:
    s = Script([ok({"Attributes": queued_after_unpark()}), ok({"MessageId": "mid-1"}), ok()])
    got = _resume(s)
    assert s.ops == ["dynamodb.UpdateItem", "sqs.SendMessage", "dynamodb.UpdateItem"]
    unpark = s.calls[0].params
    assert condition_text(unpark) == "state = 'parked'"
    written = update_sets(unpark)
    assert (written["state"], written["send_id"], written["message_sent"]) == (
        "'queued'",
        "'send-new'",
        "False",
    )
    assert written["unsent_since"] == repr(WALL)  # findable by the sweep until sent
    assert "ADD #" in unpark["UpdateExpression"]  # granted_attempts + 1
    names = unpark["ExpressionAttributeNames"]
    assert "granted_attempts" in names.values()
    # ... and the count it resumed at: the attempt the resume starts is always allowed.
    assert "resumed_at_attempt" in names.values() and "if_not_exists" in unpark["UpdateExpression"]
    assert json.loads(s.calls[1].params["MessageBody"])["send_id"] == "send-new"
    assert condition_text(s.calls[2].params) == "send_id = 'send-new'"
    assert (got.verdict, got.state, got.message_id) == ("resumed", JobState.PARKED, "mid-1")
    assert "one attempt granted" in got.note
    assert s.event("job_resumed") == {"job_id": JOB, "send_id": "send-new", "by": "resume"}


def test_a_resume_whose_send_failed_can_be_resumed_again() -> None:
    # Regression (issue 7.8): the first resume's send failed; the second said "not
    # parked" and the job stayed queued with no message, found by nobody.
    s = Script([ok({"Attributes": queued_after_unpark()}), unreachable(), ok()])
    with pytest.raises(AwsCallFailed, match="run `sqs-lease jobs resume job-1` again"):
        _resume(s)
    assert s.ops[-1] == "dynamodb.UpdateItem"  # the send given back
    assert update_removes(s.calls[2].params) == ["send_id"]

    left = queued_after_unpark(send_id=None)  # released, still unsent
    s = Script(
        [
            condition_failed(left),
            ok({"Attributes": queued_after_unpark(send_id="send-new")}),
            ok({"MessageId": "mid-2"}),
            ok(),
        ]
    )
    got = _resume(s)
    assert s.ops == [
        "dynamodb.UpdateItem",
        "dynamodb.UpdateItem",
        "sqs.SendMessage",
        "dynamodb.UpdateItem",
    ]
    assert "attribute_not_exists (send_id)" in condition_text(s.calls[1].params)
    assert (got.verdict, got.message_id) == ("resent", "mid-2")
    assert s.event("job_send_taken")["by"] == "resume"


def test_resume_takes_over_an_unsent_record_whatever_its_age() -> None:
    # The operator named the job: no grace. The older send id is retired.
    left = queued_after_unpark(send_id="send-old", unsent_since=WALL - 1)
    s = Script([condition_failed(left), ok({"Attributes": left}), ok(), ok()])
    got = _resume(s)
    assert "send_id = 'send-old'" in condition_text(s.calls[1].params)
    assert got.verdict == "resent"


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.SUCCEEDED, JobState.QUEUED])
def test_resume_of_a_job_with_a_sent_message_does_nothing(state: JobState) -> None:
    s = Script([condition_failed(job_item(JOB, state=state))])
    got = _resume(s)
    assert s.ops == ["dynamodb.UpdateItem"]
    assert (got.verdict, got.state) == ("not_parked", state)
    assert s.event("job_resume_skipped")["state"] == state.value


def test_resume_that_loses_the_take_over_does_nothing() -> None:
    left = queued_after_unpark(send_id=None)
    s = Script([condition_failed(left), condition_failed(job_item(JOB, state=JobState.RUNNING))])
    got = _resume(s)
    assert (got.verdict, got.state) == ("not_parked", JobState.RUNNING)


def test_resume_of_a_missing_job_is_job_not_found() -> None:
    with pytest.raises(JobNotFound, match=JOB):
        _resume(Script([condition_failed(None)]))


def test_resume_unanswered_is_ownership_unknown() -> None:
    with pytest.raises(OwnershipUnknown, match="resume job"):
        _resume(Script([unreachable()]))


# =========================================================================== resolve_flow


def _resolve(
    s: Script,
    resolution: Resolution,
    external_id: str | None = None,
    *,
    attempt: int | None = None,
) -> Resolved:
    return s.run(
        resolve_flow(
            itable(),
            table(),
            queue_url=QUEUE,
            key=KEY,
            resolution=resolution,
            external_id=external_id,
            who=WHO,
            why=WHY,
            wall_now=WALL,
            send_id="send-new",
            attempt=attempt,
        )
    )


_AFTER = {
    Resolution.CONFIRMED: IntentState.CONFIRMED,
    Resolution.RETRY: IntentState.PREPARED,
    Resolution.ABANDON: IntentState.ABANDONED,
    Resolution.NEW_OPERATION: IntentState.SUPERSEDED,
}


@pytest.mark.parametrize("resolution", list(Resolution))
def test_resolve_settles_the_intent_and_unparks_the_job_in_one_transaction(
    resolution: Resolution,
) -> None:
    external = "ch_1" if resolution is Resolution.CONFIRMED else None
    s = Script(
        [
            got_item(intent_item(IntentState.AMBIGUOUS)),
            ok(),
            got_item(queued_after_unpark()),
            ok({"MessageId": "mid-1"}),
            ok(),
        ]
    )
    got = _resolve(s, resolution, external)
    assert s.ops == [
        "dynamodb.GetItem",
        "dynamodb.TransactWriteItems",
        "dynamodb.GetItem",
        "sqs.SendMessage",
        "dynamodb.UpdateItem",
    ]
    tx = s.calls[1].params
    intent, job = (next(iter(i.values())) for i in tx["TransactItems"])
    assert [next(iter(i)) for i in tx["TransactItems"]] == ["Update", "Update"]
    assert intent["TableName"] == INTENTS
    # The decision is about the ambiguity it read (attempt 1), never a later one's.
    assert condition_text(intent) == "(state = 'ambiguous' AND attempts = 1)"
    assert update_sets(intent)["state"] == repr(_AFTER[resolution].value)
    assert update_sets(intent)["resolved_by"] == repr(WHO)
    assert job["TableName"] == TABLE
    assert condition_text(job) == "state = 'parked'"
    assert update_sets(job)["send_id"] == "'send-new'"
    assert "granted_attempts" in job["ExpressionAttributeNames"].values()
    assert len(tx["ClientRequestToken"]) <= 36
    assert json.loads(s.calls[3].params["MessageBody"])["send_id"] == "send-new"
    assert got.job_requeued is True
    assert got.job_state is JobState.PARKED
    assert (got.intent.state, got.intent.resolution) == (_AFTER[resolution], resolution.value)
    ev = s.event("intent_resolved")
    assert (ev["resolution"], ev["who"], ev["external_id"]) == (resolution.value, WHO, external)
    assert s.event("job_resumed")["by"] == "resolve"


@pytest.mark.parametrize("now", [IntentState.AMBIGUOUS, IntentState.PREPARED])
def test_a_decision_about_an_earlier_attempt_never_settles_the_intent_at_a_later_one(
    now: IntentState,
) -> None:
    """Soak seed 57932: the operator judged attempt 1 "not applied"; the command died
    after its resolve, and was run again after the job had been resumed, run again
    (attempt 2 reached the target) and gone ambiguous again. That run must not take
    the old judgement for the new ambiguity (a retry would repeat an applied
    effect), nor finish an old resolution of an intent that has moved on."""
    later = intent_item(now, resolution="retry" if now is IntentState.PREPARED else None)
    later = {**later, "attempts": {"N": "2"}, "last_token": {"N": "3"}}
    s = Script([got_item(later)])
    with pytest.raises(IntentError, match=r"changed meanwhile.*attempt 1.*attempt 2"):
        _resolve(s, Resolution.RETRY, attempt=1)
    assert s.ops == ["dynamodb.GetItem"]  # nothing written, nothing sent


def test_a_decision_naming_the_attempt_it_read_resolves_and_binds_its_write() -> None:
    s = Script(
        [
            got_item(intent_item(IntentState.AMBIGUOUS, attempts=2)),
            ok(),
            got_item(queued_after_unpark()),
            ok({"MessageId": "mid-1"}),
            ok(),
        ]
    )
    got = _resolve(s, Resolution.RETRY, attempt=2)
    intent = s.calls[1].params["TransactItems"][0]["Update"]
    assert condition_text(intent) == "(state = 'ambiguous' AND attempts = 2)"
    assert got.intent.state is IntentState.PREPARED


def test_a_resolution_whose_answer_was_lost_is_finished_by_resolving_again() -> None:
    # Regression (issue 14.6): the intent was settled, the job's unpark got no
    # answer, and a second resolve said "nothing to resolve" with the job parked.
    done = intent_item(IntentState.CONFIRMED, resolution="confirmed", resolved_by=WHO)
    s = Script(
        [
            got_item(done),
            ok({"Attributes": queued_after_unpark()}),
            ok({"MessageId": "mid-1"}),
            ok(),
        ]
    )
    got = _resolve(s, Resolution.CONFIRMED, "ch_1")
    assert s.ops == [
        "dynamodb.GetItem",
        "dynamodb.UpdateItem",
        "sqs.SendMessage",
        "dynamodb.UpdateItem",
    ]
    assert condition_text(s.calls[1].params) == "state = 'parked'"
    assert got.finished_earlier is True and got.job_requeued is True
    assert "already resolved (confirmed by alice@ops)" in got.note
    assert "still parked" in got.note
    ev = s.event("intent_resolution_finished")
    assert (ev["resolution"], ev["verdict"]) == ("confirmed", "resumed")


def _confirmed_late(seen: str = "ambiguous") -> dict[str, Any]:
    item = intent_item(IntentState.CONFIRMED)
    return {**item, "confirmed_late": {"S": seen}, "external_id": {"S": "ch_late"}}


@pytest.mark.parametrize("resolution", [Resolution.RETRY, Resolution.CONFIRMED])
def test_a_decision_on_an_intent_its_own_late_answer_confirmed_resumes_the_job_only(
    resolution: Resolution,
) -> None:
    """Soak seed 1808311: the operator judged "not applied" before the paused call
    applied; its answer confirmed the intent. The decision is not applied: the parked
    job is resumed, and its next attempt replays the outcome."""
    s = Script(
        [
            got_item(_confirmed_late()),
            ok({"Attributes": queued_after_unpark()}),
            ok({"MessageId": "mid-1"}),
            ok(),
        ]
    )
    got = _resolve(s, resolution, "ch_1" if resolution is Resolution.CONFIRMED else None)
    assert got.finished_earlier is True and got.job_requeued is True
    assert "own answer" in got.note and "the decision was not applied" in got.note
    assert "ch_late" in got.note
    assert s.ops == [
        "dynamodb.GetItem",  # the intent, as it is: nothing of it is written
        "dynamodb.UpdateItem",
        "sqs.SendMessage",
        "dynamodb.UpdateItem",
    ]
    assert "intent_resolved" not in s.event_names()


def test_a_decision_whose_write_meets_a_late_answer_resumes_the_job_instead() -> None:
    """The late answer lands between the resolve's read and its write."""
    s = Script(
        [
            got_item(intent_item(IntentState.AMBIGUOUS)),
            cancelled("ConditionalCheckFailed", "None"),
            got_item(_confirmed_late()),
            ok({"Attributes": queued_after_unpark()}),
            ok({"MessageId": "mid-1"}),
            ok(),
        ]
    )
    got = _resolve(s, Resolution.RETRY, attempt=1)
    assert got.finished_earlier is True
    assert s.event("intent_resolution_finished")["verdict"] == "resumed"


@pytest.mark.parametrize("resolution", [Resolution.ABANDON, Resolution.NEW_OPERATION])
def test_abandoning_an_intent_its_late_answer_confirmed_is_refused_with_the_fact(
    resolution: Resolution,
) -> None:
    """An abandon or a new operation would undo or repeat an effect that applied: the
    operator is told, and decides again knowing it."""
    s = Script([got_item(_confirmed_late())])
    with pytest.raises(IntentNotAmbiguous, match=r"own answer.*ch_late") as caught:
        _resolve(s, resolution)
    assert caught.value.final is True
    assert s.ops == ["dynamodb.GetItem"]
    s = Script(
        [
            got_item(intent_item(IntentState.AMBIGUOUS)),
            cancelled("ConditionalCheckFailed", "None"),
            got_item(_confirmed_late()),
        ]
    )
    with pytest.raises(IntentError, match=r"changed meanwhile \(now confirmed, by its attempt 1"):
        _resolve(s, resolution, attempt=1)


def test_resolving_again_sends_the_message_a_resolution_could_not_send() -> None:
    done = intent_item(IntentState.CONFIRMED, resolution="confirmed", resolved_by=WHO)
    left = queued_after_unpark(send_id=None)
    s = Script(
        [
            got_item(done),
            condition_failed(left),
            ok({"Attributes": queued_after_unpark()}),
            ok({"MessageId": "mid-1"}),
            ok(),
        ]
    )
    got = _resolve(s, Resolution.CONFIRMED, "ch_1")
    assert got.finished_earlier is True
    assert "queued without a message" in got.note
    assert s.event("intent_resolution_finished")["verdict"] == "resent"


def test_a_settled_intent_whose_job_moved_on_has_nothing_to_resolve() -> None:
    done = intent_item(IntentState.CONFIRMED, resolution="confirmed")
    s = Script([got_item(done), condition_failed(job_item(JOB, state=JobState.SUCCEEDED))])
    with pytest.raises(
        IntentNotAmbiguous, match="is confirmed, not ambiguous: nothing to resolve"
    ) as caught:
        _resolve(s, Resolution.CONFIRMED, "ch_1")
    assert (caught.value.state, caught.value.final) == ("confirmed", True)
    assert s.events == []  # the look at its job is not a resume attempt


@pytest.mark.parametrize("state", [IntentState.PREPARED, IntentState.IN_PROGRESS])
def test_resolving_an_open_intent_names_its_state(state: IntentState) -> None:
    s = Script([got_item(intent_item(state))])
    with pytest.raises(IntentNotAmbiguous, match=f"is {state.value}, not ambiguous") as caught:
        _resolve(s, Resolution.RETRY)
    assert caught.value.final is False  # a worker still owns it: not a no-op
    assert s.ops == ["dynamodb.GetItem"]


def test_resolving_a_missing_intent_is_intent_not_found() -> None:
    with pytest.raises(IntentNotFound, match=KEY):
        _resolve(Script([got_item(None)]), Resolution.ABANDON)


@pytest.mark.parametrize(
    ("job", "state"),
    [
        (job_item(JOB, state=JobState.RUNNING, token=3), JobState.RUNNING),
        (job_item(JOB, state=JobState.FAILED, token=3), JobState.FAILED),
        (None, None),
    ],
    ids=["running", "failed", "gone"],
)
def test_an_intent_whose_job_is_not_parked_is_settled_alone_and_the_operator_told(
    job: dict[str, Any] | None, state: JobState | None
) -> None:
    after = intent_item(IntentState.PREPARED, resolution="retry")
    s = Script(
        [
            got_item(intent_item(IntentState.AMBIGUOUS)),
            cancelled("None", "ConditionalCheckFailed", job=job),
            *([] if job is not None else [got_item(None)]),
            ok({"Attributes": after}),
        ]
    )
    got = _resolve(s, Resolution.RETRY)
    assert (got.job_requeued, got.job_state) == (False, state)
    assert "not re-enqueued" in got.note
    assert s.ops[-1] == "dynamodb.UpdateItem"  # the intent alone, no SendMessage
    assert condition_text(s.calls[-1].params) == "(state = 'ambiguous' AND attempts = 1)"
    assert s.event("intent_resolved")["resolution"] == "retry"
    assert s.event("job_resume_skipped")["state"] == (state.value if state else None)


def test_an_intent_resolved_meanwhile_by_someone_else_is_reported() -> None:
    now = intent_item(IntentState.ABANDONED, resolution="abandon", resolved_by="bob@ops")
    s = Script(
        [
            got_item(intent_item(IntentState.AMBIGUOUS)),
            cancelled("ConditionalCheckFailed", "None"),
            got_item(now),
        ]
    )
    with pytest.raises(IntentError, match=r"changed meanwhile \(now abandoned by bob@ops\)"):
        _resolve(s, Resolution.CONFIRMED, "ch_1")


def test_a_resolution_without_an_answer_says_to_run_it_again() -> None:
    s = Script([got_item(intent_item(IntentState.AMBIGUOUS)), unreachable()])
    with pytest.raises(OwnershipUnknown, match="run the same `sqs-lease intents resolve` again"):
        _resolve(s, Resolution.RETRY)


def test_a_resolution_whose_send_failed_says_the_job_is_queued_and_how_it_is_sent() -> None:
    s = Script(
        [
            got_item(intent_item(IntentState.AMBIGUOUS)),
            ok(),
            got_item(queued_after_unpark()),
            unreachable(),
            ok(),
        ]
    )
    with pytest.raises(AwsCallFailed, match=r"is queued \(intent .* resolved: retry\)") as caught:
        _resolve(s, Resolution.RETRY)
    assert "jobs resume job-1" in str(caught.value)
    assert "stranded sweep" in str(caught.value)
    assert s.event("intent_resolved")["resolution"] == "retry"


# =========================================================================== sweep_flow


def _sweep(
    s: Script, *, dry_run: bool = False, limit: int = 3, start_key: Any = None
) -> SweepReport:
    return s.run(
        sweep_flow(
            table(),
            queue_url=QUEUE,
            wall_now=WALL,
            older_than=60.0,
            limit=limit,
            send_id_prefix="sweep-a",
            dry_run=dry_run,
            start_key=start_key,
        )
    )


def _unsent(job_id: str, since: float, send_id: str | None = "send-1") -> dict[str, Any]:
    # What the index projects: keys, class, state, send id, message_sent.
    item = job_item(
        job_id,
        state=JobState.QUEUED,
        owner=None,
        token=0,
        attempt=0,
        send_id=send_id,
        unsent_since=since,
    )
    keep = ("job_id", "unsent", "unsent_since", "job_class", "state", "send_id", "message_sent")
    return {k: v for k, v in item.items() if k in keep}


def test_the_sweep_queries_the_sparse_index_oldest_first_and_never_scans() -> None:
    s = Script([ok({"Items": []})])
    report = _sweep(s)
    assert report == SweepReport((), more=False)
    q = s.calls[0]
    assert (q.op, q.params["IndexName"], q.params["Limit"]) == ("Query", "unsent", 3)
    assert q.params["ScanIndexForward"] is True
    # No cut on the stamp: the sweep judges each entry's age itself (soak seed 1469822).
    assert q.params["KeyConditionExpression"] == "#u = :u"
    assert s.events == []


def test_the_sweep_resends_each_stranded_record_under_a_new_send_id() -> None:
    items = [_unsent("j-a", WALL - 300), _unsent("j-b", WALL - 90, send_id=None)]
    s = Script(
        [
            ok({"Items": items}),
            ok({"Attributes": job_item("j-a", state=JobState.QUEUED, send_id="sweep-a.0")}),
            ok({"MessageId": "m-a"}),
            ok(),
            condition_failed(job_item("j-b", state=JobState.RUNNING)),
        ]
    )
    report = _sweep(s)
    assert [(j.job_id, j.verdict, j.send_id) for j in report.jobs] == [
        ("j-a", "resent", "sweep-a.0"),
        ("j-b", "moved", None),
    ]
    assert report.jobs[0].unsent_for == 300.0
    take = s.calls[1].params
    assert "send_id = 'send-1'" in condition_text(take)
    assert update_sets(take)["send_id"] == "'sweep-a.0'"
    assert json.loads(s.calls[2].params["MessageBody"])["send_id"] == "sweep-a.0"
    assert "attribute_not_exists (send_id)" in condition_text(s.calls[4].params)
    ev = s.event("stranded_swept")
    assert (ev["found"], ev["resent"], ev["moved"], ev["failed"], ev["more"]) == (2, 1, 1, 0, False)


def test_a_full_page_says_more_may_wait_and_a_dry_run_sends_nothing() -> None:
    items = [_unsent(f"j-{i}", WALL - 100 - i) for i in range(3)]
    s = Script([ok({"Items": items})])
    report = _sweep(s, dry_run=True)
    assert s.ops == ["dynamodb.Query"]
    assert report.more is True
    assert {j.verdict for j in report.jobs} == {"would_resend"}


def test_a_sweep_whose_send_fails_reports_it_and_gives_the_send_back() -> None:
    s = Script(
        [
            ok({"Items": [_unsent("j-a", WALL - 300)]}),
            ok({"Attributes": job_item("j-a", state=JobState.QUEUED, send_id="sweep-a.0")}),
            unreachable(),
            ok(),
        ]
    )
    report = _sweep(s)
    assert report.jobs[0].verdict == "failed"
    assert "EndpointConnectionError" in report.jobs[0].detail
    assert s.event("job_send_failed")["send_id"] == "sweep-a.0"


def test_a_stranded_record_this_version_cannot_read_is_reported_and_the_sweep_goes_on() -> None:
    """One unreadable record (an outside writer's state) in the unsent index affects
    only its own job: the sweep names it and still sends the others (before, the
    parse raised and the whole sweep failed, every round)."""
    weird = _unsent("j-x", WALL - 400)
    weird["state"] = {"S": "archived"}
    s = Script(
        [
            ok({"Items": [weird, _unsent("j-a", WALL - 300)]}),
            ok({"Attributes": job_item("j-a", state=JobState.QUEUED, send_id="sweep-a.1")}),
            ok({"MessageId": "m-a"}),
            ok(),
        ]
    )
    report = _sweep(s)
    assert [(j.job_id, j.verdict) for j in report.jobs] == [("j-x", "failed"), ("j-a", "resent")]
    assert "cannot be read" in report.jobs[0].detail
    bad = s.event("job_record_unreadable")
    assert (bad["job_id"], bad["stage"]) == ("j-x", "sweep")


def _dead(job_id: str, since: float, state: JobState = JobState.FAILED) -> dict[str, Any]:
    # An entry an older version's cancel (or park) left in the index: ended, never sent.
    item = _unsent(job_id, since)
    item["state"] = {"S": state.value}
    return item


def test_dead_entries_are_taken_out_and_read_past_so_a_stranded_job_behind_them_is_sent() -> None:
    # Issue 26 defect 2: the sweep read the oldest `limit` entries and answered
    # "moved" for each without removing it; `limit` dead ones hid every stranded job.
    page_1 = [_dead("dead-1", WALL - 500), _dead("dead-2", WALL - 400, JobState.PARKED)]
    last = {"job_id": {"S": "dead-2"}, "unsent": {"S": "unsent"}, "unsent_since": {"N": "1"}}
    s = Script(
        [
            ok({"Items": page_1, "LastEvaluatedKey": last}),
            ok(),  # dead-1 out of the index
            ok(),  # dead-2 out of the index
            ok({"Items": [_unsent("live", WALL - 300)]}),
            ok({"Attributes": job_item("live", state=JobState.QUEUED, send_id="sweep-a.2")}),
            ok({"MessageId": "m-live"}),
            ok(),
        ]
    )
    report = _sweep(s, limit=2)
    assert [(j.job_id, j.verdict) for j in report.jobs] == [
        ("dead-1", "cleared"),
        ("dead-2", "cleared"),
        ("live", "resent"),
    ]
    assert report.more is False
    clear = s.calls[1].params
    assert clear["Key"] == {"job_id": {"S": "dead-1"}}
    assert sorted(update_removes(clear)) == ["unsent", "unsent_since"]
    assert "NOT" in condition_text(clear)  # only while the record does not wait for a send
    assert s.calls[3].params["ExclusiveStartKey"] == last
    assert json.loads(s.calls[5].params["MessageBody"])["job_id"] == "live"
    ev = s.event("stranded_swept")
    assert (ev["cleared"], ev["resent"]) == (2, 1)


def test_an_entry_whose_take_finds_the_record_ended_is_cleared_and_does_not_count() -> None:
    # The index's copy said "waiting"; the record (ALL_OLD of the refused take) says
    # cancelled, still carrying the index attributes: out it goes.
    ended = job_item("j-a", state=JobState.FAILED, message_sent=False, unsent_since=WALL - 300)
    s = Script(
        [
            ok({"Items": [_unsent("j-a", WALL - 300), _unsent("j-b", WALL - 200)]}),
            condition_failed(ended),
            ok(),
            ok({"Attributes": job_item("j-b", state=JobState.QUEUED, send_id="sweep-a.1")}),
            ok({"MessageId": "m-b"}),
            ok(),
        ]
    )
    report = _sweep(s, limit=1)
    assert [(j.job_id, j.verdict) for j in report.jobs] == [("j-a", "cleared"), ("j-b", "resent")]
    assert report.more is True  # its limit of one job reached: more may wait


def test_the_sweep_stops_at_its_limit_of_jobs_it_acted_on_and_says_more_may_wait() -> None:
    items = [_unsent(f"j-{i}", WALL - 300 + i) for i in range(3)]
    s = Script([ok({"Items": items}), *[condition_failed(None)] * 2])
    report = _sweep(s, limit=2)
    assert [j.verdict for j in report.jobs] == ["moved", "moved"]
    assert report.more is True


def test_an_entry_that_looked_dead_but_waits_after_all_is_sent_not_cleared() -> None:
    # The index's copy said "failed"; a retry has queued the record again since (the
    # clear is refused on the record itself, ALL_OLD shows it waiting): send it.
    waiting = job_item(
        "j-a", state=JobState.QUEUED, message_sent=False, unsent_since=WALL - 90, send_id="r-1"
    )
    s = Script(
        [
            ok({"Items": [_dead("j-a", WALL - 300)]}),
            condition_failed(waiting),
            ok({"Attributes": job_item("j-a", state=JobState.QUEUED, send_id="sweep-a.0")}),
            ok({"MessageId": "m-a"}),
            ok(),
        ]
    )
    report = _sweep(s)
    assert [(j.job_id, j.verdict) for j in report.jobs] == [("j-a", "resent")]
    assert "send_id = 'r-1'" in condition_text(s.calls[2].params)
    assert "unsent_entry_cleared" not in s.event_names()


def test_a_dry_run_lists_no_dead_entry_and_writes_nothing() -> None:
    s = Script([ok({"Items": [_dead("dead", WALL - 500), _unsent("live", WALL - 300)]})])
    report = _sweep(s, dry_run=True)
    assert s.ops == ["dynamodb.Query"]
    assert [(j.job_id, j.verdict) for j in report.jobs] == [("live", "would_resend")]


# Soak seed 1469822 (I10): a writer whose wall clock ran 3.9 h ahead stamped a slot
# wait's unsent_since on it and died before its send. The age query (stamp <= now -
# grace) returned the entry only once the sweepers' clocks passed the stamp: the job
# waited hours for its message. The sweep compares no two machines' clocks now: an
# entry stamped beyond its own clock is stamped again on it.
AHEAD = 3.9 * 3600


def test_an_entry_stamped_ahead_of_the_sweepers_clock_is_stamped_again_on_it() -> None:
    young = _unsent("young", WALL - 30)  # inside the grace: its sender may be at work
    s = Script([ok({"Items": [young, _unsent("ahead", WALL + AHEAD)]}), ok()])
    report = _sweep(s)
    assert s.ops == ["dynamodb.Query", "dynamodb.UpdateItem"]  # the page reached the end
    stamp = s.calls[1].params
    assert stamp["Key"] == {"job_id": {"S": "ahead"}}
    cond = condition_text(stamp)
    assert "send_id = 'send-1'" in cond and f"unsent_since = {WALL + AHEAD!r}" in cond
    assert "state = 'queued'" in cond and "message_sent = False" in cond
    assert update_sets(stamp) == {"unsent_since": repr(WALL)}
    assert [(j.job_id, j.verdict, j.unsent_for) for j in report.jobs] == [
        ("ahead", "restamped", -AHEAD)
    ]
    assert (report.more, report.next_key) == (False, None)
    ev = s.event("unsent_restamped")
    assert (ev["job_id"], ev["send_id"], ev["ahead_by"]) == ("ahead", "send-1", AHEAD)
    assert s.event("stranded_swept")["restamped"] == 1


def test_once_stamped_again_it_is_due_after_the_grace_on_that_clock_and_is_sent() -> None:
    restamped = _unsent("ahead", WALL - 61)  # the record as the restamp left it, a grace on
    s = Script(
        [
            ok({"Items": [restamped]}),
            ok({"Attributes": job_item("ahead", state=JobState.QUEUED, send_id="sweep-a.0")}),
            ok({"MessageId": "m-a"}),
            ok(),
        ]
    )
    report = _sweep(s)
    assert [(j.job_id, j.verdict) for j in report.jobs] == [("ahead", "resent")]


def test_a_first_page_that_does_not_reach_the_index_end_queries_the_entries_ahead() -> None:
    young = [_unsent(f"young-{i}", WALL - 30 + i) for i in range(3)]
    full = {"Items": young, "LastEvaluatedKey": {"job_id": {"S": "young-2"}}}
    s = Script([ok(full), ok({"Items": [_unsent("ahead", WALL + AHEAD)]}), ok()])
    report = _sweep(s)
    assert s.ops == ["dynamodb.Query", "dynamodb.Query", "dynamodb.UpdateItem"]
    ahead_query = s.calls[1].params
    assert ahead_query["KeyConditionExpression"] == "#u = :u AND #t > :t"
    assert ahead_query["ExpressionAttributeValues"][":t"] == {"N": repr(WALL + 60.0)}
    assert [(j.job_id, j.verdict) for j in report.jobs] == [("ahead", "restamped")]
    assert report.more is False  # nothing after a young entry is due


def test_entries_ahead_after_the_limit_are_still_stamped_again() -> None:
    due = [_unsent(f"j-{i}", WALL - 300 + i) for i in range(2)]
    taken = [
        ok({"Attributes": job_item(f"j-{i}", state=JobState.QUEUED, send_id=f"sweep-a.{i}")})
        for i in range(2)
    ]
    s = Script(
        [
            ok({"Items": [*due, _unsent("ahead", WALL + AHEAD)]}),
            taken[0],
            ok({"MessageId": "m-0"}),
            ok(),
            ok(),
        ]
    )
    report = _sweep(s, limit=1)
    assert [(j.job_id, j.verdict) for j in report.jobs] == [
        ("j-0", "resent"),
        ("ahead", "restamped"),
    ]
    assert report.more is True and report.next_key == {
        "job_id": {"S": "j-0"},
        "unsent": {"S": "unsent"},
        "unsent_since": {"N": repr(WALL - 300)},
    }


def test_an_entry_that_moved_on_before_its_restamp_is_left_to_its_sender() -> None:
    s = Script(
        [
            ok({"Items": [_unsent("ahead", WALL + AHEAD)]}),
            condition_failed(job_item("ahead", state=JobState.RUNNING)),
        ]
    )
    report = _sweep(s)
    assert report.jobs == ()
    assert "unsent_restamped" not in s.event_names()


def test_a_dry_run_lists_an_entry_stamped_ahead_and_writes_nothing() -> None:
    s = Script([ok({"Items": [_unsent("ahead", WALL + AHEAD)]})])
    report = _sweep(s, dry_run=True)
    assert s.ops == ["dynamodb.Query"]
    assert [(j.job_id, j.verdict) for j in report.jobs] == [("ahead", "would_restamp")]


def test_a_dead_entry_stamped_ahead_is_taken_out_so_it_takes_no_place_in_that_page() -> None:
    s = Script([ok({"Items": [_dead("dead", WALL + AHEAD)]}), ok()])
    report = _sweep(s)
    assert [(j.job_id, j.verdict) for j in report.jobs] == [("dead", "cleared")]
    assert {"unsent", "unsent_since"} <= set(update_removes(s.calls[1].params))


def test_a_failed_query_for_entries_ahead_is_journaled_and_the_sweep_reports_the_rest() -> None:
    page = {
        "Items": [_unsent("j-a", WALL - 300), _unsent("young", WALL - 1)],
        "LastEvaluatedKey": {"job_id": {"S": "young"}},
    }
    s = Script(
        [
            ok(page),
            ok({"Attributes": job_item("j-a", state=JobState.QUEUED, send_id="sweep-a.0")}),
            ok({"MessageId": "m-a"}),
            ok(),
            err(ErrorKind.THROTTLED, "ProvisionedThroughputExceededException"),
        ]
    )
    report = _sweep(s)
    assert [(j.job_id, j.verdict) for j in report.jobs] == [("j-a", "resent")]
    assert (
        s.event("unsent_restamp_failed")["error_code"] == "ProvisionedThroughputExceededException"
    )


def test_a_page_after_the_first_does_not_query_ahead_again() -> None:
    start = {"job_id": {"S": "x"}, "unsent": {"S": "unsent"}, "unsent_since": {"N": "1"}}
    full = {"Items": [_unsent("young", WALL - 1)], "LastEvaluatedKey": {"job_id": {"S": "y"}}}
    s = Script([ok(full)])
    _sweep(s, start_key=start)
    assert s.ops == ["dynamodb.Query"]


@pytest.mark.parametrize(
    "write",
    [
        lambda t: t.cancel("j", "by request", WALL),
        lambda t: t.park_undelivered("j", job_class="c", send_id="s", reason="r", wall_now=WALL),
        lambda t: t.park_dead_lettered("j", job_class="c", send_id="s", reason="r", wall_now=WALL),
        lambda t: t.mark_sent("j", "s", WALL),
        lambda t: t.claim("j", "w", WALL, 60, job_class="c", send_id="s"),
    ],
    ids=["cancel", "park_undelivered", "park_dead_lettered", "mark_sent", "claim"],
)
def test_every_write_that_ends_parks_sends_or_claims_a_waiting_record_leaves_the_index(
    write: Any,
) -> None:
    # Issue 26 defect 2: a cancel (or a park) of a never-sent record left it in the
    # unsent index for good.
    params = write(table()).params
    assert {"unsent", "unsent_since"} <= set(update_removes(params))


def test_a_table_without_the_index_is_told_how_to_add_it() -> None:
    s = Script(
        [
            err(
                ErrorKind.INVALID,
                "ValidationException",
                message="The table does not have the specified index: unsent",
            )
        ]
    )
    with pytest.raises(ResourceMissing, match="sqs-lease tables create"):
        _sweep(s)


def test_a_resolution_cancelled_for_a_transient_reason_is_retried_not_settled_alone() -> None:
    # Soak seed 300478: the one transaction was cancelled for TransactionConflict
    # (nothing applied), which the flow read as "the job is not parked": it settled
    # the intent alone and left the parked job parked, a half-done resolution.
    s = Script(
        [
            got_item(intent_item(IntentState.AMBIGUOUS)),
            cancelled("TransactionConflict", "None"),
            ok(),
            got_item(queued_after_unpark()),
            ok({"MessageId": "mid-1"}),
            ok(),
        ]
    )
    got = _resolve(s, Resolution.CONFIRMED, "ch_1")
    assert s.ops[:3] == [
        "dynamodb.GetItem",
        "dynamodb.TransactWriteItems",
        "dynamodb.TransactWriteItems",
    ]
    assert got.job_requeued is True
    assert "job_resume_skipped" not in s.event_names()
    assert "dynamodb.UpdateItem" not in s.ops[:-1]  # never the intent alone


def test_a_resolution_cancelled_transiently_every_time_says_to_run_it_again() -> None:
    conflict = cancelled("ThrottlingError", "None")
    s = Script([got_item(intent_item(IntentState.AMBIGUOUS))] + [conflict] * 7)
    with pytest.raises(OwnershipUnknown, match="nothing was resolved"):
        _resolve(s, Resolution.RETRY)
    assert "intent_resolved" not in s.event_names()
