"""The operator's record: request ids and readable times in the journal."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import AwsTestEnv
from core_harness import QUEUE, TABLE, WORKER, Script, local_lease, ok

from sqs_lease import Settings, create_tables
from sqs_lease._aws import classify
from sqs_lease._core.calls import Err, ErrorKind
from sqs_lease._core.heartbeats import heartbeat_flow
from sqs_lease._journal import LOGGER_NAME, Journal
from sqs_lease._schema.job_requests import JobTable


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


def _journal() -> tuple[Journal, _Lines]:
    logger = logging.getLogger(LOGGER_NAME + ".test-record")
    lines = _Lines()
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return Journal(logger=logger), lines


def test_a_body_field_the_journal_drops_is_named_and_the_request_id_is_kept() -> None:
    journal, lines = _journal()
    journal.write("tool_request_started", {"job_id": "j", "request": "GET /x", "request_id": "r-9"})
    (line,) = lines.lines
    assert "request" not in line  # a body: never journaled
    assert line["dropped"] == ["request"]  # ...but never silently
    assert line["request_id"] == "r-9"


def test_a_wall_clock_time_in_an_event_gets_a_readable_utc_twin() -> None:
    journal, lines = _journal()
    journal.write("ownership_unknown", {"last_confirmed_at": 1_800_000_000.25})
    assert lines.lines[0]["last_confirmed_at_utc"] == "2027-01-15T08:00:00.250+00:00"


def test_ownership_unknown_at_a_heartbeat_names_token_last_confirmed_wall_time_and_request() -> (
    None
):
    lease = local_lease("job-1", token=4, deadline=1060.0, jitter_seconds=5.0)
    lease.last_confirmed = 1000.0
    lost_answer = Err(ErrorKind.SERVER, "InternalServerError", request_id="RID-77", sent_at=1050.0)
    s = Script([ok({"Successful": [{"Id": "0"}]}, sent_at=1050.0), lost_answer])
    s.run(
        heartbeat_flow(
            JobTable(TABLE), queue_url=QUEUE, leases=[lease], worker_id=WORKER, wall_now=5050.0
        )
    )
    ev = s.event("ownership_unknown")
    assert ev["token"] == 4
    assert ev["last_confirmed"] == 1000.0  # the lease clock
    assert ev["last_confirmed_at"] == 5000.0  # the same moment on the wall clock
    assert ev["request_id"] == "RID-77"


@pytest.mark.integration
def test_a_refused_dynamodb_call_carries_the_services_request_id(aws: AwsTestEnv) -> None:
    import boto3

    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    ddb = boto3.client("dynamodb", endpoint_url=aws.endpoint_url, region_name="us-east-1")
    with pytest.raises(ClientError) as caught:
        ddb.update_item(**JobTable(settings.jobs_table).cancel("nope", "x", 1.0).params)
    err = classify(caught.value, 0.0, 0.0)
    assert err.kind is ErrorKind.CONDITION_FAILED
    assert (
        err.request_id and err.request_id == caught.value.response["ResponseMetadata"]["RequestId"]
    )


@pytest.mark.integration
def test_a_rejected_result_is_reachable_from_jobs_show(aws: AwsTestEnv) -> None:
    import boto3
    from core_harness import delivery, job_view
    from test_cli import run as run_cli

    from sqs_lease._aws import SyncDriver
    from sqs_lease._core.endwrites import EndRequest, commit_flow

    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    ddb = boto3.client("dynamodb", endpoint_url=aws.endpoint_url, region_name="us-east-1")
    jt = JobTable(settings.jobs_table)
    jid = f"{aws.prefix}-rej"
    put = jt.put_new(
        job_id=jid, job_class="ocr", payload_json="{}", payload_hash="h", wall_now=1.0, send_id="s"
    )
    ddb.put_item(**put.params)
    ddb.update_item(  # another attempt holds the job now: token 3
        TableName=settings.jobs_table,
        Key={"job_id": {"S": jid}},
        UpdateExpression="SET #s = :s, #t = :t",
        ExpressionAttributeNames={"#s": "state", "#t": "token"},
        ExpressionAttributeValues={":s": {"S": "running"}, ":t": {"N": "3"}},
    )
    late = '{"text":"late"}'
    fin = SyncDriver(settings).run(
        commit_flow(
            jt,
            EndRequest(
                queue_url="http://unused",
                job=job_view(jid, token=2),
                delivery=delivery(jid),
                worker_id="w-late",
                wall_now=2.0,
                nonce="n-1",
            ),
            result_json=late,
            duration=1.0,
            keep_rejected_content=True,
        )
    )
    assert fin.outcome == "rejected"
    out = run_cli(aws, "jobs", "show", jid)
    assert out.exit_code == 0, out.output
    assert "state: running" in out.output and "token: 3" in out.output  # untouched
    assert "rejected_token: 2" in out.output and "rejected_by: w-late" in out.output
    assert f"rejected_size: {len(late)}" in out.output
    assert "rejected_hash: " in out.output and late in out.output
