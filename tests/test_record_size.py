"""The size of a job record: every write that grows it is checked against the whole
item it makes (issue 26, "read and settle": the final stage's result and the stage
log; ``keep_rejected`` and the record's reserve).

The pure tests build records with the real request builders (``_schema.JobTable``)
applied by the simulator's DynamoDB expression engine and measured as DynamoDB
measures an item; the integration test runs a staged job on a real worker.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from core_harness import QUEUE, WORKER, Script, delivery, job_view, ok
from pydantic import BaseModel
from worker_helpers import FAST, collect_journal, prepare, read_view, running

from sqs_lease import App, JobContext, NextStage, Producer, Worker
from sqs_lease._core import limits
from sqs_lease._core.calls import Call
from sqs_lease._core.endings import Ending, EndKind
from sqs_lease._core.endwrites import EndRequest, commit_flow
from sqs_lease._core.inputs import NAME_LIMIT, SEND_ID_LIMIT
from sqs_lease._core.limits import (
    CODE_LIMIT,
    ITEM_LIMIT,
    PROGRESS_LIMIT,
    REASON_LIMIT,
    REJECTED_CONTENT_LIMIT,
    bounded,
    record_problem,
)
from sqs_lease._core.timeline import EVENT_BYTES, TIMELINE_LIMIT, event
from sqs_lease._core.timeline import TimelineKind as TK
from sqs_lease._schema.job_requests import JobTable
from sqs_lease.testing._sim.expr import request_expressions

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient

Item = dict[str, Any]
JT = JobTable("jobs-test")
JOB = "j"
# The largest ids and names the toolkit accepts (a worker id is the operator's: as
# long as a name).
NAME = "n" * NAME_LIMIT
SEND = "s" * SEND_ID_LIMIT
WIDE = "\U0001f600"  # 4 bytes in UTF-8: the worst case of a bounded character count


def _value_size(value: Any) -> int:
    """DynamoDB's size of one attribute value (its documented rules, rounded up)."""
    ((kind, v),) = value.items()
    if kind == "S":
        return len(v.encode("utf-8"))
    if kind == "N":
        return len(v) + 1
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "L":
        return 3 + sum(1 + _value_size(e) for e in v)
    if kind == "M":
        return 3 + sum(1 + len(k.encode("utf-8")) + _value_size(e) for k, e in v.items())
    raise AssertionError(f"no size rule for {kind}")


def _item_size(item: Item) -> int:
    return sum(len(name.encode("utf-8")) + _value_size(v) for name, v in item.items())


def _apply(item: Item | None, call: Call) -> Item:
    params = call.params
    if call.op == "PutItem":
        return dict(params["Item"])
    ex = request_expressions(params)
    assert ex.check(item), f"{call.op}: its condition failed on the record built so far"
    new = ex.apply(item, {"job_id": params["Key"]["job_id"]})
    assert new is not None
    return new


def _brought(item: Item) -> int:
    """The bytes of what the job brings (payload, stage log and input, result) and its
    id: what ``record_problem`` measures itself, outside RECORD_ROOM."""
    total = len(JOB.encode())
    for name in ("payload", "stages", "stage_input", "result"):
        if name in item:
            total += len(item[name]["S"].encode("utf-8"))
    return total


def _full_timeline(item: Item) -> Item:
    """The timeline at the bound the room counts: TIMELINE_LIMIT events of EVENT_BYTES
    (today's largest encodes to less; the bound leaves the format room to grow)."""
    largest = event(TK.REFUSED, 1.0e9, owner=NAME, token=10**6, detail=WIDE * 5000, stage=NAME)
    assert len(largest.encode("utf-8")) <= EVENT_BYTES
    return {**item, "timeline": {"L": [{"S": "e" * EVENT_BYTES}] * TIMELINE_LIMIT}}


def _worst_running_record() -> Item:
    item = _apply(
        None,
        JT.put_new(
            job_id=JOB,
            job_class=NAME,
            payload_json="{}",
            payload_hash="h" * 64,
            wall_now=1.0e9,
            send_id=SEND,
            stage=NAME,
            tenant=NAME,
            priority="interactive",
        ),
    )
    item["group_id"] = {"S": NAME}
    item = _apply(item, JT.claim(JOB, NAME, 1.0e9, 43_200, job_class=NAME, send_id=SEND))
    token = int(item["token"]["N"])
    progress = json.dumps(["x" * (PROGRESS_LIMIT - 6)])
    item = _apply(item, JT.save_progress(JOB, token, progress, 1.0e9))
    return _full_timeline(item)


def test_the_record_room_covers_a_rejected_result_kept_on_a_record_at_every_other_bound() -> None:
    # A fenced-out attempt's result is kept on the record (unfenced, after the refusal):
    # on a running record whose owner then commits, and on a record already ended.
    # Either way the record's reserve must hold it, or the owner's commit (measured
    # against the reserve) is refused by DynamoDB as invalid: a correct job failed.
    item = _worst_running_record()
    token = int(item["token"]["N"])
    item = _apply(
        item,
        JT.keep_rejected(JOB, token - 1, NAME, "r" * 100_000, 1.0e9, keep_content=True),
    )
    assert len(item["rejected_result"]["S"]) == REJECTED_CONTENT_LIMIT
    committed = _apply(item, JT.commit(JOB, token, NAME, '{"r":1}', 1.0e9, write_id=SEND))
    assert _item_size(committed) - _brought(committed) <= limits.RECORD_ROOM
    # ...and a second stale attempt's, kept on the succeeded record.
    again = _apply(
        committed,
        JT.keep_rejected(JOB, token - 2, NAME, "q" * 100_000, 1.0e9, keep_content=True),
    )
    assert _item_size(again) - _brought(again) <= limits.RECORD_ROOM


@pytest.mark.parametrize("end", ["fail", "park", "requeue"])
def test_the_record_room_covers_an_ended_record_with_the_longest_reason(end: str) -> None:
    item = _worst_running_record()
    token = int(item["token"]["N"])
    item = _apply(
        item,
        JT.keep_rejected(JOB, token - 1, NAME, "r" * 100_000, 1.0e9, keep_content=True),
    )
    reason = bounded(WIDE * (2 * REASON_LIMIT))
    code = Ending(EndKind.FAIL, reason, WIDE * 1000).code  # a handler's own, cut
    assert len(code) == CODE_LIMIT
    if end == "fail":
        call = JT.end_in_error(JOB, token, NAME, reason, code, 1.0e9, write_id=SEND, retry=False)
    elif end == "park":
        call = JT.park(JOB, token, NAME, reason, 1.0e9, write_id=SEND)
    else:
        call = JT.end_in_error(JOB, token, NAME, reason, code, 1.0e9, write_id=SEND, retry=True)
    ended = _apply(item, call)
    assert _item_size(ended) - _brought(ended) <= limits.RECORD_ROOM


def test_a_record_problem_is_measured_on_every_part_the_record_holds() -> None:
    third = "x" * (ITEM_LIMIT // 3)
    assert record_problem(JOB, payload="{}", result=third) is None
    problem = record_problem(JOB, payload="{}", stage_log=third, stage_input=third, result=third)
    assert problem is not None
    assert f"stage log {len(third)}" in problem and str(ITEM_LIMIT) in problem


def test_a_final_stage_result_that_breaks_the_item_with_the_stage_log_and_input_is_never_sent() -> (
    None
):
    # Payload and result alone fit; with the committed stages' checkpoints and the
    # final stage's input (both stay on the record) they do not: DynamoDB would refuse
    # the commit as invalid (error_code dynamodb_validation), not name the limit.
    log = json.dumps([{"stage": "fetch", "result": "c" * 150_000}])
    job = replace(
        job_view("job-1"),
        payload_json='{"n":1}',
        stage="render",
        stage_log=log,
        stage_input=json.dumps({"rows": "i" * 120_000}),
    )
    s = Script([ok({}), ok({})])  # the fail write and the delete: no commit is sent
    fin = s.run(
        commit_flow(
            JT,
            EndRequest(
                queue_url=QUEUE,
                job=job,
                delivery=delivery("job-1"),
                worker_id=WORKER,
                wall_now=1.0e9,
                nonce="n-1",
            ),
            result_json=json.dumps({"text": "r" * 100_000}),
            duration=1.0,
        )
    )
    assert fin.outcome == "failed"
    (write,) = s.calls_to("UpdateItem")
    assert "result" not in str(write.params["ExpressionAttributeNames"].values())
    failed = s.event("job_failed")
    assert failed["error_code"] == "result_too_large"
    assert "stage log" in failed["reason"] and "stage input" in failed["reason"]


# =========================================================================== real moto


class Order(BaseModel):
    n: int


@pytest.mark.integration
def test_a_staged_jobs_oversize_final_result_fails_as_result_too_large_on_a_worker(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    report = app.staged("report", payload=Order, **FAST)

    @report.stage("fetch")
    def fetch(ctx: JobContext[Any], p: Order) -> NextStage:
        return NextStage("render", {"rows": "i" * 140_000}, result={"c": "c" * 160_000})

    @report.stage("render")
    def render(ctx: JobContext[Any], p: dict[str, Any]) -> dict[str, Any]:
        return {"text": "r" * 120_000}  # with the payload alone, far under the limit

    job_id = Producer(settings, app).submit("report", Order(n=1)).job_id
    with collect_journal() as journal, running(Worker(app, settings, worker_id="w")):
        journal.wait_for("job_failed", job_id=job_id, timeout=30)
    view = read_view(ddb_client, settings, job_id)
    assert (view.state, view.stage, view.error_code) == ("failed", "render", "result_too_large")
    assert journal.events("result_committed", job_id=job_id) == []
    assert journal.events("ownership_unknown", job_id=job_id) == []
    assert journal.events("job_write_refused", job_id=job_id) == []  # never sent
