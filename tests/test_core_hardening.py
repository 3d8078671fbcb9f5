"""Core flows, driven by hand: records the code cannot read, DynamoDB's permanent
refusals and size limits, unknown job classes, and the one event per lost lease."""

from __future__ import annotations

from typing import Any

import botocore.exceptions
import pytest
from core_harness import (
    DLQ,
    QUEUE,
    TABLE,
    WORKER,
    Script,
    condition_equalities,
    condition_failed,
    condition_text,
    delivery,
    job_item,
    job_view,
    local_lease,
    ok,
    put,
    table,
    unreachable,
    update_sets,
)

from sqs_lease import LimitExceeded, RecordUnreadable
from sqs_lease._aws import classify
from sqs_lease._core.calls import Err, ErrorKind, Outcome
from sqs_lease._core.claiming import NotClaimed, admit_flow
from sqs_lease._core.endwrites import EndRequest, commit_flow, retry_flow
from sqs_lease._core.heartbeats import (
    Beat,
    BeatStatus,
    HeartbeatReport,
    LossSource,
    apply_beats,
    gave_back,
    heartbeat_flow,
    lose,
)
from sqs_lease._core.lease import Drop, LeaseStatus
from sqs_lease._core.limits import ITEM_LIMIT, PARTITION_KEY_LIMIT, check_key, check_payload
from sqs_lease._core.records import JobState
from sqs_lease._errors import AttemptTimedOut, LeaseLost
from sqs_lease._schema.views import view_of

WALL = 1_700_000_500.0


def _weird(job_id: str, **kw: Any) -> dict[str, Any]:
    item = job_item(job_id, **kw)
    item["state"] = {"S": "weird"}  # edited by hand, or written by a newer version
    return item


def _validation(message: str) -> Err:
    return Err(ErrorKind.VALIDATION, "ValidationException", message=message)


# =========================================================================== 14.4 unreadable


def test_a_record_with_an_unknown_state_raises_a_typed_error_naming_the_job() -> None:
    with pytest.raises(RecordUnreadable, match="job-7") as info:
        view_of(_weird("job-7"))
    assert info.value.job_id == "job-7"
    with pytest.raises(RecordUnreadable):
        view_of({**job_item("job-8"), "token": {"S": "three"}})


def test_one_unreadable_record_leaves_the_other_jobs_of_the_heartbeat_round_confirmed() -> None:
    leases = [local_lease(f"job-{n}", token=2) for n in "abc"]
    s = Script(
        [
            ok({"Successful": [{"Id": "0"}, {"Id": "1"}, {"Id": "2"}]}, sent_at=100.0),
            ok(
                {
                    "Responses": {
                        TABLE: [
                            job_item("job-a", token=2),
                            _weird("job-b", token=2),
                            job_item("job-c", token=2),
                        ]
                    },
                    "UnprocessedKeys": {},
                }
            ),
        ]
    )
    report = s.run(
        heartbeat_flow(table(), queue_url=QUEUE, leases=leases, worker_id=WORKER, wall_now=WALL)
    )
    assert {j: b.status for j, b in report.beats.items()} == {
        "job-a": "ok",
        "job-b": "unknown",
        "job-c": "ok",
    }
    (bad,) = s.events_named("job_record_unreadable")
    assert (bad["job_id"], bad["stage"], bad["token"]) == ("job-b", "heartbeat", 2)
    assert "weird" in bad["reason"]
    assert [e["job_id"] for e in s.events_named("heartbeat_ok")] == ["job-a", "job-c"]
    assert [e["job_id"] for e in s.events_named("ownership_unknown")] == ["job-b"]


def test_a_claim_that_meets_an_unreadable_record_poisons_only_that_message() -> None:
    d = delivery("job-1", receipt_handle="rh-9")
    s = Script(
        [
            condition_failed(_weird("job-1", state="running")),
            ok({"MessageId": "dlq-1"}),  # the copy in the DLQ
            ok({}),  # the delete
        ]
    )
    res = s.run(
        admit_flow(
            table(),
            queue_url=QUEUE,
            dlq_url=DLQ,
            delivery=d,
            known_class=True,
            worker_id=WORKER,
            wall_now=WALL,
            lease_seconds=30,
            max_attempts=3,
            nonce="n-1",
        )
    )
    assert isinstance(res, NotClaimed) and res.outcome == "unreadable"
    assert s.ops == ["dynamodb.UpdateItem", "sqs.SendMessage", "sqs.DeleteMessage"]
    assert s.calls[1].params["QueueUrl"] == DLQ
    assert s.event("job_record_unreadable")["job_id"] == "job-1"
    assert s.event("message_poisoned")["moved_to_dlq"] is True


def test_a_fenced_write_that_meets_an_unreadable_record_is_rejected_not_a_crash() -> None:
    job = job_view("job-1", token=2)
    s = Script([condition_failed(_weird("job-1", token=3))])
    fin = s.run(
        commit_flow(
            table(),
            EndRequest(
                queue_url=QUEUE,
                job=job,
                delivery=delivery("job-1"),
                worker_id=WORKER,
                wall_now=WALL,
                nonce="n-1",
            ),
            result_json="{}",
            duration=1.0,
        )
    )
    assert (fin.outcome, fin.reason) == ("rejected", "job record unreadable")
    assert s.event_names() == ["job_record_unreadable", "result_rejected"]


# =========================================================================== 14.5 refusals


def _client_error(code: str, status: int, message: str = "m") -> botocore.exceptions.ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return botocore.exceptions.ClientError(response, "UpdateItem")


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("ValidationException", 400, ErrorKind.VALIDATION),
        ("ConditionalCheckFailedException", 400, ErrorKind.CONDITION_FAILED),
        ("ThrottlingException", 400, ErrorKind.THROTTLED),
        ("ProvisionedThroughputExceededException", 400, ErrorKind.THROTTLED),
        ("InternalServerError", 500, ErrorKind.SERVER),
        ("AccessDeniedException", 400, ErrorKind.INVALID),
    ],
)
def test_dynamodb_answers_are_classified_by_what_they_mean(
    code: str, status: int, kind: ErrorKind
) -> None:
    err = classify(_client_error(code, status), 1.0, 2.0)
    assert err.kind is kind
    # Only throttling and 5xx may have applied or be worth retrying as "unknown".
    assert err.unknown is (kind in (ErrorKind.THROTTLED, ErrorKind.SERVER))


def test_a_commit_dynamodb_refuses_as_invalid_ends_the_job_failed_naming_the_limit() -> None:
    job = job_view("job-1", token=2)
    too_big = _validation("Item size has exceeded the maximum allowed size")
    s = Script([too_big, ok({}), ok({})])  # the commit, the fail write, the delete
    fin = s.run(
        commit_flow(
            table(),
            EndRequest(
                queue_url=QUEUE,
                job=job,
                delivery=delivery("job-1"),
                worker_id=WORKER,
                wall_now=WALL,
                nonce="n-1",
            ),
            result_json='{"x": 1}',
            duration=1.0,
        )
    )
    assert fin.outcome == "failed"
    assert s.ops == ["dynamodb.UpdateItem", "dynamodb.UpdateItem", "sqs.DeleteMessage"]
    assert "ownership_unknown" not in s.event_names()
    refused = s.event("job_write_refused")
    assert refused["stage"] == "commit" and "400 KB" in refused["reason"]
    failed = s.event("job_failed")
    assert failed["error_code"] == "dynamodb_validation"
    assert "Item size has exceeded" in failed["reason"]


def test_a_requeue_dynamodb_refuses_as_invalid_fails_the_job_instead_of_retrying() -> None:
    job = job_view("job-1", token=2, attempt=1)
    s = Script([_validation("Invalid UpdateExpression: an attribute is missing"), ok({}), ok({})])
    fin = s.run(
        retry_flow(
            table(),
            EndRequest(
                queue_url=QUEUE,
                job=job,
                delivery=delivery("job-1"),
                worker_id=WORKER,
                wall_now=WALL,
                nonce="n-1",
            ),
            reason="ValueError: x",
            error_code="ValueError",
            delay=3,
            max_attempts=5,
        )
    )
    assert fin.outcome == "failed"
    assert "job_retry_scheduled" not in s.event_names()
    assert s.ops == ["dynamodb.UpdateItem", "dynamodb.UpdateItem", "sqs.DeleteMessage"]


def test_a_throttled_commit_is_retried_and_stays_ownership_unknown() -> None:
    throttled = Err(ErrorKind.THROTTLED, "ThrottlingException")
    s = Script([throttled, throttled, throttled])
    fin = s.run(
        commit_flow(
            table(),
            EndRequest(
                queue_url=QUEUE,
                job=job_view("job-1"),
                delivery=delivery("job-1"),
                worker_id=WORKER,
                wall_now=WALL,
                nonce="n-1",
            ),
            result_json="{}",
            duration=1.0,
        )
    )
    assert fin.outcome == "unknown"
    assert s.event_names() == ["ownership_unknown"]


def test_a_result_that_with_the_payload_breaks_the_item_limit_is_never_sent() -> None:
    payload = '{"doc":"' + "p" * 250_000 + '"}'
    result = '{"text":"' + "r" * 160_000 + '"}'  # under 350 KB alone
    job = job_view("job-1")
    job = type(job)(**{**job.__dict__, "payload_json": payload})
    s = Script([ok({}), ok({})])  # the fail write and the delete: no commit is sent
    fin = s.run(
        commit_flow(
            table(),
            EndRequest(
                queue_url=QUEUE,
                job=job,
                delivery=delivery("job-1"),
                worker_id=WORKER,
                wall_now=WALL,
                nonce="n-1",
            ),
            result_json=result,
            duration=1.0,
        )
    )
    assert fin.outcome == "failed"
    (write,) = s.calls_to("UpdateItem")
    assert ":" in write.params["UpdateExpression"]  # a fail write, not the commit
    assert "result" not in str(write.params["ExpressionAttributeNames"].values())
    failed = s.event("job_failed")
    assert failed["error_code"] == "result_too_large"
    assert str(ITEM_LIMIT) in failed["reason"] and "payload and result together" in failed["reason"]


def test_keys_are_measured_in_utf8_bytes_against_the_partition_key_limit() -> None:
    check_key("job id", "é" * 1024)  # 2048 bytes: at the limit
    with pytest.raises(LimitExceeded, match=rf"2050 bytes.*{PARTITION_KEY_LIMIT}"):
        check_key("job id", "é" * 1025)
    with pytest.raises(LimitExceeded, match=r"payload is \d+ bytes"):
        check_payload("job-1", '"' + "x" * ITEM_LIMIT + '"')


def test_a_claim_dynamodb_refuses_as_invalid_poisons_the_message_not_unknown() -> None:
    refused = _validation("The provided expression refers to an attribute that does not exist")
    s = Script([refused, ok({"MessageId": "d"}), ok({})])
    res = s.run(
        admit_flow(
            table(),
            queue_url=QUEUE,
            dlq_url=DLQ,
            delivery=delivery("job-1"),
            known_class=True,
            worker_id=WORKER,
            wall_now=WALL,
            lease_seconds=30,
            max_attempts=3,
            nonce="n-1",
        )
    )
    assert isinstance(res, NotClaimed) and res.outcome == "invalid"
    assert s.ops == ["dynamodb.UpdateItem", "sqs.SendMessage", "sqs.DeleteMessage"]
    assert "ownership_unknown" not in s.event_names()
    assert "does not exist" in s.event("message_poisoned")["reason"]


# =========================================================================== 7.6 unknown class


def _admit_unknown(receive_count: int, bound: int, answers: list[Outcome]) -> Script:
    s = Script(answers)
    res = s.run(
        admit_flow(
            table(),
            queue_url=QUEUE,
            dlq_url=DLQ,
            delivery=delivery("job-1", job_class="v2-only", receive_count=receive_count),
            known_class=False,
            worker_id=WORKER,
            wall_now=WALL,
            lease_seconds=30,
            max_attempts=3,
            unknown_class_receives=bound,
            rand=0.0,
            nonce="n-1",
        )
    )
    assert isinstance(res, NotClaimed)
    return s


def test_an_unknown_job_class_is_never_claimed_and_its_message_is_left_with_backoff() -> None:
    delays = []
    for count in (1, 2, 3):
        s = _admit_unknown(count, 10, [ok({})])
        assert s.ops == ["sqs.ChangeMessageVisibility"]  # no claim: no token moves
        delays.append(s.calls[0].params["VisibilityTimeout"])
        ev = s.event("job_class_unknown")
        assert (ev["job_class"], ev["receive_count"], ev["bound"]) == ("v2-only", count, 10)
        assert ev["delay"] == delays[-1]
    assert delays == sorted(delays) and delays[0] >= 1 and delays[2] > delays[0]


def test_an_unknown_job_class_goes_to_the_dlq_with_the_reason_at_the_bound() -> None:
    old = job_item("job-1", job_class="v2-only", state=JobState.QUEUED, owner=None, token=0)
    s = _admit_unknown(10, 10, [ok({"Attributes": old}), ok({"MessageId": "d"}), ok({})])
    assert s.ops == ["dynamodb.UpdateItem", "sqs.SendMessage", "sqs.DeleteMessage"]
    assert s.calls[1].params["QueueUrl"] == DLQ
    reason = s.calls[1].params["MessageAttributes"]["sqs_lease_reason"]["StringValue"]
    assert "'v2-only'" in reason and "10 receives" in reason and "parked" in reason
    assert s.event("job_class_unknown")["moved_to_dlq"] is True
    assert s.event("job_class_unknown")["record_parked"] is True


def test_a_running_job_whose_message_goes_to_the_dlq_is_parked_not_left_running() -> None:
    # Soak seed 207201: the owner was cut off past its lease, workers that do not
    # know the class received the message up to the bound and moved it to the DLQ,
    # and the record said `running` for good, owned by a lease nobody could extend.
    old = job_item("job-1", job_class="v2-only", state=JobState.RUNNING, owner="w-new", token=3)
    s = _admit_unknown(20, 20, [ok({"Attributes": old}), ok({"MessageId": "d"}), ok({})])
    assert s.ops == ["dynamodb.UpdateItem", "sqs.SendMessage", "sqs.DeleteMessage"]
    park = s.calls[0].params
    # Only the job's current message and the record's own class may park it, and
    # only while it is queued or running (never a finished or parked record).
    text = condition_text(park)
    terms = condition_equalities(park)
    assert (terms["send_id"], terms["job_class"]) == ("send-1", "v2-only"), text
    assert "queued" in text and "running" in text and "token" not in terms, text
    sets = update_sets(park)
    assert (sets["state"], sets["error_code"]) == ("'parked'", "'undeliverable'")
    assert sets["token"] == "token + 1"  # a lapsed owner that returns reads "lost"
    assert "attempt" not in sets  # nobody ran: no attempt spent or granted
    assert "jobs resume job-1" in sets["reason"] and "20 receives" in sets["reason"]
    ev = s.event("job_parked")
    assert (ev["undeliverable"], ev["previous_state"], ev["previous_owner"], ev["token"]) == (
        True,
        "running",
        "w-new",
        4,
    )


def test_an_unanswered_park_keeps_the_message_rather_than_orphan_the_record() -> None:
    s = _admit_unknown(20, 20, [unreachable(), ok({})])
    assert s.ops == ["dynamodb.UpdateItem", "sqs.ChangeMessageVisibility"]
    assert "message_poisoned" not in s.event_names()


def test_a_finished_job_is_not_parked_and_its_spent_message_still_goes_to_the_dlq() -> None:
    done = job_item("job-1", job_class="v2-only", state=JobState.SUCCEEDED, token=2)
    s = _admit_unknown(20, 20, [condition_failed(done), ok({"MessageId": "d"}), ok({})])
    assert s.ops == ["dynamodb.UpdateItem", "sqs.SendMessage", "sqs.DeleteMessage"]
    assert "job_parked" not in s.event_names()
    assert s.event("job_class_unknown")["record_parked"] is False


# =========================================================================== 7.14 one loss event


def test_a_lost_lease_is_journaled_once_per_attempt_however_it_is_learned() -> None:
    lease = local_lease("job-1", token=2)
    report = HeartbeatReport({"job-1": Beat("job-1", BeatStatus.LOST, reason="token moved to 3")})
    out = apply_beats([lease], report, started=1000.0)
    (ev,) = out.events
    assert ev.event == "heartbeat_lost"
    assert (ev.fields["token"], ev.fields["detected_by"], ev.fields["cancelled"]) == (
        2,
        "heartbeat",
        False,
    )
    # The rejected commit that follows learns the same loss: nothing more to journal.
    assert lose(lease, LossSource.COMMIT, "token moved from 2 to 3") is None
    assert apply_beats([lease], report, started=1001.0).events == ()


def test_a_loss_first_seen_by_a_rejected_commit_after_a_drop_is_journaled() -> None:
    lease = local_lease("job-1", token=1)
    put(lease, LeaseStatus.EXPIRED)  # the watchdog let it go after a pause
    ev = lose(lease, LossSource.COMMIT, "token moved from 1 to 2")
    assert ev is not None and ev.event == "heartbeat_lost"
    assert ev.fields["detected_by"] == "commit" and lease.status is LeaseStatus.LOST
    finished = local_lease("job-2", token=1)
    put(finished, LeaseStatus.DONE)  # the handler returned before it learned
    assert lose(finished, LossSource.COMMIT, "x", cancelled=True) is not None
    assert finished.status is LeaseStatus.CANCELLED


def test_an_attempt_that_gave_its_job_back_reports_no_loss_later() -> None:
    lease = local_lease("job-1", token=1)
    gave_back(lease, "watchdog: tool_timeout")
    assert lose(lease, LossSource.OWN_CLAIM, "token moved to 2 by this worker") is None


def test_a_handler_dropped_by_the_watchdog_hears_the_watchdog_after_the_job_went_back() -> None:
    """Seen on a loaded machine: the watchdog dropped an attempt for no progress, its
    ending gave the job back before the handler's wait woke, and the handler heard
    LeaseLost instead of AttemptTimedOut."""
    for why in (Drop.NO_PROGRESS, Drop.EFFECT_TIMEOUT, Drop.STAGE_BUDGET):
        lease = local_lease("job-1", token=1)
        lease.drop(why)
        gave_back(lease, f"watchdog: {why.value}")
        assert type(lease.stop_error()) is AttemptTimedOut, why
        assert lose(lease, LossSource.OWN_CLAIM, "token moved") is None
    lease = local_lease("job-1", token=1)
    gave_back(lease, "released")  # no drop first: nothing else to tell
    assert type(lease.stop_error()) is LeaseLost


def test_a_rejected_release_at_shutdown_journals_the_loss() -> None:
    from sqs_lease._core.endwrites import release_flow

    job = job_view("job-1", token=2)
    now = job_item("job-1", owner="w-9", token=3)
    s = Script([condition_failed(now)])
    released = s.run(
        release_flow(
            table(),
            queue_url=QUEUE,
            held=[(job, delivery("job-1"))],
            worker_id=WORKER,
            wall_now=WALL,
            reason="shutdown",
            nonce="n-1",
        )
    )
    assert released == 0
    lost = s.event("heartbeat_lost")
    assert (lost["token"], lost["detected_by"]) == (2, "release")
