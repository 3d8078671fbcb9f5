"""The scale benchmark's stand-in answers as SQS and DynamoDB would for the calls it takes.

The stand-in replaces moto only to take the emulator's cost out of the worker's
figures; these check that it still refuses what the services refuse, so that
claims, extensions and commits measured against it behave as on the real thing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from benchmarks.bench_common import bench_send_id, job_bodies, job_item
from benchmarks.standin import StandIn
from sqs_lease import Settings
from sqs_lease._core.calls import Call, Err, Ok
from sqs_lease._schema.job_requests import JobTable


@pytest.fixture(params=["sim", "moto"])
def standin(request: pytest.FixtureRequest) -> Iterator[StandIn]:
    """The stand-in with each DynamoDB backend: the simulator's, and moto's in-process."""
    s = StandIn(ddb=request.param)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _receive(s: StandIn, n: int) -> list[dict[str, object]]:
    out, _idle = s.answer(
        Call(
            "sqs",
            "ReceiveMessage",
            {"QueueUrl": "q", "MaxNumberOfMessages": n, "VisibilityTimeout": 30},
        )
    )
    assert isinstance(out, Ok)
    messages: list[dict[str, object]] = out.response.get("Messages", [])
    return messages


def test_a_message_is_received_once_until_released_and_its_old_handle_then_fails(
    standin: StandIn,
) -> None:
    standin.send(job_bodies(["a", "b"], "c"))
    first = _receive(standin, 10)
    assert len(first) == 2 and _receive(standin, 10) == []
    handle = str(first[0]["ReceiptHandle"])
    released, _ = standin.answer(
        Call(
            "sqs",
            "ChangeMessageVisibility",
            {"QueueUrl": "q", "ReceiptHandle": handle, "VisibilityTimeout": 0},
        )
    )
    assert isinstance(released, Ok)
    again = _receive(standin, 10)
    assert len(again) == 1 and again[0]["ReceiptHandle"] != handle
    stale, _ = standin.answer(
        Call(
            "sqs",
            "ChangeMessageVisibilityBatch",
            {
                "QueueUrl": "q",
                "Entries": [{"Id": "0", "ReceiptHandle": handle, "VisibilityTimeout": 60}],
            },
        )
    )
    assert isinstance(stale, Ok)
    assert [f["Code"] for f in stale.response["Failed"]] == ["ReceiptHandleIsInvalid"]


def test_a_claim_whose_condition_fails_is_refused_as_by_dynamodb(standin: StandIn) -> None:
    settings = Settings(prefix="standintest")
    standin.create_tables(settings)
    jobs = JobTable(settings.jobs_table)
    standin.put_items(settings.jobs_table, [job_item(jobs, "j1", "c", {"n": 0})])
    claim = jobs.claim("j1", "w1", time.time(), 60, job_class="c", send_id=bench_send_id("j1"))
    stray = jobs.claim("j1", "w2", time.time(), 60, job_class="c", send_id="j1.other")
    wrong, _ = standin.answer(stray)
    first, _ = standin.answer(claim)
    assert isinstance(first, Ok)
    # A message that is not the job's current one claims nothing.
    assert isinstance(wrong, Err) and wrong.code == "ConditionalCheckFailedException"


def test_a_release_is_fenced_by_the_token_and_gives_the_claimed_attempt_back(
    standin: StandIn,
) -> None:
    settings = Settings(prefix="standinrel")
    standin.create_tables(settings)
    jobs = JobTable(settings.jobs_table)
    standin.put_items(settings.jobs_table, [job_item(jobs, "j1", "c", {"n": 0})])
    claim = jobs.claim("j1", "w1", time.time(), 60, job_class="c", send_id=bench_send_id("j1"))
    assert isinstance(standin.answer(claim)[0], Ok)
    stale, _ = standin.answer(
        jobs.release("j1", 0, "w1", "shutdown", time.time(), write_id="n-1:release")
    )
    assert isinstance(stale, Err) and stale.code == "ConditionalCheckFailedException"
    mine, _ = standin.answer(
        jobs.release("j1", 1, "w1", "shutdown", time.time(), write_id="n-1:release")
    )
    assert isinstance(mine, Ok)
    read, _ = standin.answer(jobs.batch_get(["j1"]))
    assert isinstance(read, Ok)
    (view,) = [jobs.parse(item) for item in jobs.batch_items(read.response)]
    assert (view.state.value, view.token, view.attempt) == ("queued", 1, 0)
