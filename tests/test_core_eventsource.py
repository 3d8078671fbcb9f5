"""The Lambda event source's core rules, driven by hand (no AWS)."""

from __future__ import annotations

import json
from typing import Any

from core_harness import QUEUE, Script

from sqs_lease._core.calls import Err, ErrorKind, Ok
from sqs_lease._core.eventsource import (
    never_fit,
    parse_event_record,
    take_record_flow,
)
from sqs_lease._core.messages import Delivery, Poison


def record(body: str, count: str = "3") -> dict[str, Any]:
    return {
        "messageId": "m-1",
        "receiptHandle": "rh-1",
        "body": body,
        "attributes": {"ApproximateReceiveCount": count, "SentTimestamp": "1"},
        "eventSourceARN": "arn:aws:sqs:us-east-1:1:q",
    }


def test_an_event_record_is_read_in_its_own_key_spelling_like_a_received_message() -> None:
    body = json.dumps({"v": 1, "job_id": "j", "job_class": "work", "send_id": "s"})
    got = parse_event_record(record(body), 5.0, 30)
    assert got == Delivery("m-1", "rh-1", "j", "work", 3, 5.0, 30, "s", body, sent_wall=0.001)


def test_an_event_record_keeps_sqs_timestamps_for_the_12_hour_cap() -> None:
    body = json.dumps({"v": 1, "job_id": "j", "job_class": "work", "send_id": "s"})
    rec = record(body)
    rec["attributes"]["ApproximateFirstReceiveTimestamp"] = "1700000060500"
    got = parse_event_record(rec, 5.0, 30)
    assert isinstance(got, Delivery)
    assert (got.sent_wall, got.first_received_wall) == (0.001, 1_700_000_060.5)


def test_a_class_whose_budget_can_never_fit_the_invocation_is_named() -> None:
    budgets = {"ocr": 3600.0, "quick": 60.0, "edge": 897.0, "over": 897.5}
    assert never_fit(budgets, 900) == ["ocr", "over"]
    assert never_fit(budgets, 60) == ["edge", "ocr", "over", "quick"]


def test_an_event_record_whose_body_is_not_a_job_is_poison_with_its_handle() -> None:
    got = parse_event_record(record("not json"), 5.0, 30)
    assert isinstance(got, Poison)
    assert (got.message_id, got.receipt_handle, got.body) == ("m-1", "rh-1", "not json")


def test_taking_a_record_counts_its_lease_from_before_the_visibility_call() -> None:
    d = Delivery("m-1", "rh-1", "j", "work", 1, 0.0, 0)
    taken = Script([Ok({}, sent_at=7.0, received_at=7.5)]).run(take_record_flow(QUEUE, d, 45))
    assert isinstance(taken, Delivery) and (taken.received_at, taken.visibility) == (7.0, 45)


def test_a_record_sqs_refuses_to_extend_is_not_taken_and_says_why() -> None:
    d = Delivery("m-1", "rh-1", "j", "work", 1, 0.0, 0)
    script = Script([Err(ErrorKind.INVALID, "ReceiptHandleIsInvalid")])
    refused = script.run(take_record_flow(QUEUE, d, 45))
    assert isinstance(refused, Err) and refused.code == "ReceiptHandleIsInvalid"
    assert [e.event for e in script.events] == ["lambda_record_not_taken"]
