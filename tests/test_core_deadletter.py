"""The DLQ reconciliation's decisions, driven by hand (no AWS): which DLQ message parks
its job, which leaves it alone, and what each write says (``_core/deadletter.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from core_harness import (
    DLQ,
    Script,
    condition_equalities,
    condition_failed,
    condition_text,
    delivery,
    job_item,
    ok,
    table,
    unreachable,
    update_removes,
    update_sets,
)

from sqs_lease._core.calls import Call
from sqs_lease._core.deadletter import (
    SQS_REDRIVE_REASON,
    DlqVerdict,
    judge,
    reconcile_dlq_flow,
)
from sqs_lease._core.messages import Delivery, message_body
from sqs_lease._core.records import DEAD_LETTERED_CODE, JobState
from sqs_lease._errors import AwsCallFailed

NOW = 1_700_000_500.0


def dlq_message(
    job_id: str = "job-1",
    *,
    send_id: str | None = "send-1",
    job_class: str = "ocr",
    receives: int = 3,
    reason: str | None = None,
    body: str | None = None,
) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "MessageId": f"m-{job_id}",
        "ReceiptHandle": f"rh-{job_id}",
        "Body": body if body is not None else message_body(job_id, job_class, send_id=send_id),
        "Attributes": {"ApproximateReceiveCount": str(receives), "SentTimestamp": "1700000000000"},
    }
    if reason is not None:
        raw["MessageAttributes"] = {
            "sqs_lease_reason": {"DataType": "String", "StringValue": reason}
        }
    return raw


def received(*messages: dict[str, Any]) -> Any:
    return ok({"Messages": list(messages)})


def run(script: Script, **kw: Any) -> Any:
    return script.run(reconcile_dlq_flow(table(), dlq_url=DLQ, wall_now=NOW, **kw))


def _dlv(send_id: str | None = "send-1", job_class: str = "ocr") -> Delivery:
    return delivery(send_id=send_id, job_class=job_class)


# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize(
    ("state", "record_send", "record_class", "expected"),
    [
        (JobState.QUEUED, "send-1", "ocr", DlqVerdict.PARKED),
        (JobState.RUNNING, "send-1", "ocr", DlqVerdict.PARKED),
        (JobState.QUEUED, "send-2", "ocr", DlqVerdict.SUPERSEDED),
        (JobState.RUNNING, "send-2", "ocr", DlqVerdict.SUPERSEDED),
        (JobState.QUEUED, "send-1", "pdf", DlqVerdict.CLASS_MISMATCH),
        (JobState.PARKED, "send-1", "ocr", DlqVerdict.ALREADY_PARKED),
        (JobState.SUCCEEDED, "send-1", "ocr", DlqVerdict.FINISHED),
        (JobState.FAILED, "send-2", "ocr", DlqVerdict.FINISHED),
    ],
)
def test_only_a_live_job_whose_current_message_is_in_the_dlq_is_to_be_parked(
    state: JobState, record_send: str, record_class: str, expected: DlqVerdict
) -> None:
    view = table().parse(job_item(state=state, send_id=record_send, job_class=record_class))
    assert judge(_dlv(), view) is expected


def test_a_message_without_a_send_id_is_current_only_for_a_record_no_sender_touched() -> None:
    untouched = table().parse(job_item(state=JobState.QUEUED, send_id=None))
    resent = table().parse(job_item(state=JobState.QUEUED, send_id="send-9"))
    assert judge(_dlv(send_id=None), untouched) is DlqVerdict.PARKED
    assert judge(_dlv(send_id=None), resent) is DlqVerdict.SUPERSEDED
    assert judge(_dlv(), None) is DlqVerdict.NO_RECORD


# ------------------------------------------------------------------ the flow


def test_a_queued_job_whose_message_sqs_moved_to_the_dlq_is_parked_naming_the_dlq() -> None:
    queued = job_item(state=JobState.QUEUED, owner=None, token=0, attempt=0)
    script = Script(
        [
            received(dlq_message(receives=3)),
            ok({"Item": queued}),
            ok({"Attributes": queued}),  # ALL_OLD
            received(),  # the DLQ holds no more
            ok({"Successful": [{"Id": "0"}]}),  # given back
        ]
    )
    report = run(script)

    (finding,) = report.findings
    assert finding.verdict is DlqVerdict.PARKED and finding.token == 1
    (park,) = script.calls_to("UpdateItem")
    # Only while still live, on this very message and class.
    cond = condition_text(park.params)
    assert "queued" in cond and "running" in cond, cond
    assert condition_equalities(park.params)["send_id"] == "send-1"
    assert condition_equalities(park.params)["job_class"] == "ocr"
    sets = update_sets(park.params)
    assert sets["state"] == "'parked'"
    assert sets["error_code"] == f"'{DEAD_LETTERED_CODE}'"
    assert "token + 1" in sets["token"]
    reason = sets["reason"]
    assert "work-dlq" in reason and "3 receives" in reason and SQS_REDRIVE_REASON in reason
    assert "sqs-lease jobs resume job-1" in reason
    # The message was sent: the record leaves the unsent index.
    assert "unsent" in update_removes(park.params)
    event = script.event("job_dead_lettered")
    assert (event["job_id"], event["token"], event["previous_state"]) == ("job-1", 1, "queued")
    assert (event["receive_count"], event["dlq"], event["by"]) == (3, "work-dlq", "cli")
    assert script.event("dlq_reconciled")["parked"] == 1
    # Every message looked at is made visible again.
    (give_back,) = script.calls_to("ChangeMessageVisibilityBatch")
    assert give_back.params["Entries"] == [
        {"Id": "0", "ReceiptHandle": "rh-job-1", "VisibilityTimeout": 0}
    ]


def test_a_running_job_whose_worker_crashed_is_parked_and_its_owner_fenced_out() -> None:
    running = job_item(state=JobState.RUNNING, token=4, attempt=4)
    script = Script(
        [
            received(dlq_message(reason="DynamoDB refused the claim: too large")),
            ok({"Item": running}),
            ok({"Attributes": running}),
            received(),
            ok({}),
        ]
    )
    (finding,) = run(script, by="sweep").findings
    assert finding.verdict is DlqVerdict.PARKED and finding.token == 5
    event = script.event("job_dead_lettered")
    assert (event["previous_state"], event["previous_owner"], event["by"]) == (
        "running",
        "w-1",
        "sweep",
    )
    # The worker's own reason for its DLQ copy is carried into the record's reason.
    assert "too large" in update_sets(script.calls_to("UpdateItem")[0].params)["reason"]


def test_a_job_re_sent_since_its_dlq_message_is_left_alone() -> None:
    resent = job_item(state=JobState.QUEUED, send_id="send-2", token=1)
    script = Script([received(dlq_message()), ok({"Item": resent}), received(), ok({})])
    (finding,) = run(script).findings
    assert finding.verdict is DlqVerdict.SUPERSEDED and "send-2" in finding.detail
    assert script.calls_to("UpdateItem") == []
    assert "dlq_reconciled" not in script.event_names()  # nothing changed


def test_a_park_refused_because_the_job_moved_on_is_judged_again_and_left() -> None:
    queued = job_item(state=JobState.QUEUED, token=0)
    claimed_through_resend = job_item(state=JobState.RUNNING, send_id="send-2", token=1)
    script = Script(
        [
            received(dlq_message()),
            ok({"Item": queued}),
            condition_failed(claimed_through_resend),
            received(),
            ok({}),
        ]
    )
    (finding,) = run(script).findings
    assert finding.verdict is DlqVerdict.SUPERSEDED
    assert finding.job_state is JobState.RUNNING
    assert "job_dead_lettered" not in script.event_names()


def test_a_finished_jobs_message_is_reported_and_deleted_only_when_asked() -> None:
    done = job_item(state=JobState.SUCCEEDED)
    left = Script([received(dlq_message()), ok({"Item": done}), received(), ok({})])
    (finding,) = run(left).findings
    assert finding.verdict is DlqVerdict.FINISHED and finding.job_state is JobState.SUCCEEDED
    assert left.calls_to("DeleteMessage") == []

    deleting = Script([received(dlq_message()), ok({"Item": done}), ok({}), received()])
    (finding,) = run(deleting, delete_finished=True).findings
    assert finding.verdict is DlqVerdict.DELETED
    (delete,) = deleting.calls_to("DeleteMessage")
    assert delete.params == {"QueueUrl": DLQ, "ReceiptHandle": "rh-job-1"}
    # A deleted message is not given back: nothing left to give back.
    assert deleting.calls_to("ChangeMessageVisibilityBatch") == []
    assert deleting.event("dlq_reconciled")["deleted"] == 1


def test_a_parked_job_a_missing_record_and_a_body_naming_no_job_are_reported_and_left() -> None:
    parked = job_item("job-1", state=JobState.PARKED)
    script = Script(
        [
            received(
                dlq_message("job-1"), dlq_message("job-2"), dlq_message("junk", body="not json")
            ),
            ok({"Item": parked}),
            ok({}),  # job-2: no record
            received(),
            ok({}),
        ]
    )
    verdicts = [f.verdict for f in run(script).findings]
    assert verdicts == [DlqVerdict.ALREADY_PARKED, DlqVerdict.NO_RECORD, DlqVerdict.NOT_A_JOB]
    assert script.calls_to("UpdateItem") == []


def test_a_dry_run_says_what_it_would_do_and_writes_and_deletes_nothing() -> None:
    queued = job_item("job-1", state=JobState.QUEUED)
    done = job_item("job-2", state=JobState.FAILED)
    script = Script(
        [
            received(dlq_message("job-1"), dlq_message("job-2")),
            ok({"Item": queued}),
            ok({"Item": done}),
            received(),
            ok({}),
        ]
    )
    report = run(script, dry_run=True, delete_finished=True)
    assert [f.verdict for f in report.findings] == [DlqVerdict.WOULD_PARK, DlqVerdict.WOULD_DELETE]
    assert script.calls_to("UpdateItem") == [] and script.calls_to("DeleteMessage") == []


def test_a_read_that_got_no_answer_is_a_failure_for_that_message_only() -> None:
    queued = job_item("job-2", state=JobState.QUEUED)
    script = Script(
        [
            received(dlq_message("job-1"), dlq_message("job-2")),
            unreachable(),
            ok({"Item": queued}),
            ok({"Attributes": queued}),
            received(),
            ok({}),
        ]
    )
    report = run(script)
    assert [f.verdict for f in report.findings] == [DlqVerdict.FAILED, DlqVerdict.PARKED]
    assert script.event("dlq_reconciled")["failed"] == 1


def test_the_limit_bounds_the_look_and_says_more_remain() -> None:
    msgs = [dlq_message(f"job-{i}") for i in range(3)]
    done = job_item(state=JobState.SUCCEEDED)
    script = Script([received(*msgs), ok({"Item": done}), ok({"Item": done}), ok({})])
    report = run(script, limit=2)
    assert len(report.findings) == 2 and report.more
    # The third was seen, not reconciled, and given back with the others.
    (give_back,) = script.calls_to("ChangeMessageVisibilityBatch")
    assert len(give_back.params["Entries"]) == 3


def test_one_receive_bound_stops_after_one_batch() -> None:
    done = job_item(state=JobState.SUCCEEDED)
    script = Script([received(dlq_message()), ok({"Item": done}), ok({})])
    report = run(script, limit=10, receives=1, wait_seconds=0)
    assert script.ops.count("sqs.ReceiveMessage") == 1
    assert script.calls_to("ReceiveMessage")[0].params["WaitTimeSeconds"] == 0
    assert report.more  # the one receive was not empty: others may wait


def test_a_failed_receive_raises_naming_the_dlq_after_giving_back_nothing() -> None:
    script = Script([unreachable()])
    with pytest.raises(AwsCallFailed, match="work-dlq"):
        run(script)


def test_a_reconciliation_closed_midway_closes_without_a_call() -> None:
    # A process that dies mid-reconciliation (the simulator closes its flows): a
    # closed flow may not yield, so nothing is given back (the hold lapses by itself).
    # The finally that gave back raised "generator ignored GeneratorExit".
    flow = reconcile_dlq_flow(table(), dlq_url=DLQ, wall_now=NOW)
    first = next(flow)
    assert isinstance(first, Call) and first.op == "ReceiveMessage"
    got = flow.send(received(dlq_message(receives=3)))
    assert isinstance(got, Call) and got.op == "GetItem"  # the process dies here
    flow.close()


def test_a_reconciliation_that_fails_midway_still_gives_back_what_it_holds() -> None:
    done = job_item(state=JobState.SUCCEEDED)
    script = Script(
        [
            received(dlq_message(receives=3)),
            ok({"Item": done}),  # finished: reported, no write
            unreachable(),  # the next receive fails: the flow raises ...
            ok({"Successful": [{"Id": "0"}]}),  # ... after giving back what it holds
        ]
    )
    with pytest.raises(AwsCallFailed):
        run(script, receives=2)
    back = script.calls_to("ChangeMessageVisibilityBatch")
    assert [e["ReceiptHandle"] for e in back[0].params["Entries"]] == ["rh-job-1"]
