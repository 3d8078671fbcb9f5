"""A handler that holds the GIL makes its worker late on every attempt (issue 26,
"read and settle"): a real worker process, a real CPU-bound handler (``gil_worker``),
moto over HTTP.

Each late hand-back used to give the attempt back, so the job ran until SQS moved
its message to the DLQ, its class's ``max_attempts`` never reached and nothing
naming the class. The record now counts its late hand-backs; the one at
``LATE_HANDBACK_LIMIT`` is charged and told (``worker_late_charged``), and
``max_attempts`` ends the job.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import AwsTestEnv
from worker_helpers import HANG_GUARD, WorkerProcess, prepare, read_view, wait_until

from sqs_lease import Producer
from sqs_lease._core.timing import LATE_HANDBACK_LIMIT

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

pytestmark = [pytest.mark.integration]

HERE = Path(__file__).resolve().parent


def test_a_handler_holding_the_gil_is_charged_at_the_limit_and_fails_not_walked_into_the_dlq(
    aws: AwsTestEnv, ddb_client: DynamoDBClient, sqs_client: SQSClient, tmp_path: Path
) -> None:
    settings, _, dlq_url = prepare(aws.endpoint_url, aws.prefix)
    from gil_worker import Hog, app

    job_id = Producer(settings, app).submit("hog", Hog(hold=8.0)).job_id
    proc = WorkerProcess(HERE / "gil_worker.py", "w-gil", settings, tmp_path / "w.log")
    try:
        wait_until(
            lambda: read_view(ddb_client, settings, job_id).state.value == "failed",
            timeout=max(HANG_GUARD, 600.0),  # a hang guard: each attempt holds 8-16 s
            what=f"job {job_id} failed",
        )
    finally:
        proc.stop()
    view = read_view(ddb_client, settings, job_id)
    assert view.error_code == "attempts_exhausted", (view.error_code, view.reason)
    # Every run held the GIL past the lease, and every one was handed back late:
    # counted on the record, uncharged until the limit, the one at the limit charged.
    held = proc.events("hog_held")
    assert len(held) == LATE_HANDBACK_LIMIT and all(e["seconds"] >= 8.0 for e in held)
    late = proc.events("lease_dropped_late")
    assert [(e["late_handbacks"], e["charged"]) for e in late] == [
        (n, n == LATE_HANDBACK_LIMIT) for n in range(1, LATE_HANDBACK_LIMIT + 1)
    ]
    (told,) = proc.events("worker_late_charged")
    assert (told["job_id"], told["job_class"], told["limit"]) == (job_id, "hog", 3)
    assert proc.events("result_committed") == []
    # Ended by its class's max_attempts, not by SQS's receive count (the DLQ).
    attrs = sqs_client.get_queue_attributes(
        QueueUrl=dlq_url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert view.late_handbacks == LATE_HANDBACK_LIMIT
    assert view.reason is not None and "attempts exhausted (1 of 1)" in view.reason
