"""Every branch of the protocol core's flows, driven by hand (no AWS, no moto, no network).

Each test scripts the outcomes a driver would send back and checks the calls the
flow made (with the real ``JobTable`` building the request parameters), the
events it emitted and the value it returned.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from core_harness import (
    DLQ,
    NONCE,
    OTHER,
    QUEUE,
    TABLE,
    WORKER,
    Script,
    assert_fenced,
    condition_failed,
    condition_text,
    delivery,
    err,
    job_item,
    job_view,
    local_lease,
    ok,
    put,
    table,
    unreachable,
    update_adds,
    update_removes,
    update_sets,
)

from sqs_lease._core.calls import Call, Emit, Err, ErrorKind, Ok, Outcome, sqs_code_is
from sqs_lease._core.cancelling import cancel_flow, cancel_job_flow
from sqs_lease._core.claiming import Claimed, NotClaimed, claim_flow
from sqs_lease._core.endwrites import (
    EndRequest,
    commit_flow,
    fail_flow,
    park_flow,
    poison_flow,
    release_flow,
    retry_flow,
)
from sqs_lease._core.fencing import Finish, FinishOutcome
from sqs_lease._core.fifo import copy_deduplication_id, deduplication_id
from sqs_lease._core.heartbeats import (
    Beat,
    BeatStatus,
    HeartbeatReport,
    apply_beats,
    heartbeat_flow,
)
from sqs_lease._core.lease import LeaseStatus, LocalLease
from sqs_lease._core.messages import Delivery, Poison, message_body, parse_message, receive_flow
from sqs_lease._core.records import JobState, JobView
from sqs_lease._core.sending import SubmitResult, submit_flow
from sqs_lease._core.stages import NextStage, continue_flow
from sqs_lease._errors import (
    AwsCallFailed,
    JobNotFound,
    ResourceMissing,
    SubmitConflict,
)
from sqs_lease._schema.views import view_of

WALL = 1_700_000_500.0


def _key_id(key: Mapping[str, Any]) -> str:
    return str(key["job_id"]["S"])


# =========================================================================== harness


def test_script_refuses_unscripted_calls_and_unused_outcomes() -> None:
    # The harness itself must fail loudly, or every "no further call" check is void.
    with pytest.raises(AssertionError, match=r"unscripted call dynamodb\.UpdateItem"):
        Script([]).run(cancel_flow(table(), job_id="j", reason="r", wall_now=WALL))
    with pytest.raises(AssertionError, match="1 scripted outcome"):
        Script([ok({"Attributes": job_item("j", state=JobState.FAILED)}), ok()]).run(
            cancel_flow(table(), job_id="j", reason="r", wall_now=WALL)
        )


# =========================================================================== parse_message


def _message(body: str, count: str | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"MessageId": "m-1", "ReceiptHandle": "rh-1", "Body": body}
    if count is not None:
        msg["Attributes"] = {"ApproximateReceiveCount": count}
    return msg


def test_parse_message_valid() -> None:
    body = message_body("job-1", "ocr", send_id="s-1")
    got = parse_message(_message(body), received_at=12.5, visibility=30)
    assert got == Delivery(
        message_id="m-1",
        receipt_handle="rh-1",
        job_id="job-1",
        job_class="ocr",
        receive_count=1,
        received_at=12.5,
        visibility=30,
        send_id="s-1",
        body=body,
    )


def test_a_message_from_an_older_producer_has_no_send_id() -> None:
    got = parse_message(_message(message_body("job-1", "ocr")), 0.0, 30)
    assert isinstance(got, Delivery) and got.send_id is None


@pytest.mark.parametrize("send_id", ['""', "7", 'null, "x": 1'])
def test_a_send_id_that_is_not_a_non_empty_string_is_poison(send_id: str) -> None:
    body = '{"job_id": "job-1", "job_class": "ocr", "send_id": ' + send_id + "}"
    got = parse_message(_message(body), 0.0, 30)
    if send_id.startswith("null"):
        assert isinstance(got, Delivery) and got.send_id is None  # JSON null: no send id
    else:
        assert got == Poison(
            "m-1", "rh-1", "message send_id is not a non-empty string", "job-1", body
        )


def test_parse_message_reads_approximate_receive_count() -> None:
    got = parse_message(_message(message_body("job-1", "ocr"), count="4"), 0.0, 30)
    assert isinstance(got, Delivery)
    assert got.receive_count == 4


def test_message_body_is_versioned_and_names_the_stage() -> None:
    assert json.loads(message_body("j", "c", stage="draft")) == {
        "v": 1,
        "job_id": "j",
        "job_class": "c",
        "stage": "draft",
    }
    assert "stage" not in json.loads(message_body("j", "c"))
    assert json.loads(message_body("j", "c", send_id="s-9"))["send_id"] == "s-9"


@pytest.mark.parametrize(
    ("body", "reason", "job_id"),
    [
        ("{not json", "message body is not JSON", None),
        ("", "message body is not JSON", None),
        ('["job-1", "ocr"]', "message body is not a JSON object", None),
        ('"job-1"', "message body is not a JSON object", None),
        ('{"job_class": "ocr"}', "message names no job_id", None),
        ('{"job_id": "", "job_class": "ocr"}', "message names no job_id", None),
        ('{"job_id": 7, "job_class": "ocr"}', "message names no job_id", None),
        ('{"job_id": "job-1"}', "message names no job_class", "job-1"),
        ('{"job_id": "job-1", "job_class": ""}', "message names no job_class", "job-1"),
    ],
)
def test_parse_message_poison(body: str, reason: str, job_id: str | None) -> None:
    got = parse_message(_message(body), 0.0, 30)
    assert got == Poison("m-1", "rh-1", reason, job_id, body=body)  # the bytes go to the DLQ


def _receive(script: Script, max_messages: int = 10) -> list[Delivery | Poison]:
    return script.run(
        receive_flow(queue_url=QUEUE, max_messages=max_messages, wait_seconds=20, visibility=45)
    )


def test_receive_parses_messages_with_lease_counted_from_before_the_request() -> None:
    messages = [
        _message(message_body("job-1", "ocr"), count="2"),
        {"MessageId": "m-2", "ReceiptHandle": "rh-2", "Body": "nope"},
    ]
    s = Script([ok({"Messages": messages}, sent_at=500.0, received_at=519.0)])
    got = _receive(s)
    assert got == [
        Delivery(
            "m-1",
            "rh-1",
            "job-1",
            "ocr",
            2,
            received_at=500.0,
            visibility=45,
            body=messages[0]["Body"],
        ),
        Poison("m-2", "rh-2", "message body is not JSON", body="nope"),
    ]
    params = s.calls[0].params
    assert (params["QueueUrl"], params["WaitTimeSeconds"], params["VisibilityTimeout"]) == (
        QUEUE,
        20,
        45,
    )
    assert "ApproximateReceiveCount" in params["MessageSystemAttributeNames"]


@pytest.mark.parametrize(("asked", "sent"), [(0, 1), (1, 1), (10, 10), (25, 10)])
def test_receive_clamps_batch_size_to_sqs_limits(asked: int, sent: int) -> None:
    s = Script([ok({})])
    assert _receive(s, max_messages=asked) == []
    assert s.calls[0].params["MaxNumberOfMessages"] == sent


def test_receive_failure_is_journaled_and_empty() -> None:
    s = Script([unreachable()])
    assert _receive(s) == []
    assert s.event("receive_failed") == {"error_code": "EndpointConnectionError"}


def test_receive_from_missing_queue_raises() -> None:
    s = Script([err(ErrorKind.NOT_FOUND, "AWS.SimpleQueueService.NonExistentQueue")])
    with pytest.raises(ResourceMissing, match="NonExistentQueue"):
        _receive(s)


# =========================================================================== submit


def _submit(
    script: Script,
    payload_hash: str = "hash-aaa",
    job_class: str = "ocr",
    *,
    send_id: str = "send-2",
    resend_after: float = 60.0,
    payload_json: str = '{"page": 1}',
) -> SubmitResult:
    return script.run(
        submit_flow(
            table(),
            queue_url=QUEUE,
            job_id="job-1",
            job_class=job_class,
            payload_json=payload_json,
            payload_hash=payload_hash,
            wall_now=WALL,
            send_id=send_id,
            delay_seconds=5,
            resend_after=resend_after,
        )
    )


def test_submit_new_puts_then_sends_then_marks_sent() -> None:
    s = Script([ok(), ok({"MessageId": "mid-1"}), ok()])
    res = _submit(s)
    assert res == SubmitResult("job-1", True, "mid-1", "submitted", "send-2")
    assert s.ops == ["dynamodb.PutItem", "sqs.SendMessage", "dynamodb.UpdateItem"]
    put, send, mark = s.calls
    assert put.params["TableName"] == TABLE
    assert condition_text(put.params) == "attribute_not_exists (job_id)"
    assert put.params["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"
    item = view_of(put.params["Item"])
    assert (item.state, item.token, item.attempt, item.message_sent) == (
        JobState.QUEUED,
        0,
        0,
        False,
    )
    # The record names the one send allowed, and sits in the sparse unsent index.
    assert (item.send_id, item.unsent_since) == ("send-2", WALL)
    assert put.params["Item"]["unsent"] == {"S": "unsent"}
    assert item.payload_hash == "hash-aaa"
    assert put.params["Item"]["payload"] == {"S": '{"page": 1}'}
    assert send.params["QueueUrl"] == QUEUE
    assert send.params["DelaySeconds"] == 5
    assert json.loads(send.params["MessageBody"]) == {
        "v": 1,
        "job_id": "job-1",
        "job_class": "ocr",
        "send_id": "send-2",
    }
    assert mark.params["Key"] == {"job_id": {"S": "job-1"}}
    assert condition_text(mark.params) == "send_id = 'send-2'"
    assert update_sets(mark.params) == {"message_sent": "True"}
    assert sorted(update_removes(mark.params)) == ["unsent", "unsent_since"]
    ev = s.event("job_submitted")
    assert (ev["message_id"], ev["resent"], ev["payload_hash"], ev["send_id"]) == (
        "mid-1",
        False,
        "hash-aaa",
        "send-2",
    )


def test_submit_duplicate_already_sent_is_a_noop() -> None:
    existing = job_item(state=JobState.SUCCEEDED, message_sent=True, payload_hash="hash-aaa")
    s = Script([condition_failed(existing)])
    res = _submit(s)
    assert s.ops == ["dynamodb.PutItem"]  # no SendMessage, no mark_sent
    assert res.created is False
    assert res.message_id is None
    assert "already submitted" in res.note
    assert "succeeded" in res.note
    assert s.event("job_submit_duplicate") == {
        "job_id": "job-1",
        "state": "succeeded",
        "message": "sent",
    }


def test_two_concurrent_submits_send_one_message_and_the_second_is_told_why() -> None:
    # The first submitter's record is there, its message not yet sent (it is at work):
    # the second one sends nothing, and says who sends and what recovers a failure.
    first = job_item(state=JobState.QUEUED, owner=None, token=0, attempt=0, unsent_since=WALL - 0.5)
    s = Script([condition_failed(first)])
    res = _submit(s)
    assert s.ops == ["dynamodb.PutItem"]  # no SendMessage: one message for one job
    assert (res.created, res.message_id, res.send_id) == (False, None, None)
    assert "another submission is sending its message" in res.note
    assert "stranded sweep" in res.note
    ev = s.event("job_submit_duplicate")
    assert (ev["message"], ev["send_id"]) == ("pending", "send-1")


def test_a_resubmission_takes_over_a_send_older_than_the_grace_and_retires_the_old_id() -> None:
    stranded = job_item(
        state=JobState.QUEUED, owner=None, token=0, attempt=0, unsent_since=WALL - 61.0
    )
    s = Script([condition_failed(stranded), ok(), ok({"MessageId": "mid-2"}), ok()])
    res = _submit(s)
    assert s.ops == [
        "dynamodb.PutItem",
        "dynamodb.UpdateItem",
        "sqs.SendMessage",
        "dynamodb.UpdateItem",
    ]
    take = s.calls[1].params
    assert condition_text(take) == (
        "((state = 'queued' AND message_sent = False) AND send_id = 'send-1')"
    )
    assert update_sets(take)["send_id"] == "'send-2'"
    assert json.loads(s.calls[2].params["MessageBody"])["send_id"] == "send-2"
    assert res == SubmitResult(
        "job-1", False, "mid-2", "record existed without a message: message sent", "send-2"
    )
    ev = s.event("job_send_taken")
    assert (ev["previous_send_id"], ev["send_id"], ev["by"]) == ("send-1", "send-2", "submit")
    assert s.event("job_submitted")["resent"] is True


def test_a_resubmission_takes_over_at_once_when_the_first_sender_gave_the_send_back() -> None:
    released = job_item(
        state=JobState.QUEUED, owner=None, token=0, attempt=0, unsent_since=WALL, send_id=None
    )
    s = Script([condition_failed(released), ok(), ok({"MessageId": "mid-2"}), ok()])
    _submit(s)
    assert "attribute_not_exists (send_id)" in condition_text(s.calls[1].params)


def test_a_resubmission_that_loses_the_take_over_sends_nothing() -> None:
    stranded = job_item(
        state=JobState.QUEUED, owner=None, token=0, attempt=0, unsent_since=WALL - 61.0
    )
    now = job_item(state=JobState.QUEUED, owner=None, token=0, attempt=0, send_id="send-9")
    s = Script([condition_failed(stranded), condition_failed(now)])
    res = _submit(s)
    assert s.ops == ["dynamodb.PutItem", "dynamodb.UpdateItem"]
    assert (res.created, res.message_id) == (False, None)
    assert "another sender took the send over" in res.note
    assert s.event("job_submit_duplicate")["message"] == "taken"


def test_a_retried_take_over_that_had_applied_sends_the_message() -> None:
    # The take-over applied, its answer was lost, the SDK's second try is refused: the
    # record names this submission's own send id and no message, so it sends (found by
    # the simulation, concurrent_submits seed 129: the job was left without a message).
    stranded = job_item(
        state=JobState.QUEUED, owner=None, token=0, attempt=0, unsent_since=WALL - 61.0
    )
    ours = job_item(
        state=JobState.QUEUED,
        owner=None,
        token=0,
        attempt=0,
        unsent_since=WALL,
        send_id="send-2",
        message_sent=False,
    )
    s = Script(
        [condition_failed(stranded), condition_failed(ours), ok({"MessageId": "mid-2"}), ok()]
    )
    res = _submit(s)
    assert s.ops == [
        "dynamodb.PutItem",
        "dynamodb.UpdateItem",
        "sqs.SendMessage",
        "dynamodb.UpdateItem",
    ]
    assert (res.message_id, res.send_id) == ("mid-2", "send-2")
    assert s.event("job_send_taken")["send_id"] == "send-2"


def test_a_retried_put_that_had_applied_is_recognised_by_its_own_send_id() -> None:
    ours = job_item(
        state=JobState.QUEUED, owner=None, token=0, attempt=0, unsent_since=WALL, send_id="send-2"
    )
    s = Script([condition_failed(ours), ok({"MessageId": "mid-1"}), ok()])
    res = _submit(s)
    assert s.ops == ["dynamodb.PutItem", "sqs.SendMessage", "dynamodb.UpdateItem"]
    assert (res.created, res.message_id, res.note) == (True, "mid-1", "submitted")


def test_a_resubmission_taking_over_an_unsent_continuation_sends_the_records_current_stage() -> (
    None
):
    # Issue 26 defect 6: the job is at its second stage, its continuation unsent (the
    # worker died after the checkpoint); the producer resubmits naming the first stage.
    # The message must name the record's stage: the worker validates its input with
    # that stage's model.
    at_render = job_item(
        state=JobState.QUEUED,
        owner=None,
        token=1,
        attempt=0,
        stage="render",
        send_id="stage.1.render",
        unsent_since=WALL - 61.0,
        message_sent=False,
    )
    s = Script([condition_failed(at_render), ok(), ok({"MessageId": "mid-2"}), ok()])
    s.run(
        submit_flow(
            table(),
            queue_url=QUEUE,
            job_id="job-1",
            job_class="ocr",
            payload_json='{"page": 1}',
            payload_hash="hash-aaa",
            wall_now=WALL,
            send_id="send-2",
            resend_after=60.0,
            stage="fetch",  # what the producer knows: the class's first stage
        )
    )
    (send,) = s.calls_to("SendMessage")
    body = json.loads(send.params["MessageBody"])
    assert (body["stage"], body["send_id"]) == ("render", "send-2")


def _fifo_submit(job_id: str, send_id: str) -> Mapping[str, Any]:
    s = Script([ok(), ok({"MessageId": "m"}), ok()])
    s.run(
        submit_flow(
            table(),
            queue_url=QUEUE + ".fifo",
            job_id=job_id,
            job_class="ocr",
            payload_json="{}",
            payload_hash="h",
            wall_now=WALL,
            send_id=send_id,
        )
    )
    (send,) = s.calls_to("SendMessage")
    return send.params


def test_a_fifo_send_is_deduplicated_per_job_and_per_send_not_by_the_send_id_alone() -> None:
    # Issue 26 defect 1: a send id is unique within its job only (a continuation's is
    # `stage.{token}.{next}`); SQS deduplicates across the whole queue.
    one, other = _fifo_submit("job-1", "same"), _fifo_submit("job-2", "same")
    assert one["MessageDeduplicationId"] != other["MessageDeduplicationId"]
    assert one["MessageDeduplicationId"] == deduplication_id("job-1", "same")
    assert _fifo_submit("job-1", "next")["MessageDeduplicationId"] != one["MessageDeduplicationId"]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("a.b", "c"), ("a", "b.c")),
        (("1:x", "y"), ("1", "x:y")),
        (("j", "s"), ("j", "s" * 200)),
        (("j" * 200, "s"), ("j" * 200, "t")),
    ],
)
def test_deduplication_ids_never_meet_for_two_different_sends(
    a: tuple[str, str], b: tuple[str, str]
) -> None:
    ids = {deduplication_id(*a), deduplication_id(*b)}
    assert len(ids) == 2
    assert all(0 < len(i) <= 128 for i in ids)
    assert copy_deduplication_id("poison", "m-1") not in ids | {deduplication_id("poison", "m-1")}


def test_every_fifo_send_in_the_package_takes_its_deduplication_id_from_one_place() -> None:
    # One rule, one place: each SendMessage names its FIFO parameters through
    # fifo_params, and each passes a deduplication id that _core.fifo made.
    import ast
    import pathlib

    import sqs_lease

    root = pathlib.Path(sqs_lease.__file__).parent
    seen = 0
    for path in root.rglob("*.py"):
        text = path.read_text()
        if path.name != "fifo.py":
            assert "MessageDeduplicationId" not in text, path
        for node in ast.walk(ast.parse(text)):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "fifo_params"):
                continue
            seen += 1
            (dedup,) = [k.value for k in node.keywords if k.arg == "dedup_id"]
            assert isinstance(dedup, ast.Call), (path, ast.unparse(dedup))
            assert getattr(dedup.func, "id", "") in {
                "deduplication_id",
                "copy_deduplication_id",
            }, (path, ast.unparse(dedup))
    assert seen >= 3  # the job's send, the poison copy, the DLQ redrive


def test_a_legacy_record_without_a_message_is_taken_over_at_once() -> None:
    # Written by an older version: message_sent false, no send id, not in the index.
    legacy = job_item(
        state=JobState.QUEUED, owner=None, token=0, attempt=0, message_sent=False, send_id=None
    )
    s = Script([condition_failed(legacy), ok(), ok({"MessageId": "mid-2"}), ok()])
    res = _submit(s)
    assert res.message_id == "mid-2"
    assert "attribute_not_exists (send_id)" in condition_text(s.calls[1].params)


def test_submit_same_id_other_payload_is_a_conflict_naming_both() -> None:
    existing = job_item(payload_hash="aaaaaaaaaaaa-old-tail")  # its payload: {"page": 1}
    s = Script([condition_failed(existing)])
    with pytest.raises(SubmitConflict) as caught:
        _submit(s, payload_hash="bbbbbbbbbbbb-new-tail", payload_json='{"page": 2}')
    text = str(caught.value)
    assert "aaaaaaaaaaaa" in text
    assert "bbbbbbbbbbbb" in text
    assert "'job-1'" in text
    assert s.ops == ["dynamodb.PutItem"]


def test_submit_same_id_same_value_written_otherwise_is_the_same_job() -> None:
    # Issue 29: a record stored by a version (or a path) that wrote 1.0 where this
    # submission writes 1 holds the same payload: not a conflict, whatever the hashes.
    existing = job_item(payload_hash="aaaaaaaaaaaa-old-tail")  # its payload: {"page": 1}
    s = Script([condition_failed(existing)])
    res = _submit(s, payload_hash="bbbbbbbbbbbb-new-tail", payload_json='{"page":1.0}')
    assert res.job_id == "job-1" and not res.created


def test_submit_same_id_other_job_class_is_a_conflict() -> None:
    s = Script([condition_failed(job_item(job_class="browser"))])
    with pytest.raises(SubmitConflict, match=r"'browser'.*'ocr'"):
        _submit(s, job_class="ocr")


def test_submit_put_unreachable_raises_aws_call_failed() -> None:
    s = Script([unreachable()])
    with pytest.raises(AwsCallFailed, match="put job record") as caught:
        _submit(s)
    assert caught.value.code == "EndpointConnectionError"
    assert s.ops == ["dynamodb.PutItem"]


def test_submit_put_condition_failed_without_item_raises() -> None:
    s = Script([condition_failed(None)])
    with pytest.raises(AwsCallFailed, match="ConditionalCheckFailedException"):
        _submit(s)


def test_submit_put_table_missing_raises_resource_missing() -> None:
    s = Script([err(ErrorKind.NOT_FOUND, "ResourceNotFoundException")])
    with pytest.raises(ResourceMissing, match="ResourceNotFoundException"):
        _submit(s)


def test_a_failed_send_gives_the_send_back_and_says_what_recovers_the_job() -> None:
    s = Script([ok(), unreachable(), ok()])
    with pytest.raises(AwsCallFailed, match="record is kept without a message") as caught:
        _submit(s)
    assert "stranded sweep" in str(caught.value)
    assert s.ops == ["dynamodb.PutItem", "sqs.SendMessage", "dynamodb.UpdateItem"]
    release = s.calls[2].params
    assert condition_text(release) == "(send_id = 'send-2' AND message_sent = False)"
    assert update_removes(release) == ["send_id"]
    assert "job_submitted" not in s.event_names()
    ev = s.event("job_send_failed")
    assert (ev["send_id"], ev["released"]) == ("send-2", True)


def test_submit_mark_sent_unanswered_is_journaled_not_fatal() -> None:
    s = Script([ok(), ok({"MessageId": "mid-1"}), unreachable()])
    res = _submit(s)
    assert res.created is True
    assert s.event("job_submit_flag_unset") == {
        "job_id": "job-1",
        "error_code": "EndpointConnectionError",
    }


def test_a_sender_superseded_before_it_marked_its_send_is_told_its_message_is_a_stray() -> None:
    now = job_item(state=JobState.QUEUED, owner=None, token=0, attempt=0, send_id="send-9")
    s = Script([ok(), ok({"MessageId": "mid-1"}), condition_failed(now)])
    res = _submit(s)
    assert "discarded as a stray" in res.note
    ev = s.event("job_send_superseded")
    assert (ev["send_id"], ev["current_send_id"]) == ("send-2", "send-9")


# =========================================================================== claim


def _claim(
    script: Script,
    d: Delivery | None = None,
    *,
    lease_seconds: int = 60,
    max_attempts: int = 5,
    dlq_url: str | None = None,
) -> Claimed | NotClaimed:
    return script.run(
        claim_flow(
            table(),
            queue_url=QUEUE,
            delivery=d or delivery(received_at=1000.0, visibility=30),
            worker_id=WORKER,
            wall_now=WALL,
            lease_seconds=lease_seconds,
            max_attempts=max_attempts,
            dlq_url=dlq_url,
            nonce="n-1",
        )
    )


def _old(**kw: Any) -> Ok:
    """The claim's answer: ReturnValues=ALL_OLD, the record as it was before."""
    fields: dict[str, Any] = {"state": JobState.QUEUED, "owner": None, "token": 4, "attempt": 1}
    fields.update(kw)
    return ok({"Attributes": job_item(**fields)})


def test_claim_request_is_conditional_and_returns_old_values() -> None:
    s = Script([_old(), ok(sent_at=1005.0)])
    _claim(s)
    claim = s.calls[0]
    assert claim.op == "UpdateItem"
    assert claim.params["Key"] == {"job_id": {"S": "job-1"}}
    assert claim.params["ReturnValues"] == "ALL_OLD"
    assert claim.params["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"
    # The claim lands only for the record's own class and the job's current message,
    # and only on a queued record: one running is the duplicate rule's to judge
    # (issue 26; tests/test_core_duplicates.py). (The class equality also refuses a
    # missing record: no attribute_exists needed.)
    assert condition_text(claim.params) == (
        "((state = 'queued' AND job_class = 'ocr') AND send_id = 'send-1')"
    )
    sets = update_sets(claim.params)
    assert sets["message_sent"] == "True"  # a delivered message was sent
    assert sorted(update_removes(claim.params)) == ["unsent", "unsent_since"]
    assert update_adds(claim.params) == {"token": "1", "attempt": "1"}
    assert sets["owner"] == repr(WORKER)
    assert sets["state"] == "'running'"
    assert sets["lease_deadline"] == repr(WALL + 60)


def test_the_claim_writes_only_what_the_protocol_and_people_need() -> None:
    # moto's cost of a write grows with its expression (BENCHMARKS.md, benchmark 2):
    # an attribute added here is a cost on every job, so the list is pinned.
    s = Script([_old(), ok(sent_at=1005.0)])
    _claim(s)
    params = s.calls[0].params
    assert sorted(update_sets(params)) == [
        "lease_deadline",
        "message_sent",
        "owner",
        "state",
        "timeline",
        "updated_at",
    ]
    assert sorted(update_adds(params)) == ["attempt", "token"]
    assert sorted(update_removes(params)) == ["unsent", "unsent_since"]
    assert "last_heartbeat" not in params["ExpressionAttributeNames"].values()


def test_claim_success_token_attempt_and_deadline_from_cmv_sent_at() -> None:
    s = Script([_old(token=4, attempt=1), ok(sent_at=1005.0, received_at=1007.5)])
    res = _claim(s, delivery(received_at=1000.0, visibility=30), lease_seconds=60)
    assert isinstance(res, Claimed)
    assert res.token == 5
    assert res.attempt == 2
    assert res.deadline == 1065.0  # sent_at + L: not received_at + L, not received + visibility
    assert res.reclaimed is False
    assert res.previous_owner is None
    assert res.job.payload_json == '{"page": 1}'
    assert (res.job.state, res.job.owner, res.job.token, res.job.attempt) == (
        JobState.RUNNING,
        WORKER,
        5,
        2,
    )
    assert s.ops == ["dynamodb.UpdateItem", "sqs.ChangeMessageVisibility"]
    cmv = s.calls[1].params
    assert (cmv["QueueUrl"], cmv["ReceiptHandle"], cmv["VisibilityTimeout"]) == (QUEUE, "rh-1", 60)
    ev = s.event("job_claimed")
    assert (ev["token"], ev["attempt"], ev["lease_seconds"], ev["reclaimed"]) == (5, 2, 60, False)
    assert "job_reclaimed" not in s.event_names()


def test_claim_cmv_failure_keeps_deadline_from_the_receive() -> None:
    s = Script([_old(), unreachable()])
    res = _claim(s, delivery(received_at=1000.0, visibility=30), lease_seconds=60)
    assert isinstance(res, Claimed)
    assert res.deadline == 1030.0  # received_at + visibility, never extended to L
    assert s.event("job_claimed")["lease_seconds"] == 30


def test_claim_of_running_record_is_a_reclaim() -> None:
    s = Script([_old(state=JobState.RUNNING, owner=OTHER, token=7, attempt=2), ok(sent_at=1001.0)])
    res = _claim(s)
    assert isinstance(res, Claimed)
    assert res.reclaimed is True
    assert res.previous_owner == OTHER
    assert res.token == 8
    assert s.event("job_reclaimed") == {
        "job_id": "job-1",
        "token": 8,
        "previous_owner": OTHER,
        "previous_token": 7,
    }
    assert s.event("job_claimed")["previous_owner"] == OTHER


def test_claim_of_requeued_record_is_not_a_reclaim() -> None:
    # requeue keeps the owner recorded; only a record left running is a reclaim
    s = Script([_old(state=JobState.QUEUED, owner=OTHER, token=3), ok(sent_at=1001.0)])
    res = _claim(s)
    assert isinstance(res, Claimed)
    assert (res.reclaimed, res.previous_owner, res.token) == (False, OTHER, 4)
    assert "job_reclaimed" not in s.event_names()


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.FAILED])
def test_claim_of_terminal_record_deletes_message(state: JobState) -> None:
    s = Script([condition_failed(job_item(state=state, token=3)), ok()])
    res = _claim(s)
    assert isinstance(res, NotClaimed)
    assert res.outcome == "done"
    assert res.job is not None and res.job.state is state
    assert s.ops == ["dynamodb.UpdateItem", "sqs.DeleteMessage"]
    assert s.calls[1].params == {"QueueUrl": QUEUE, "ReceiptHandle": "rh-1"}
    assert s.event("job_already_done") == {"job_id": "job-1", "state": str(state), "token": 3}


def test_claim_of_parked_record_is_parked() -> None:
    s = Script([condition_failed(job_item(state=JobState.PARKED)), ok()])
    res = _claim(s)
    assert isinstance(res, NotClaimed)
    assert res.outcome == "parked"
    assert s.ops == ["dynamodb.UpdateItem", "sqs.DeleteMessage"]
    assert s.event("job_parked_skip")["state"] == "parked"


def test_claim_without_record_poisons_and_deletes() -> None:
    s = Script([condition_failed(None), ok()])
    res = _claim(s)
    assert isinstance(res, NotClaimed)
    assert res.outcome == "missing"
    assert res.job is None
    assert s.ops == ["dynamodb.UpdateItem", "sqs.DeleteMessage"]
    ev = s.event("message_poisoned")
    assert (ev["job_id"], ev["message_id"], ev["reason"]) == (
        "job-1",
        "m-job-1",
        "no job record for the message",
    )


def test_claim_delete_failure_is_journaled() -> None:
    s = Script([condition_failed(job_item(state=JobState.SUCCEEDED)), unreachable()])
    res = _claim(s)
    assert isinstance(res, NotClaimed) and res.outcome == "done"
    assert s.event("message_delete_failed") == {"error_code": "EndpointConnectionError"}


@pytest.mark.parametrize(
    "outcome",
    [unreachable(), err(ErrorKind.THROTTLED, "ProvisionedThroughputExceededException")],
)
def test_claim_unanswered_is_unknown_and_keeps_message(outcome: Err) -> None:
    s = Script([outcome])
    res = _claim(s)
    assert isinstance(res, NotClaimed)
    assert res.outcome == "unknown"
    assert s.ops == ["dynamodb.UpdateItem"]  # no DeleteMessage, no CMV
    ev = s.event("ownership_unknown")
    assert (ev["stage"], ev["error_code"]) == ("claim", outcome.code)


def test_a_message_whose_class_disagrees_with_its_record_claims_nothing_and_goes_to_the_dlq() -> (
    None
):
    # Regression (issue 7.6): the claim used to land, move the token and fail the job,
    # fencing out a live owner; now the class is in the claim's own condition.
    live = job_item(job_class="browser", state=JobState.RUNNING, owner=OTHER, token=4)
    s = Script([condition_failed(live), ok(), ok()])
    res = _claim(s, delivery(job_class="ocr"), dlq_url=DLQ)
    assert isinstance(res, NotClaimed)
    assert res.outcome == "class_mismatch"
    assert "'ocr'" in res.reason and "'browser'" in res.reason
    assert s.ops == ["dynamodb.UpdateItem", "sqs.SendMessage", "sqs.DeleteMessage"]
    assert "job_class = 'ocr'" in condition_text(s.calls[0].params)
    copy = s.calls[1].params
    assert copy["QueueUrl"] == DLQ
    assert json.loads(copy["MessageBody"])["job_class"] == "ocr"  # the original bytes
    ev = s.event("message_poisoned")
    assert (ev["job_id"], ev["moved_to_dlq"]) == ("job-1", True)
    assert "job_failed" not in s.event_names()


def test_a_stray_duplicate_is_deleted_without_taking_the_job_from_its_live_owner() -> None:
    # Regression (issue 14.2): a second message of one job used to claim it while
    # its first owner worked, moving the token and fencing that owner out.
    live = job_item(state=JobState.RUNNING, owner=OTHER, token=4, send_id="send-1")
    s = Script([condition_failed(live), ok()])
    res = _claim(s, delivery(send_id="send-0"))
    assert isinstance(res, NotClaimed)
    assert res.outcome == "stray"
    assert s.ops == ["dynamodb.UpdateItem", "sqs.DeleteMessage"]  # no second write
    assert "send_id = 'send-0'" in condition_text(s.calls[0].params)
    ev = s.event("message_stray")
    assert (ev["send_id"], ev["current_send_id"], ev["state"], ev["token"]) == (
        "send-0",
        "send-1",
        "running",
        4,
    )


def test_sqs_redelivering_the_current_message_still_takes_over_a_lapsed_lease() -> None:
    s = Script([_old(state=JobState.RUNNING, owner=OTHER, token=7), ok(sent_at=1001.0)])
    res = _claim(s, delivery(send_id="send-1"))
    assert isinstance(res, Claimed) and res.reclaimed is True


def test_a_message_without_a_send_id_claims_only_a_record_no_current_sender_touched() -> None:
    s = Script([_old(send_id=None), ok(sent_at=1001.0)])
    res = _claim(s, delivery(send_id=None))
    assert isinstance(res, Claimed)
    assert condition_text(s.calls[0].params).endswith(
        "AND (attribute_not_exists (send_id) AND attribute_not_exists (unsent)))"
    )
    newer = job_item(state=JobState.QUEUED, owner=None, token=0, send_id="send-1")
    s = Script([condition_failed(newer), ok()])
    res = _claim(s, delivery(send_id=None))
    assert isinstance(res, NotClaimed) and res.outcome == "stray"


def test_attempts_an_operator_granted_extend_the_claim_limit() -> None:
    # Regression (issue 14.1): a job parked on its last attempt and resumed failed
    # at its next claim ("attempts exhausted (1 of 1)") before its handler ran.
    s = Script([_old(attempt=1, token=1, granted_attempts=1), ok(sent_at=1000.0)])
    res = _claim(s, max_attempts=1)
    assert isinstance(res, Claimed)
    assert (res.attempt, res.job.granted_attempts) == (2, 1)
    s = Script([_old(attempt=2, token=2, granted_attempts=1), ok(), ok()])
    res = _claim(s, max_attempts=1)
    assert isinstance(res, NotClaimed)
    assert res.reason == "attempts exhausted (2 of 1 + 1 granted)"


def test_the_attempt_a_resume_starts_is_allowed_past_attempts_no_handler_ran() -> None:
    # Soak seed 1113879: two claims landed unanswered (each counted an attempt, none
    # ran), the job went to the DLQ and was parked at attempt 3 with 1 + 1 allowed;
    # the resume's grant (+1) left 1 + 2 = 3, and its first claim failed the job.
    s = Script([_old(attempt=3, token=5, granted_attempts=2, resumed_at_attempt=3), ok()])
    res = _claim(s, max_attempts=1)
    assert isinstance(res, Claimed) and res.attempt == 4
    # One attempt, not a new budget: the next claim after it is past the allowance.
    s = Script([_old(attempt=4, token=6, granted_attempts=2, resumed_at_attempt=3), ok(), ok()])
    res = _claim(s, max_attempts=1)
    assert isinstance(res, NotClaimed) and res.outcome == "exhausted"


def test_claim_beyond_max_attempts_fails_and_deletes() -> None:
    s = Script([_old(attempt=3, token=6), ok(), ok()])
    res = _claim(s, max_attempts=3)
    assert isinstance(res, NotClaimed)
    assert res.outcome == "exhausted"
    assert res.reason == "attempts exhausted (3 of 3)"
    assert s.ops == ["dynamodb.UpdateItem", "dynamodb.UpdateItem", "sqs.DeleteMessage"]
    fail = s.calls[1].params
    assert_fenced(fail, token=7)
    assert update_sets(fail)["error_code"] == "'attempts_exhausted'"
    ev = s.event("job_failed")
    assert (ev["error_code"], ev["attempt"]) == ("attempts_exhausted", 4)


def test_claim_at_exactly_max_attempts_is_claimed() -> None:
    s = Script([_old(attempt=2), ok(sent_at=1000.0)])
    res = _claim(s, max_attempts=3)
    assert isinstance(res, Claimed)
    assert res.attempt == 3


# =========================================================================== heartbeat


class FakeAws:
    """A responder for heartbeat rounds: every CMV entry succeeds, records come from a dict."""

    def __init__(self, records: Mapping[str, Mapping[str, Any]], sent_at: float = 2000.0) -> None:
        self.records = dict(records)
        self.sent_at = sent_at
        self.cmv_rounds = 0

    def __call__(self, c: Call) -> Outcome:
        if c.op == "ChangeMessageVisibilityBatch":
            sent = self.sent_at + self.cmv_rounds
            self.cmv_rounds += 1
            ids = [{"Id": e["Id"]} for e in c.params["Entries"]]
            return ok({"Successful": ids, "Failed": []}, sent_at=sent, received_at=sent + 0.5)
        if c.op == "BatchGetItem":
            keys = c.params["RequestItems"][TABLE]["Keys"]
            found = [self.records[_key_id(k)] for k in keys if _key_id(k) in self.records]
            return ok({"Responses": {TABLE: found}, "UnprocessedKeys": {}}, sent_at=9999.0)
        if c.op == "UpdateItem":
            return ok()
        raise AssertionError(f"unexpected call {c.op}")


def _beat(script: Script, leases: Sequence[LocalLease]) -> HeartbeatReport:
    return script.run(
        heartbeat_flow(table(), queue_url=QUEUE, leases=leases, worker_id=WORKER, wall_now=WALL)
    )


def _lost(leases: Sequence[LocalLease], report: HeartbeatReport) -> list[Mapping[str, Any]]:
    """The heartbeat_lost events the round's verdicts produce (journaled by the shell)."""
    out = apply_beats(leases, report, started=WALL)
    assert all(e.event == "heartbeat_lost" for e in out.events)
    return [e.fields for e in out.events]


def _running(job_id: str, token: int = 2, **kw: Any) -> dict[str, Any]:
    return job_item(job_id, state=JobState.RUNNING, owner=WORKER, token=token, **kw)


def test_heartbeat_batches_23_leases_into_3_cmv_calls_and_one_batch_get() -> None:
    leases = [local_lease(f"job-{i:02d}", lease_seconds=60) for i in range(23)]
    aws = FakeAws({lease.job_id: _running(lease.job_id) for lease in leases}, sent_at=2000.0)
    s = Script(aws)
    report = _beat(s, leases)
    assert s.ops == ["sqs.ChangeMessageVisibilityBatch"] * 3 + ["dynamodb.BatchGetItem"]
    assert report.calls == 4
    sizes = [len(c.params["Entries"]) for c in s.calls_to("ChangeMessageVisibilityBatch")]
    assert sizes == [10, 10, 3]
    first = s.calls[0].params
    assert first["QueueUrl"] == QUEUE
    assert first["Entries"][0] == {"Id": "0", "ReceiptHandle": "rh-job-00", "VisibilityTimeout": 60}
    assert s.calls[2].params["Entries"][2]["ReceiptHandle"] == "rh-job-22"
    get = s.calls[3].params["RequestItems"][TABLE]
    assert get["ConsistentRead"] is True
    assert [_key_id(k) for k in get["Keys"]] == [lease.job_id for lease in leases]
    assert {b.status for b in report.beats.values()} == {"ok"}
    # each chunk's deadline counts from that chunk's CMV sent_at (not the BatchGet's)
    assert report.beats["job-00"].deadline == 2060.0
    assert report.beats["job-10"].deadline == 2061.0
    assert report.beats["job-22"].deadline == 2062.0
    assert len(s.events_named("heartbeat_ok")) == 23
    assert s.events_named("heartbeat_ok")[0]["lease_left"] == 60.0


def test_heartbeat_ok_deadline_is_cmv_sent_at_plus_lease() -> None:
    lease = local_lease("job-1", lease_seconds=90)
    s = Script(
        [
            ok({"Successful": [{"Id": "0"}], "Failed": []}, sent_at=500.0, received_at=503.0),
            ok({"Responses": {TABLE: [_running("job-1")]}}, sent_at=504.0, received_at=505.0),
        ]
    )
    report = _beat(s, [lease])
    assert report.beats["job-1"].status == "ok"
    assert report.beats["job-1"].deadline == 590.0


@pytest.mark.parametrize(
    "code",
    [
        "ReceiptHandleIsInvalid",
        "InvalidReceiptHandle",
        "AWS.SimpleQueueService.MessageNotInflight",
        "MessageNotInflight",
        "InvalidParameterValue",
    ],
)
def test_heartbeat_per_entry_lease_gone_codes_are_lost(code: str) -> None:
    leases = [local_lease("job-a"), local_lease("job-b")]
    s = Script(
        [
            ok(
                {
                    "Successful": [{"Id": "0"}],
                    "Failed": [{"Id": "1", "Code": code, "SenderFault": True, "Message": "x"}],
                },
                sent_at=100.0,
            ),
            ok({"Responses": {TABLE: [_running("job-a")]}}),
        ]
    )
    report = _beat(s, leases)
    assert report.beats["job-b"].status == "lost"
    assert report.beats["job-b"].reason == f"sqs: {code}"
    assert report.beats["job-b"].deadline is None
    assert report.beats["job-a"].status == "ok"
    # the gone job is looked up too (it might be our own finished attempt); its
    # record is not there, so SQS's word stands
    keys = s.calls[1].params["RequestItems"][TABLE]["Keys"]
    assert [_key_id(k) for k in keys] == ["job-a", "job-b"]
    assert "heartbeat_lost" not in s.event_names()  # the lease's change journals it
    (lost,) = _lost(leases, report)
    assert (lost["job_id"], lost["cancelled"], lost["detected_by"]) == ("job-b", False, "heartbeat")


def test_heartbeat_other_per_entry_code_is_unknown() -> None:
    leases = [local_lease("job-a", token=9)]
    s = Script([ok({"Successful": [], "Failed": [{"Id": "0", "Code": "InternalError"}]})])
    report = _beat(s, leases)
    assert s.ops == ["sqs.ChangeMessageVisibilityBatch"]  # nothing to confirm
    assert report.beats["job-a"].status == "unknown"
    assert report.beats["job-a"].reason == "sqs: InternalError"
    ev = s.event("ownership_unknown")
    assert (ev["job_id"], ev["token"]) == ("job-a", 9)


def test_heartbeat_unreachable_cmv_call_is_unknown_for_that_chunk_only() -> None:
    leases = [local_lease(f"job-{i:02d}") for i in range(12)]

    def respond(c: Call) -> Outcome:
        if c.op == "ChangeMessageVisibilityBatch" and len(c.params["Entries"]) == 10:
            return unreachable()
        return FakeAws({lease.job_id: _running(lease.job_id) for lease in leases})(c)

    s = Script(respond)
    report = _beat(s, leases)
    assert [report.beats[f"job-{i:02d}"].status for i in range(10)] == ["unknown"] * 10
    assert report.beats["job-00"].reason == "EndpointConnectionError"
    assert report.beats["job-00"].deadline is None
    assert [report.beats[f"job-{i:02d}"].status for i in (10, 11)] == ["ok", "ok"]
    keys = s.calls_to("BatchGetItem")[0].params["RequestItems"][TABLE]["Keys"]
    assert [_key_id(k) for k in keys] == ["job-10", "job-11"]


def _one_beat(
    record: Mapping[str, Any] | None, lease: LocalLease | None = None
) -> tuple[Script, tuple[str, str, float | None]]:
    """One lease, CMV ok at sent_at=100, BatchGetItem answering ``record`` (or nothing)."""
    lease = lease or local_lease("job-1", token=2)
    found = [record] if record is not None else []
    s = Script(
        [
            ok({"Successful": [{"Id": "0"}]}, sent_at=100.0),
            ok({"Responses": {TABLE: found}, "UnprocessedKeys": {}}),
        ]
    )
    report = _beat(s, [lease])
    beat = report.beats["job-1"]
    for ev in _lost([lease], report):
        s.events.append(Emit("heartbeat_lost", ev))
    return s, (beat.status, beat.reason, beat.deadline)


def test_heartbeat_token_moved_is_lost() -> None:
    s, verdict = _one_beat(job_item("job-1", state=JobState.RUNNING, owner=OTHER, token=3))
    assert verdict == ("lost", "token moved to 3", None)
    assert s.event("heartbeat_lost")["reason"] == "token moved to 3"


def test_heartbeat_state_not_running_under_our_token_is_our_own_end() -> None:
    # Only this attempt's own fenced write can take the record out of running
    # under its token: the attempt ended itself, nothing was lost.
    s, verdict = _one_beat(
        job_item("job-1", state=JobState.QUEUED, owner=WORKER, token=2, write_id="n-1:retry")
    )
    assert verdict == ("done", "job is queued", None)
    assert "heartbeat_lost" not in s.event_names()


def test_heartbeat_state_not_running_under_another_token_is_lost() -> None:
    _s, verdict = _one_beat(job_item("job-1", state=JobState.QUEUED, owner=OTHER, token=3))
    assert verdict == ("lost", "token moved to 3", None)


def test_heartbeat_sqs_gone_for_our_own_committed_job_is_done_not_lost() -> None:
    s = Script(
        [
            ok({"Failed": [{"Id": "0", "Code": "ReceiptHandleIsInvalid", "SenderFault": True}]}),
            ok(
                {
                    "Responses": {
                        TABLE: [
                            job_item(
                                "job-1", state=JobState.SUCCEEDED, token=2, write_id="n-1:commit"
                            )
                        ]
                    }
                }
            ),
        ]
    )
    beat = _beat(s, [local_lease("job-1", token=2)]).beats["job-1"]
    assert (beat.status, beat.reason) == ("done", "job is succeeded")
    assert "heartbeat_lost" not in s.event_names()


def test_heartbeat_other_owner_is_lost() -> None:
    _s, verdict = _one_beat(job_item("job-1", state=JobState.RUNNING, owner=OTHER, token=2))
    assert verdict == ("lost", f"owner is {OTHER}", None)


def test_heartbeat_cancelled_record_is_cancelled() -> None:
    record = job_item(
        "job-1",
        state=JobState.FAILED,
        owner=WORKER,
        token=3,
        error_code="cancelled",
        reason="cancelled: user closed the session",
    )
    s, verdict = _one_beat(record)
    assert verdict == ("cancelled", "cancelled: user closed the session", None)
    ev = s.event("heartbeat_lost")
    assert (ev["cancelled"], ev["token"]) == (True, 2)


def test_heartbeat_failed_but_not_cancelled_under_our_token_is_done() -> None:
    s, verdict = _one_beat(
        job_item("job-1", state=JobState.FAILED, token=2, error_code="boom", write_id="n-1:fail")
    )
    status, reason, _ = verdict
    assert (status, reason) == ("done", "job is failed")
    assert "heartbeat_lost" not in s.event_names()


def test_heartbeat_missing_record_without_unprocessed_keys_is_lost() -> None:
    _s, verdict = _one_beat(None)
    assert verdict == ("lost", "job record is gone", None)


def test_heartbeat_matching_record_is_ok() -> None:
    s, verdict = _one_beat(
        _running("job-1", token=2), local_lease("job-1", token=2, lease_seconds=45)
    )
    assert verdict == ("ok", "", 145.0)
    assert s.event("heartbeat_ok") == {"job_id": "job-1", "token": 2, "lease_left": 45.0}


def test_heartbeat_retries_unprocessed_keys_after_a_sleep() -> None:
    leases = [local_lease("job-a"), local_lease("job-b")]
    unprocessed = {TABLE: {"Keys": [{"job_id": {"S": "job-b"}}], "ConsistentRead": True}}
    s = Script(
        [
            ok({"Successful": [{"Id": "0"}, {"Id": "1"}]}, sent_at=100.0),
            ok({"Responses": {TABLE: [_running("job-a")]}, "UnprocessedKeys": unprocessed}),
            ok({"Responses": {TABLE: [_running("job-b")]}, "UnprocessedKeys": {}}),
        ]
    )
    report = _beat(s, leases)
    assert s.kinds[:4] == [
        "call:ChangeMessageVisibilityBatch",
        "call:BatchGetItem",
        "sleep",
        "call:BatchGetItem",
    ]
    assert s.sleeps == [pytest.approx(0.05)]
    assert s.calls[2].params == {"RequestItems": unprocessed}
    assert report.calls == 3
    assert (report.beats["job-a"].status, report.beats["job-b"].status) == ("ok", "ok")
    assert report.beats["job-b"].deadline == 160.0


def test_heartbeat_unprocessed_keys_never_resolved_are_unknown() -> None:
    unprocessed = {TABLE: {"Keys": [{"job_id": {"S": "job-1"}}], "ConsistentRead": True}}
    still = ok({"Responses": {TABLE: []}, "UnprocessedKeys": unprocessed})
    s = Script([ok({"Successful": [{"Id": "0"}]}, sent_at=100.0), still, still, still])
    report = _beat(s, [local_lease("job-1")])
    assert s.ops.count("dynamodb.BatchGetItem") == 3  # BATCH_GET_TRIES, then give up
    assert len(s.sleeps) == 2
    assert s.sleeps[1] > s.sleeps[0]
    beat = report.beats["job-1"]
    assert (beat.status, beat.reason, beat.deadline) == ("unknown", "dynamodb: not read", None)


def test_heartbeat_dynamodb_unreachable_is_unknown_and_lease_does_not_move() -> None:
    lease = local_lease("job-1", token=2, deadline=1060.0, jitter_seconds=5.0)
    lease.last_confirmed = 1000.0
    s = Script([ok({"Successful": [{"Id": "0"}]}, sent_at=1050.0), unreachable()])
    report = _beat(s, [lease])
    beat = report.beats["job-1"]
    assert beat.status == "unknown"
    assert beat.deadline is None  # CMV succeeded, yet no new local deadline
    assert beat.reason == "dynamodb: EndpointConnectionError"
    assert "heartbeat_ok" not in s.event_names()
    ev = s.event("ownership_unknown")
    assert (ev["last_confirmed"], ev["conservative_deadline"]) == (1000.0, 1055.0)


def test_heartbeat_dynamodb_unreachable_on_retry_keeps_what_was_read() -> None:
    leases = [local_lease("job-a"), local_lease("job-b")]
    unprocessed = {TABLE: {"Keys": [{"job_id": {"S": "job-b"}}]}}
    s = Script(
        [
            ok({"Successful": [{"Id": "0"}, {"Id": "1"}]}, sent_at=100.0),
            ok({"Responses": {TABLE: [_running("job-a")]}, "UnprocessedKeys": unprocessed}),
            unreachable(),
        ]
    )
    report = _beat(s, leases)
    assert report.beats["job-a"].status == "ok"
    assert report.beats["job-b"].status == "unknown"
    assert report.beats["job-b"].reason == "dynamodb: EndpointConnectionError"


def test_heartbeat_round_writes_nothing_per_job() -> None:
    # Lease left and heartbeat age come from the worker's liveness record (one write
    # per round, rounds.liveness_flow): the round itself makes no per-job write.
    leases = [local_lease(f"job-{i}", token=2) for i in range(12)]
    s = Script(FakeAws({lease.job_id: _running(lease.job_id) for lease in leases}))
    report = _beat(s, leases)
    assert [c.op for c in s.calls] == [
        "ChangeMessageVisibilityBatch",
        "ChangeMessageVisibilityBatch",
        "BatchGetItem",
    ]
    assert report.calls == 3
    assert all(b.status == "ok" for b in report.beats.values())


# =========================================================================== commit


def _commit(script: Script, job: JobView | None = None, *, keep: bool = False) -> Finish:
    return script.run(
        commit_flow(
            table(),
            EndRequest(
                QUEUE,
                job or job_view(token=2),
                delivery(receipt_handle="rh-c"),
                WORKER,
                WALL,
                "n-1",
            ),
            result_json='{"text": "ok"}',
            duration=12.34567,
            keep_rejected_content=keep,
        )
    )


def test_commit_request_is_fenced_on_token_owner_and_state() -> None:
    s = Script([ok(), ok()])
    _commit(s, job_view(token=7))
    params = s.calls[0].params
    assert params["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"
    assert_fenced(params, token=7)
    assert "token = 7" in condition_text(params)
    assert " OR " not in condition_text(params)
    sets = update_sets(params)
    assert (sets["state"], sets["result"]) == ("'succeeded'", repr('{"text": "ok"}'))
    assert sorted(update_removes(params)) == ["error_code", "lease_deadline", "reason"]


def test_commit_ok_deletes_and_journals() -> None:
    s = Script([ok(), ok()])
    fin = _commit(s)
    assert fin == Finish(FinishOutcome.DONE, deleted=True)  # SQS took the delete
    assert s.ops == ["dynamodb.UpdateItem", "sqs.DeleteMessage"]
    assert s.calls[1].params == {"QueueUrl": QUEUE, "ReceiptHandle": "rh-c"}
    ev = s.event("result_committed")
    assert (ev["token"], ev["attempt"], ev["duration"]) == (2, 2, 12.346)


def test_commit_rejected_when_token_moved_never_deletes() -> None:
    s = Script([condition_failed(job_item(state=JobState.RUNNING, owner=OTHER, token=3)), ok()])
    fin = _commit(s)
    assert fin.outcome == "rejected"
    assert fin.reason == "token moved from 2 to 3"
    assert fin.current is not None and fin.current.owner == OTHER
    # no DeleteMessage, no retry; the second write keeps the rejected result's traces
    assert s.ops == ["dynamodb.UpdateItem", "dynamodb.UpdateItem"]
    assert "result_committed" not in s.event_names()
    ev = s.event("result_rejected")
    assert (ev["token"], ev["current_token"], ev["current_state"]) == (2, 3, "running")


def test_commit_rejected_when_record_gone() -> None:
    s = Script([condition_failed(None)])
    fin = _commit(s)
    assert (fin.outcome, fin.reason) == ("rejected", "job record is gone")
    assert s.event("result_rejected")["current_token"] is None


def test_a_rejected_result_keeps_its_hash_and_size_on_the_record_and_never_its_state() -> None:
    s = Script([condition_failed(job_item(state=JobState.RUNNING, owner=OTHER, token=3)), ok()])
    _commit(s)
    kept = s.calls[1].params
    assert "ConditionExpression" in kept and "#" in kept["ConditionExpression"]
    names = set(kept["ExpressionAttributeNames"].values())
    assert {"rejected_hash", "rejected_size", "rejected_token", "rejected_by"} <= names
    assert not names & {"state", "token", "owner", "result"}  # forensics, not a commit
    values = [v.get("S") or v.get("N") for v in kept["ExpressionAttributeValues"].values()]
    text = '{"text": "ok"}'
    assert hashlib.sha256(text.encode()).hexdigest() in values
    assert str(len(text)) in values and text not in values  # no content by default
    ev = s.event("rejected_result_kept")
    assert (ev["token"], ev["size"], ev["content"], ev["stored"]) == (2, len(text), False, True)


def test_a_rejected_result_keeps_its_content_where_the_class_opts_in() -> None:
    s = Script([condition_failed(job_item(state=JobState.RUNNING, owner=OTHER, token=3)), ok()])
    _commit(s, keep=True)
    values = [v.get("S") for v in s.calls[1].params["ExpressionAttributeValues"].values()]
    assert '{"text": "ok"}' in values


def test_commit_rejected_same_token_other_state() -> None:
    s = Script([condition_failed(job_item(state=JobState.QUEUED, owner=WORKER, token=2)), ok()])
    fin = _commit(s)
    assert (fin.outcome, fin.reason) == (
        "rejected",
        f"job is queued (owner {WORKER}), not by this attempt's write",
    )


def test_commit_unanswered_then_own_earlier_write_is_done() -> None:
    mine = job_item(state=JobState.SUCCEEDED, owner=WORKER, token=2, write_id="n-1:commit")
    s = Script([unreachable(), condition_failed(mine), ok()])
    fin = _commit(s)
    assert fin.outcome == "done"
    assert fin.reason == "an earlier try applied"
    assert s.kinds[:3] == ["call:UpdateItem", "sleep", "call:UpdateItem"]
    assert s.calls[0] == s.calls[1]  # the very same request again
    assert s.ops[-1] == "sqs.DeleteMessage"
    assert s.event("result_committed")["token"] == 2


@pytest.mark.parametrize(
    "item",
    [
        job_item(state=JobState.SUCCEEDED, owner=OTHER, token=3),  # someone else's success
        job_item(state=JobState.SUCCEEDED, owner=OTHER, token=2),  # owner differs
        job_item(state=JobState.FAILED, owner=WORKER, token=2),  # not the applied state
    ],
)
def test_commit_unanswered_then_someone_elses_state_is_rejected(item: dict[str, Any]) -> None:
    s = Script([unreachable(), condition_failed(item), ok()])
    fin = _commit(s)
    assert fin.outcome == "rejected"
    assert "sqs.DeleteMessage" not in s.ops
    assert "result_rejected" in s.event_names()


@pytest.mark.parametrize(
    "failure",
    [unreachable(), err(ErrorKind.SERVER, "InternalServerError"), err(ErrorKind.THROTTLED, "T")],
)
def test_commit_unanswered_three_times_is_unknown(failure: Err) -> None:
    s = Script([failure, failure, failure])
    fin = _commit(s)
    assert fin.outcome == "unknown"
    assert fin.reason == f"no answer: {failure.code}"
    assert s.ops == ["dynamodb.UpdateItem"] * 3
    assert s.kinds[:5] == [
        "call:UpdateItem",
        "sleep",
        "call:UpdateItem",
        "sleep",
        "call:UpdateItem",
    ]
    assert s.sleeps[0] > 0 and s.sleeps[1] > s.sleeps[0]
    assert "sqs.DeleteMessage" not in s.ops
    ev = s.event("ownership_unknown")
    assert (ev["stage"], ev["token"]) == ("commit", 2)


@pytest.mark.parametrize("kind", [ErrorKind.INVALID, ErrorKind.NOT_FOUND])
def test_commit_definite_error_is_unknown_without_retry(kind: ErrorKind) -> None:
    s = Script([Err(kind, code="ValidationException", message="item too large")])
    fin = _commit(s)
    assert fin.outcome == "unknown"
    assert fin.reason == "ValidationException: item too large"
    assert s.ops == ["dynamodb.UpdateItem"]
    assert s.sleeps == []
    assert s.event("ownership_unknown")["stage"] == "commit"


# =========================================================================== retry


def _retry(script: Script, job: JobView, max_attempts: int = 3, delay: int = 17) -> Finish:
    return script.run(
        retry_flow(
            table(),
            EndRequest(QUEUE, job, delivery(receipt_handle="rh-r"), WORKER, WALL, "n-1"),
            reason="boom",
            error_code="TransientError",
            delay=delay,
            max_attempts=max_attempts,
        )
    )


def test_retry_requeues_then_sets_visibility_to_delay() -> None:
    s = Script([ok(), ok()])
    fin = _retry(s, job_view(token=2, attempt=1))
    assert fin == Finish(FinishOutcome.DONE)
    assert s.ops == ["dynamodb.UpdateItem", "sqs.ChangeMessageVisibility"]
    requeue = s.calls[0].params
    assert_fenced(requeue, token=2)
    sets = update_sets(requeue)
    assert (sets["state"], sets["error_code"], sets["reason"]) == (
        "'queued'",
        "'TransientError'",
        "'boom'",
    )
    assert "owner" not in sets  # the owner stays recorded
    assert update_removes(requeue) == ["lease_deadline"]
    assert s.calls[1].params == {
        "QueueUrl": QUEUE,
        "ReceiptHandle": "rh-r",
        "VisibilityTimeout": 17,
    }
    ev = s.event("job_retry_scheduled")
    assert (ev["delay"], ev["attempt"], ev["visibility_set"]) == (17, 1, True)


def test_retry_visibility_change_failure_is_journaled() -> None:
    s = Script([ok(), unreachable()])
    fin = _retry(s, job_view(attempt=1))
    assert fin.outcome == "done"
    assert s.event("job_retry_scheduled")["visibility_set"] is False


def test_retry_at_max_attempts_fails_instead() -> None:
    s = Script([ok(), ok()])
    fin = _retry(s, job_view(token=2, attempt=3), max_attempts=3)
    assert fin.outcome == "done"
    assert s.ops == ["dynamodb.UpdateItem", "sqs.DeleteMessage"]  # no CMV
    sets = update_sets(s.calls[0].params)
    assert sets["state"] == "'failed'"
    assert sets["error_code"] == "'attempts_exhausted'"
    assert sets["reason"] == repr("attempts exhausted (3 of 3); last error: boom")
    assert s.event("job_failed")["error_code"] == "attempts_exhausted"
    assert "job_retry_scheduled" not in s.event_names()


def test_retry_counts_attempts_an_operator_granted() -> None:
    # A job resumed once (one attempt granted) keeps max_attempts of its own budget:
    # attempt 3 of max 3 + 1 granted still retries; attempt 4 fails and says why.
    granted = dataclasses.replace(job_view(token=3, attempt=3), granted_attempts=1)
    s = Script([ok(), ok()])
    assert _retry(s, granted, max_attempts=3).outcome == "done"
    assert s.ops == ["dynamodb.UpdateItem", "sqs.ChangeMessageVisibility"]
    spent = dataclasses.replace(granted, attempt=4, token=4)
    s = Script([ok(), ok()])
    _retry(s, spent, max_attempts=3)
    assert update_sets(s.calls[0].params)["reason"] == repr(
        "attempts exhausted (4 of 3 + 1 granted); last error: boom"
    )


def test_retry_requeue_rejected_sets_no_visibility() -> None:
    s = Script([condition_failed(job_item(token=5, owner=OTHER))])
    fin = _retry(s, job_view(token=2, attempt=1))
    assert fin.outcome == "rejected"
    assert s.ops == ["dynamodb.UpdateItem"]
    ev = s.event("result_rejected")
    assert (ev["stage"], ev["reason"]) == ("retry", "token moved from 2 to 5")


def test_retry_requeue_unknown_sets_no_visibility() -> None:
    s = Script([err(ErrorKind.INVALID, "ValidationException")])
    fin = _retry(s, job_view(attempt=1))
    assert fin.outcome == "unknown"
    assert s.ops == ["dynamodb.UpdateItem"]
    assert s.event("ownership_unknown")["stage"] == "retry"


def test_retry_unanswered_then_own_requeue_is_done() -> None:
    mine = job_item(state=JobState.QUEUED, owner=WORKER, token=2, write_id="n-1:retry")
    s = Script([unreachable(), condition_failed(mine), ok()])
    fin = _retry(s, job_view(token=2, attempt=1))
    assert (fin.outcome, fin.reason) == ("done", "an earlier try applied")
    assert s.ops[-1] == "sqs.ChangeMessageVisibility"


# =========================================================================== fail / park


def _fail(script: Script) -> Finish:
    return script.run(
        fail_flow(
            table(),
            EndRequest(
                QUEUE, job_view(token=2), delivery(receipt_handle="rh-f"), WORKER, WALL, "n-1"
            ),
            reason="bad input",
            error_code="PermanentError",
        )
    )


def test_fail_ok_writes_failed_and_deletes() -> None:
    s = Script([ok(), ok()])
    fin = _fail(s)
    assert fin.outcome == "done"
    assert s.ops == ["dynamodb.UpdateItem", "sqs.DeleteMessage"]
    params = s.calls[0].params
    assert_fenced(params, token=2)
    sets = update_sets(params)
    assert (sets["state"], sets["reason"], sets["error_code"]) == (
        "'failed'",
        "'bad input'",
        "'PermanentError'",
    )
    ev = s.event("job_failed")
    assert (ev["error_code"], ev["reason"]) == ("PermanentError", "bad input")


def test_fail_rejected_never_deletes() -> None:
    s = Script([condition_failed(job_item(token=4, owner=OTHER))])
    fin = _fail(s)
    assert fin.outcome == "rejected"
    assert s.ops == ["dynamodb.UpdateItem"]
    ev = s.event("result_rejected")
    assert (ev["stage"], ev["reason"]) == ("fail", "token moved from 2 to 4")
    assert "job_failed" not in s.event_names()


def test_fail_unknown_is_journaled_as_ownership_unknown() -> None:
    s = Script([err(ErrorKind.INVALID, "ValidationException")])
    fin = _fail(s)
    assert fin.outcome == "unknown"
    assert s.event("ownership_unknown")["stage"] == "fail"


def _park(script: Script) -> Finish:
    return script.run(
        park_flow(
            table(),
            EndRequest(
                QUEUE, job_view(token=2), delivery(receipt_handle="rh-p"), WORKER, WALL, "n-1"
            ),
            reason="intent ambiguous",
        )
    )


def test_park_ok_writes_parked_and_deletes() -> None:
    s = Script([ok(), ok()])
    fin = _park(s)
    assert fin.outcome == "done"
    assert s.ops == ["dynamodb.UpdateItem", "sqs.DeleteMessage"]
    params = s.calls[0].params
    assert_fenced(params, token=2)
    sets = update_sets(params)
    assert (sets["state"], sets["error_code"], sets["reason"]) == (
        "'parked'",
        "'parked'",
        "'intent ambiguous'",
    )
    assert s.event("job_parked") == {"job_id": "job-1", "token": 2, "reason": "intent ambiguous"}


def test_park_rejected_keeps_message() -> None:
    s = Script([condition_failed(job_item(token=3, owner=OTHER))])
    fin = _park(s)
    assert (fin.outcome, fin.reason) == ("rejected", "token moved from 2 to 3")
    assert s.ops == ["dynamodb.UpdateItem"]
    assert "job_parked" not in s.event_names()


def test_park_unanswered_keeps_message() -> None:
    s = Script([unreachable()] * 3)
    fin = _park(s)
    assert fin.outcome == "unknown"
    assert s.ops == ["dynamodb.UpdateItem"] * 3  # retried, never deleted
    assert "job_parked" not in s.event_names()


# =========================================================================== release


def test_release_requeues_records_and_sets_visibility_zero() -> None:
    held: list[tuple[JobView | None, Delivery]] = [
        (job_view("job-a", token=2), delivery("job-a", receipt_handle="rh-a")),
        (None, delivery("job-b", receipt_handle="rh-b")),
        (job_view("job-c", token=5), delivery("job-c", receipt_handle="rh-c")),
    ]
    s = Script(
        [
            ok(),
            ok(),
            ok({"Successful": [{"Id": "0"}, {"Id": "2"}], "Failed": [{"Id": "1", "Code": "X"}]}),
        ]
    )
    released = s.run(
        release_flow(
            table(),
            queue_url=QUEUE,
            held=held,
            worker_id=WORKER,
            wall_now=WALL,
            reason="shutdown",
            nonce="n-1",
        )
    )
    assert released == 2  # counts Successful only
    assert s.ops == [
        "dynamodb.UpdateItem",
        "dynamodb.UpdateItem",
        "sqs.ChangeMessageVisibilityBatch",
    ]
    a, c = s.calls[0].params, s.calls[1].params
    assert (a["Key"], c["Key"]) == ({"job_id": {"S": "job-a"}}, {"job_id": {"S": "job-c"}})
    assert_fenced(c, token=5)
    assert update_sets(a)["error_code"] == "'released'"
    assert update_sets(a)["state"] == "'queued'"
    entries = s.calls[2].params["Entries"]
    assert entries == [
        {"Id": "0", "ReceiptHandle": "rh-a", "VisibilityTimeout": 0},
        {"Id": "1", "ReceiptHandle": "rh-b", "VisibilityTimeout": 0},
        {"Id": "2", "ReceiptHandle": "rh-c", "VisibilityTimeout": 0},
    ]
    assert s.event("messages_released") == {"count": 2, "reason": "shutdown", "lapsed": 0}


def test_release_batches_by_ten_and_skips_rejected_requeue() -> None:
    held: list[tuple[JobView | None, Delivery]] = [
        (None, delivery(f"job-{i:02d}", receipt_handle=f"rh-{i:02d}")) for i in range(12)
    ]
    held[0] = (job_view("job-00", token=2), held[0][1])

    def respond(c: Call) -> Outcome:
        if c.op == "UpdateItem":
            return condition_failed(job_item("job-00", token=3, owner=OTHER))
        if len(c.params["Entries"]) == 10:
            return ok({"Successful": [{"Id": e["Id"]} for e in c.params["Entries"]]})
        return unreachable()

    s = Script(respond)
    released = s.run(
        release_flow(
            table(),
            queue_url=QUEUE,
            held=held,
            worker_id=WORKER,
            wall_now=WALL,
            reason="sigterm",
            nonce="n-1",
        )
    )
    # job-00's requeue was rejected (token moved): its visibility belongs to the new
    # owner, so only the other 11 are handed back: 10 confirmed, the batch of 1 unanswered.
    assert released == 10
    batches = s.calls_to("ChangeMessageVisibilityBatch")
    assert [len(c.params["Entries"]) for c in batches] == [10, 1]
    handed = [e["ReceiptHandle"] for c in batches for e in c.params["Entries"]]
    assert "rh-00" not in handed
    skipped = s.event("job_release_skipped")
    assert (skipped["job_id"], skipped["reason"]) == ("job-00", "token moved from 2 to 3")


# =========================================================================== poison


def _poison(script: Script, dlq: str | None, body: str = '{"oops"') -> None:
    script.run(
        poison_flow(
            table(),
            queue_url=QUEUE,
            poison=Poison("m-9", "rh-9", "message body is not JSON"),
            dlq_url=dlq,
            body=body,
        )
    )


def test_poison_with_dlq_copies_then_deletes() -> None:
    s = Script([ok({"MessageId": "dlq-1"}), ok()])
    _poison(s, DLQ)
    assert s.ops == ["sqs.SendMessage", "sqs.DeleteMessage"]
    send = s.calls[0].params
    assert (send["QueueUrl"], send["MessageBody"]) == (DLQ, '{"oops"')
    assert send["MessageAttributes"]["sqs_lease_reason"] == {
        "DataType": "String",
        "StringValue": "message body is not JSON",
    }
    assert s.calls[1].params == {"QueueUrl": QUEUE, "ReceiptHandle": "rh-9"}
    ev = s.event("message_poisoned")
    assert (ev["moved_to_dlq"], ev["message_id"], ev["reason"]) == (
        True,
        "m-9",
        "message body is not JSON",
    )


def test_poison_without_dlq_deletes() -> None:
    s = Script([ok()])
    _poison(s, None)
    assert s.ops == ["sqs.DeleteMessage"]
    assert s.event("message_poisoned")["moved_to_dlq"] is False


def test_poison_dlq_send_failure_keeps_the_message() -> None:
    s = Script([unreachable()])
    _poison(s, DLQ)
    ev = s.event("message_poisoned")
    assert ev["moved_to_dlq"] is False and ev["kept"] is True
    assert s.calls_to("DeleteMessage") == []  # the only copy is not destroyed


def test_poison_empty_body_gets_a_placeholder() -> None:
    s = Script([ok(), ok()])
    _poison(s, DLQ, body="")
    assert s.calls[0].params["MessageBody"] == "<empty>"


# =========================================================================== cancel


def _cancel(script: Script) -> JobView:
    return script.run(cancel_flow(table(), job_id="job-1", reason="user closed", wall_now=WALL))


def test_cancel_ok_moves_token_and_returns_new_record() -> None:
    after = job_item(
        state=JobState.CANCELLED, token=3, error_code="cancelled", reason="cancelled: user closed"
    )
    s = Script([ok({"Attributes": after})])
    view = _cancel(s)
    assert (view.state, view.token, view.error_code) == (JobState.CANCELLED, 3, "cancelled")
    params = s.calls[0].params
    assert params["ReturnValues"] == "ALL_NEW"
    assert params["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"
    assert condition_text(params) == (
        "(attribute_exists (job_id) AND state IN ('queued', 'running', 'parked'))"
    )
    sets = update_sets(params)
    assert (sets["token"], sets["state"], sets["error_code"], sets["reason"]) == (
        "token + 1",
        "'cancelled'",
        "'cancelled'",
        "'cancelled: user closed'",
    )
    assert s.event("job_cancelled") == {"job_id": "job-1", "token": 3, "reason": "user closed"}


def test_cancel_of_terminal_job_is_a_noop() -> None:
    s = Script([condition_failed(job_item(state=JobState.SUCCEEDED, token=4))])
    view = _cancel(s)
    assert (view.state, view.token) == (JobState.SUCCEEDED, 4)
    assert s.event("job_cancel_noop") == {"job_id": "job-1", "state": "succeeded"}
    assert "job_cancelled" not in s.event_names()


def test_cancel_of_missing_job_raises_not_found() -> None:
    with pytest.raises(JobNotFound, match="'job-1'"):
        _cancel(Script([condition_failed(None)]))


def test_cancel_job_flow_says_whether_this_call_cancelled_or_the_job_was_already_final() -> None:
    after = job_item(state=JobState.FAILED, token=3, error_code="cancelled")
    done = Script([ok({"Attributes": after})]).run(
        cancel_job_flow(table(), job_id="job-1", reason="r", wall_now=WALL)
    )
    assert (done.verdict, done.job.token) == ("cancelled", 3)
    # A job cancelled before looks the same as one cancelled now: only the verdict tells.
    before = Script([condition_failed(after)]).run(
        cancel_job_flow(table(), job_id="job-1", reason="r", wall_now=WALL)
    )
    assert (before.verdict, before.job.token) == ("already_final", 3)


def test_cancel_unanswered_raises() -> None:
    with pytest.raises(AwsCallFailed, match="cancel job-1"):
        _cancel(Script([unreachable()]))


# =========================================================================== calls


@pytest.mark.parametrize(
    ("name", "json_code", "query_code"),
    [
        ("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", "InvalidReceiptHandle"),
        ("MessageNotInflight", "MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight"),
        ("QueueDoesNotExist", "QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"),
        ("InvalidParameterValue", "InvalidParameterValue", "InvalidParameterValueException"),
    ],
)
def test_sqs_code_is_matches_both_spellings(name: str, json_code: str, query_code: str) -> None:
    assert sqs_code_is(name, json_code)
    assert sqs_code_is(name, query_code)
    assert sqs_code_is(name, None, "", query_code)
    assert not sqs_code_is(name, None, "")
    assert not sqs_code_is(name, "AccessDenied")


def test_sqs_code_is_unknown_name_matches_itself_only() -> None:
    assert sqs_code_is("OverLimit", "OverLimit")
    assert not sqs_code_is("OverLimit", "AWS.SimpleQueueService.OverLimit")
    assert not sqs_code_is("MessageNotInflight", "ReceiptHandleIsInvalid")


@pytest.mark.parametrize(
    ("kind", "unknown"),
    [
        (ErrorKind.UNREACHABLE, True),
        (ErrorKind.SERVER, True),
        (ErrorKind.THROTTLED, True),
        (ErrorKind.CONDITION_FAILED, False),
        (ErrorKind.TRANSACTION_CANCELLED, False),
        (ErrorKind.NOT_FOUND, False),
        (ErrorKind.INVALID, False),
    ],
)
def test_err_unknown_only_for_unanswered_kinds(kind: ErrorKind, unknown: bool) -> None:
    assert Err(kind).unknown is unknown


def test_view_of_reads_a_projected_item() -> None:
    # BatchGetItem projects; message_sent is absent there and must not read as False.
    item = _running("job-1", token=6)
    projected = {k: v for k, v in item.items() if k != "message_sent"}
    view = view_of(projected)
    assert (view.token, view.state, view.owner, view.message_sent) == (
        6,
        JobState.RUNNING,
        WORKER,
        True,
    )


# =========================================================================== apply_beats


def test_apply_beats_moves_each_lease_by_its_verdict() -> None:
    ok_l, lost_l, canc_l, unk_l, done_l, fin_l = (
        local_lease(f"job-{n}") for n in ("ok", "lost", "canc", "unk", "done", "fin")
    )
    put(fin_l, LeaseStatus.DONE)  # the handler returned while the round was in flight
    report = HeartbeatReport(
        {
            "job-ok": Beat("job-ok", BeatStatus.OK, deadline=1180.0),
            "job-lost": Beat("job-lost", BeatStatus.LOST, reason="token moved to 3"),
            "job-canc": Beat("job-canc", BeatStatus.CANCELLED, reason="cancelled: stop"),
            "job-unk": Beat("job-unk", BeatStatus.UNKNOWN, reason="dynamodb: timeout"),
            "job-done": Beat("job-done", BeatStatus.DONE, reason="job is succeeded"),
            "job-fin": Beat("job-fin", BeatStatus.LOST, reason="sqs: ReceiptHandleIsInvalid"),
        }
    )
    out = apply_beats(
        [ok_l, lost_l, canc_l, unk_l, done_l, fin_l],
        report,
        started=1100.0,
    )
    assert out.extended == (ok_l,) and out.cancel == (lost_l, canc_l)
    assert (ok_l.deadline, ok_l.status, ok_l.next_beat) == (1180.0, LeaseStatus.OK, 1110.0)
    assert (lost_l.status, lost_l.reason) == (LeaseStatus.LOST, "token moved to 3")
    assert canc_l.status is LeaseStatus.CANCELLED
    # unknown: the old deadline stands, another try soon (within the reserve)
    assert (unk_l.status, unk_l.deadline, unk_l.next_beat) == (LeaseStatus.UNKNOWN, 1060.0, 1101.0)
    assert (done_l.status, done_l.deadline) == (LeaseStatus.OK, 1060.0)
    assert fin_l.status is LeaseStatus.DONE


# ================================================= own end write: recognised by its id
#
# Issue 32 item 3: a writer of the job record that is not the attempt (a producer
# role able to UpdateItem/PutItem the table, a hand-made update) sets the running
# record to the state an end write would leave, keeping its token and owner, while
# that end write's answer is lost. The attempt recognises its own write by the id
# it wrote in the same conditional update (``write_id``), so the forgery is never
# taken for its own: no result_committed, no stage_committed, no job_failed.


def _end_write(kind: str, script: Script) -> Finish:
    """Run the end write ``kind`` of an attempt with nonce n-1 (job token 2, attempt 1)."""
    job = job_view(token=2, attempt=1)
    end = EndRequest(QUEUE, job, delivery(receipt_handle="rh-e"), WORKER, WALL, NONCE)
    if kind == "commit":
        return script.run(commit_flow(table(), end, result_json='{"text": "ok"}', duration=1.0))
    if kind == "fail":
        return script.run(fail_flow(table(), end, reason="bad", error_code="E"))
    if kind == "retry":
        return script.run(
            retry_flow(table(), end, reason="flaky", error_code="E", delay=5, max_attempts=3)
        )
    if kind == "park":
        return script.run(park_flow(table(), end, reason="ambiguous"))
    if kind == "stage":
        nxt = NextStage("two", {"page": 2}, result={"done": 1})
        done = script.run(
            continue_flow(table(), end, nxt=nxt, input_json='{"page":2}', duration=1.0)
        )
        return done.fin
    raise AssertionError(kind)


END_WRITES = {
    # kind: (the state it leaves, the event only a write of its own may journal)
    "commit": (JobState.SUCCEEDED, "result_committed"),
    "fail": (JobState.FAILED, "job_failed"),
    "retry": (JobState.QUEUED, "job_retry_scheduled"),
    "park": (JobState.PARKED, "job_parked"),
    "stage": (JobState.QUEUED, "stage_committed"),
}


@pytest.mark.parametrize("forged_id", [None, "n-9:commit", "n-1:other"])
@pytest.mark.parametrize("kind", sorted(END_WRITES))
def test_a_record_forged_to_the_end_state_during_a_lost_answer_is_not_the_attempts_write(
    kind: str, forged_id: str | None
) -> None:
    # The first try is unanswered (it did not apply: the forger's write came first);
    # the retry's condition fails and ALL_OLD shows the forged record: the end state,
    # this attempt's token and owner, and no write id of this attempt's.
    state, own_event = END_WRITES[kind]
    forged = job_item(state=state, owner=WORKER, token=2, attempt=1, write_id=forged_id)
    answers = iter([unreachable(), condition_failed(forged)])
    s = Script(lambda c: next(answers, ok()))
    fin = _end_write(kind, s)
    assert fin.outcome == "rejected", fin
    assert "not by this attempt's write" in fin.reason
    assert own_event not in s.event_names()
    assert "result_rejected" in s.event_names()
    # Nothing of the attempt's ending followed: no delete, no visibility, no send.
    assert not [c for c in s.calls if c.service == "sqs"]


@pytest.mark.parametrize("kind", sorted(END_WRITES))
def test_each_end_write_sets_its_own_write_id_in_the_fenced_update(kind: str) -> None:
    s = Script(lambda c: ok({"MessageId": "m-2"}) if c.op == "SendMessage" else ok())
    fin = _end_write(kind, s)
    assert fin.outcome == "done"
    write = s.calls[0].params
    assert_fenced(write, token=2)
    assert update_sets(write)["write_id"] == repr(f"{NONCE}:{kind}")


@pytest.mark.parametrize("kind", sorted(END_WRITES))
def test_each_end_write_whose_first_try_applied_is_recognised_by_its_id(kind: str) -> None:
    state, own_event = END_WRITES[kind]
    mine = job_item(state=state, owner=WORKER, token=2, attempt=1, write_id=f"{NONCE}:{kind}")
    answers = iter([unreachable(), condition_failed(mine)])
    s = Script(lambda c: next(answers, ok({"MessageId": "m-2"})))
    fin = _end_write(kind, s)
    assert (fin.outcome, fin.reason) == ("done", "an earlier try applied")
    assert own_event in s.event_names()


def test_a_release_on_the_attempts_behalf_is_not_the_attempts_own_write() -> None:
    # Shutdown released the record (its own nonce); the attempt's late retry, whose
    # first try went unanswered, meets it: a queued record under its token, not its write.
    released = job_item(state=JobState.QUEUED, owner=WORKER, token=2, write_id="n-7:release")
    answers = iter([unreachable(), condition_failed(released)])
    s = Script(lambda c: next(answers, ok()))
    fin = _end_write("retry", s)
    assert fin.outcome == "rejected"
    assert "job_retry_scheduled" not in s.event_names()


def test_a_release_needs_a_nonce_for_a_claimed_record() -> None:
    with pytest.raises(ValueError, match="nonce"):
        Script([]).run(
            release_flow(
                table(),
                queue_url=QUEUE,
                held=[(job_view(token=2), delivery())],
                worker_id=WORKER,
                wall_now=WALL,
                reason="shutdown",
                nonce="",
            )
        )


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.QUEUED, JobState.FAILED])
def test_heartbeat_record_forged_out_of_running_under_our_token_is_lost_not_done(
    state: JobState,
) -> None:
    # The record left running under this attempt's token, but not by its own write:
    # another writer took the job from it (the handler is told), it did not end it.
    s, verdict = _one_beat(job_item("job-1", state=state, owner=WORKER, token=2, write_id=None))
    assert verdict == ("lost", f"job is {state}", None)
    assert s.event("heartbeat_lost")["reason"] == f"job is {state}"


def test_heartbeat_sqs_gone_and_a_forged_end_is_not_done() -> None:
    forged = job_item("job-1", state=JobState.SUCCEEDED, token=2, write_id="n-9:commit")
    s = Script(
        [
            ok({"Failed": [{"Id": "0", "Code": "ReceiptHandleIsInvalid", "SenderFault": True}]}),
            ok({"Responses": {TABLE: [forged]}}),
        ]
    )
    beat = _beat(s, [local_lease("job-1", token=2)]).beats["job-1"]
    assert beat.status != "done"


def test_a_batch_sqs_refuses_whole_for_its_cap_is_asked_entry_by_entry() -> None:
    # moto refuses its 12-hour cap for the whole batch; AWS per entry. Either way the
    # refused entry is found, and a record still ours reads as capped, not lost.
    leases = [local_lease("job-a"), local_lease("job-b")]
    s = Script(
        [
            err(ErrorKind.INVALID, "InvalidParameterValue", sent_at=100.0),
            ok({}, sent_at=101.0),
            err(ErrorKind.INVALID, "InvalidParameterValue", sent_at=102.0),
            ok({"Responses": {TABLE: [_running("job-a"), _running("job-b")]}}),
        ]
    )
    report = _beat(s, leases)
    assert [c.op for c in s.calls] == [
        "ChangeMessageVisibilityBatch",
        "ChangeMessageVisibility",
        "ChangeMessageVisibility",
        "BatchGetItem",
    ]
    assert report.beats["job-a"].status == "ok"
    assert report.beats["job-a"].deadline == 101.0 + leases[0].lease_seconds
    assert report.beats["job-b"].status == "capped"
