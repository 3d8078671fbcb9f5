"""A Lambda record received and not started waits as a fresh message (issue 26; soak
seeds 117 and 1045968), driven by hand (no AWS).

A record behind long records in a batch is not started for the time left (or its
visibility lapsed before its turn); handed back, each such receive counted toward
the redrive bound, SQS dead-lettered a job whose handler never ran. It now waits as
a slot waiter does (``slots`` rule 4): the record names a new send id (the take of
the send, conditioned on the received message's send id), that message is sent with
the wait as its delay and the received one is deleted, so SQS's count restarts.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from typing import Any

from core_harness import (
    QUEUE,
    WORKER,
    Script,
    condition_equalities,
    condition_failed,
    delivery,
    err,
    job_item,
    ok,
    table,
    update_sets,
)

from sqs_lease._core.calls import Call, ErrorKind, Outcome
from sqs_lease._core.env import AttemptEnv, Now
from sqs_lease._core.eventsource import GroupStop
from sqs_lease._core.invocation import RecordEnd, record_flow, release_unstarted_records_flow
from sqs_lease._core.leasebook import Flag, LeaseBook
from sqs_lease._core.records import JobState
from sqs_lease._core.slots import wait_send_id, waits_of
from sqs_lease._schema.intent_requests import IntentTable

WALL = 1_700_000_100.0
FIFO = "https://sqs.test/123/work.fifo"


def env(queue_url: str = QUEUE) -> AttemptEnv:
    counts: Counter[str] = Counter()

    def tally(name: str, n: int) -> None:
        counts[name] += n

    return AttemptEnv(
        table=table(),
        intents=IntentTable("intents-test", "attempts-test"),
        queue_url=queue_url,
        dlq_url=None,
        worker_id=WORKER,
        book=LeaseBook(),
        rules_of=lambda name: None,
        receive_visibility=30,
        unknown_class_receives=5,
        now=lambda: Now(1000.0, WALL),
        random=lambda: 0.5,
        write_id=lambda: "nonce",
        tally=tally,
        new_signal=Flag,
        run_handler=lambda run: None,
    )


def aws(record_state: JobState = JobState.QUEUED) -> tuple[Script, dict[str, Any]]:
    """SQS and DynamoDB as the flows find them: the record queued under the received
    message's send id (``send-1``), or in ``record_state``."""
    record = job_item(state=record_state, owner=None, token=3, attempt=1, send_id="send-1")
    sent: dict[str, Any] = {}

    def answer(c: Call) -> Outcome:
        if c.op == "UpdateItem" and "take" not in sent:
            sent["take"] = c.params
            if record_state is not JobState.QUEUED:
                return condition_failed(record)
            after = job_item(
                state=JobState.QUEUED,
                owner=None,
                token=3,
                attempt=1,
                send_id=ast.literal_eval(update_sets(c.params)["send_id"]),
                unsent_since=WALL,
            )
            return ok({"Attributes": after})
        if c.op == "SendMessage":
            sent["message"] = c.params
            return ok({"MessageId": "m-fresh"})
        return ok({"Successful": [{"Id": "0"}]})

    return Script(answer), sent


def unfit(queue_url: str = QUEUE, **kw: Any) -> RecordEnd:
    d = delivery(**kw)
    return RecordEnd(d.message_id, False, d)


def test_a_record_not_started_for_the_budget_waits_as_a_fresh_message() -> None:
    script, sent = aws()
    back = script.run(
        release_unstarted_records_flow(env(), [unfit(receive_count=7)], lambda: 40_500)
    )
    assert back == 1
    ops = [c.op for c in script.calls]
    assert ops == ["UpdateItem", "SendMessage", "UpdateItem", "DeleteMessage"], ops
    # The take names the fresh message's send id, conditioned on the received one's.
    take = condition_equalities(sent["take"])
    assert take["send_id"] == "send-1" and take["state"] == JobState.QUEUED.value
    fresh = json.loads(sent["message"]["MessageBody"])["send_id"]
    assert fresh == wait_send_id(1, "mm-job-1", "job-1") and waits_of(fresh) == 1
    assert 1 <= sent["message"]["DelaySeconds"] <= 30  # a slot waiter's delay (rule 6)
    assert script.calls[-1].params["ReceiptHandle"] == "rh-1"  # the received one retired
    assert not any("ChangeMessageVisibility" in c.op for c in script.calls)
    (waits,) = [e for e in script.events if e.event == "lambda_record_waits"]
    assert waits.fields["receive_count"] == 7


def test_each_wait_of_a_record_never_claimed_has_its_own_send_id() -> None:
    # No claim moves the token between two such waits: the retired message's id
    # keeps each send id unique, and the count of waits goes on (rule 6's seniority).
    first = wait_send_id(1, "mm-1", "job-1")
    script, sent = aws()
    script.run(release_unstarted_records_flow(env(), [unfit(send_id=first)], lambda: 40_500))
    fresh = json.loads(sent["message"]["MessageBody"])["send_id"]
    assert fresh != first and waits_of(fresh) == 2


def test_a_record_that_moved_on_is_handed_back_for_the_rest_of_the_invocation() -> None:
    # Claimed meanwhile by another copy of its message (or ended, or this message a
    # stray): the take is refused, nothing is sent, the message is handed back.
    script, sent = aws(JobState.RUNNING)
    back = script.run(release_unstarted_records_flow(env(), [unfit()], lambda: 40_500))
    assert "message" not in sent
    (cmv,) = [c for c in script.calls if c.op == "ChangeMessageVisibilityBatch"]
    assert cmv.params["Entries"][0]["VisibilityTimeout"] == 41
    assert back == 1


def test_a_fifo_record_keeps_its_message_and_its_place_in_its_group() -> None:
    # A fresh message would go behind its session's later jobs: released, unwritten.
    script, sent = aws()
    ends = [unfit(), RecordEnd("m-2", False, delivery("job-2", receipt_handle="rh-2"), True)]
    script.run(release_unstarted_records_flow(env(FIFO), ends, lambda: 40_500))
    assert not any(c.op == "UpdateItem" for c in script.calls) and "message" not in sent
    seen = {
        e["ReceiptHandle"]: e["VisibilityTimeout"]
        for c in script.calls
        for e in c.params.get("Entries", [])
    }
    assert seen == {"rh-2": 0, "rh-1": 41}  # the blocked one at once, the unfit one later


def test_a_record_sqs_would_not_take_waits_like_one_the_budget_did_not_fit() -> None:
    # Its visibility lapsed behind the batch's earlier records (MessageNotInflight):
    # not started either, so it is handed to the end of the batch, not dropped.
    record = {
        "messageId": "m-job-1",
        "receiptHandle": "rh-1",
        "body": json.dumps({"job_id": "job-1", "job_class": "ocr", "send_id": "send-1"}),
        "attributes": {"ApproximateReceiveCount": "5"},
    }
    script = Script([err(ErrorKind.CONDITION_FAILED, "MessageNotInflight")])
    end = script.run(record_flow(env(), record, GroupStop(), lambda: 800_000))
    assert end is not None and not end.done
    assert end.unstarted is not None and end.unstarted.job_id == "job-1"
    assert not end.blocked


def test_a_record_sqs_refused_for_another_reason_is_left_to_its_visibility() -> None:
    # A denied call or a throttle is no lapse: the record is not waited fresh (a
    # consumer denied ChangeMessageVisibility would loop forever instead of reaching
    # the DLQ, where the sweep parks it for an operator to see).
    record = {
        "messageId": "m-job-1",
        "receiptHandle": "rh-1",
        "body": json.dumps({"job_id": "job-1", "job_class": "ocr", "send_id": "send-1"}),
        "attributes": {"ApproximateReceiveCount": "5"},
    }
    script = Script([err(ErrorKind.INVALID, "AccessDenied")])
    end = script.run(record_flow(env(), record, GroupStop(), lambda: 800_000))
    assert end is not None and not end.done and end.unstarted is None
