"""A Lambda-only deployment sweeps (issue 33, item 1): on a real moto server, the
scheduled function (``sqs_lease.aws_lambda.sweep_entry``, as the CDK deploys it)
sends a stranded job's message, which the consumer (``entry``) then runs, and parks
a job whose message SQS moved to the DLQ. Without it a Lambda consumer, which runs
only when a message arrives, never sees either job."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from test_aws_lambda import BUDGET, RunningDown, Work, event_of
from worker_helpers import HANG_GUARD, collect_journal, prepare, read_record, read_view, result_of

from sqs_lease import App, ConfigError, JobContext, Producer, Settings, aws_lambda
from sqs_lease._core.records import DEAD_LETTERED_CODE, JobState
from sqs_lease._resources import create_queue, create_tables
from sqs_lease._schema.job_requests import JobTable
from sqs_lease.aws_lambda import sweeper

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

pytestmark = pytest.mark.integration

SCHEDULED: dict[str, Any] = {
    "version": "0",
    "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
    "detail-type": "Scheduled Event",
    "source": "aws.events",
    "account": "123456789012",
    "time": "2025-01-01T00:00:00Z",
    "region": "us-east-1",
    "resources": ["arn:aws:events:us-east-1:123456789012:rule/sweep"],
    "detail": {},
}
"""The event an EventBridge schedule sends the sweep function."""

APP = App()


@APP.job("work", payload=Work, **BUDGET)
def _work(ctx: JobContext[Work], p: Work) -> Any:
    return {"double": 2 * p.n}


def _depth(sqs: SQSClient, url: str) -> int:
    attrs = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return sum(int(v) for v in attrs.values())


def _strand(ddb: DynamoDBClient, settings: Settings, job_id: str, *, age: float) -> None:
    """A record as a producer leaves it when it dies between its write and its send."""
    put = JobTable(settings.jobs_table).put_new(
        job_id=job_id,
        job_class="work",
        payload_json='{"n":21}',
        payload_hash="h" * 64,
        wall_now=time.time() - age,
        send_id="died-before-sending",
    )
    ddb.put_item(**put.params)


def _function_env(monkeypatch: pytest.MonkeyPatch, endpoint: str, settings: Settings) -> None:
    """The environment the CDK's LambdaConsumer gives both functions."""
    monkeypatch.setattr(aws_lambda, "_from_env", [])
    monkeypatch.setattr(aws_lambda, "_sweep_from_env", [], raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("SQS_LEASE_PREFIX", settings.prefix)
    monkeypatch.setenv("SQS_LEASE_QUEUE", settings.queue)
    monkeypatch.setenv("SQS_LEASE_APP", f"{__name__}:APP")


def test_a_stranded_job_is_sent_by_the_scheduled_sweep_and_run_by_the_lambda_consumer(
    aws: AwsTestEnv,
    sqs_client: SQSClient,
    ddb_client: DynamoDBClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Regression (issue 33 item 1): the Lambda shell ran no sweep, so a job whose
    # message was never sent waited queued forever in a Lambda-only deployment.
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    _function_env(monkeypatch, aws.endpoint_url, settings)
    _strand(ddb_client, settings, "stranded", age=120)
    _strand(ddb_client, settings, "young", age=0)  # inside the grace: its sender may be sending
    assert _depth(sqs_client, url) == 0  # nothing would ever invoke the consumer

    with collect_journal() as journal:
        done = aws_lambda.sweep_entry(SCHEDULED, RunningDown(60))
    assert (done["resent"], done["found"], done["more"], done["failed"]) == (1, 1, False, [])
    assert done["pages"] == 1
    (ran,) = journal.events("lambda_sweep_done")
    assert ran["resent"] == 1
    assert read_view(ddb_client, settings, "young").message_sent is False

    answer = aws_lambda.entry(event_of(sqs_client, url, 1), RunningDown(60))
    assert answer == {"batchItemFailures": []}
    rec = read_record(ddb_client, settings, "stranded")
    assert rec.state == "succeeded"
    assert result_of(rec) == {"double": 42}
    assert _depth(sqs_client, url) == 0

    # The next scheduled run finds nothing left to do.
    again = aws_lambda.sweep_entry(SCHEDULED, RunningDown(60))
    assert (again["resent"], again["more"]) == (0, False)


def test_a_job_whose_message_sqs_moved_to_the_dlq_is_parked_by_the_scheduled_sweep(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    # Regression (issue 33 item 1): a Lambda-only deployment never reconciled its
    # DLQ, so a job whose message SQS moved there stayed queued with nothing to run it.
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    url, dlq = create_queue(settings, visibility=30, max_receives=1)
    Producer(settings, APP).submit("work", Work(n=1), job_id="dead")
    deadline = time.monotonic() + HANG_GUARD
    while _depth(sqs_client, dlq) == 0:  # received, never claimed: SQS moves it
        assert time.monotonic() < deadline, "SQS never moved the message to the DLQ"
        sqs_client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=0
        )
    assert read_view(ddb_client, settings, "dead").state is JobState.QUEUED

    with collect_journal() as journal:
        done = sweeper(APP, settings)(SCHEDULED, RunningDown(60))
    assert (done["dlq_parked"], done["dlq_looked"], done["dlq_more"]) == (1, 1, False)
    view = read_view(ddb_client, settings, "dead")
    assert view.state is JobState.PARKED and view.error_code == DEAD_LETTERED_CODE
    (event,) = journal.events("job_dead_lettered")
    assert event["by"] == "sweep"
    assert _depth(sqs_client, dlq) == 1  # given back for the operator


def test_the_sweep_refuses_an_sqs_event_rather_than_report_its_records_done(
    aws: AwsTestEnv, sqs_client: SQSClient
) -> None:
    # Wired to the event source by mistake, a sweep returning no batchItemFailures
    # would have the mapping delete every record unrun.
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    Producer(settings, APP).submit("work", Work(n=3), job_id="kept")
    event = event_of(sqs_client, url, 1)
    with pytest.raises(ConfigError, match="event source"):
        sweeper(APP, settings)(event, RunningDown(60))
    assert _depth(sqs_client, url) == 1


def test_the_sweep_entry_needs_the_app_named_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aws_lambda, "_sweep_from_env", [], raising=False)
    monkeypatch.delenv("SQS_LEASE_APP", raising=False)
    with pytest.raises(ConfigError, match="SQS_LEASE_APP"):
        aws_lambda.sweep_entry(SCHEDULED, RunningDown(60))
