"""The Lambda adapter, on a real moto server: event records built from messages
really received (real receipt handles, the event's own key spelling)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import (
    FAST,
    collect_journal,
    drain,
    prepare,
    queue_depth,
    read_record,
    read_view,
    result_of,
)

from sqs_lease import (
    App,
    ConfigError,
    JobClassError,
    JobContext,
    NextStage,
    Producer,
    Settings,
    aws_lambda,
)
from sqs_lease._core.eventsource import END_MARGIN_SECONDS, GroupStop, can_start, message_group
from sqs_lease._core.invocation import BatchEnds, FunctionTimeout, RecordEnd
from sqs_lease._core.records import JobState
from sqs_lease._core.slots import waits_of
from sqs_lease.aws_lambda import LambdaHandler, handler
from sqs_lease.testing import make_env

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

BUDGET: dict[str, Any] = {**FAST, "stage_budget_seconds": 6.0, "effect_timeout_seconds": 1.0}
"""A stage budget a Lambda can hold: a record needs 6 s + the end margin to start."""


class Work(BaseModel):
    n: int


class RunningDown:
    """A Lambda context whose remaining time runs down with the wall clock, and by
    what a handler says it spent (so a test needs no real long handler)."""

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds
        self._lock = threading.Lock()

    def spend(self, seconds: float) -> None:
        with self._lock:
            self._end -= seconds

    def get_remaining_time_in_millis(self) -> int:
        with self._lock:
            return max(0, int((self._end - time.monotonic()) * 1000))


class Standing:
    """A Lambda context whose remaining time stands still (for what reads it once)."""

    def __init__(self, seconds: float) -> None:
        self._millis = int(seconds * 1000)

    def get_remaining_time_in_millis(self) -> int:
        return self._millis


def event_of(sqs: SQSClient, url: str, want: int, group: str | None = None) -> dict[str, Any]:
    """An SQS event as the event source mapping builds it, from ``want`` messages
    received from moto (hidden 60 s, as the mapping's receive would)."""
    got = drain(sqs, url, timeout=20, want=want)
    assert len(got) == want, f"received {len(got)} of {want} messages"
    arn = f"arn:aws:sqs:us-east-1:123456789012:{url.rsplit('/', 1)[-1]}"
    records = []
    for m in got:
        attributes = dict(m.get("Attributes", {}))
        if group is not None:
            attributes["MessageGroupId"] = group
        records.append(
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": attributes,
                "messageAttributes": {},
                "md5OfBody": m["MD5OfBody"],
                "eventSource": "aws:sqs",
                "eventSourceARN": arn,
                "awsRegion": "us-east-1",
            }
        )
    return {"Records": records}


@dataclass
class Batch:
    """One test's queue and tables, ``n`` jobs of class ``work`` submitted, the
    event built from their received messages, and the adapter for the app."""

    settings: Settings
    url: str
    job_ids: list[str]
    event: dict[str, Any]
    run: LambdaHandler


def batch(
    aws: AwsTestEnv,
    sqs: SQSClient,
    work: Callable[[Work], Any],
    n: int,
    *,
    group: str | None = None,
) -> Batch:
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("work", payload=Work, **BUDGET)
    def _work(ctx: JobContext[Work], p: Work) -> Any:
        return work(p)

    producer = Producer(settings, app)
    ids = [producer.submit("work", Work(n=i), job_id=f"{aws.prefix}-{i}").job_id for i in range(n)]
    event = event_of(sqs, url, n, group) if n else {"Records": []}
    return Batch(settings, url, ids, event, handler(app, settings))


def job_of(record: dict[str, Any]) -> str:
    return str(json.loads(record["body"])["job_id"])


def failed_ids(answer: dict[str, Any]) -> list[str]:
    return [f["itemIdentifier"] for f in answer["batchItemFailures"]]


def visible_now(sqs: SQSClient, url: str) -> set[str]:
    """Message ids visible at once (a short receive that hides them again)."""
    seen: set[str] = set()
    for _ in range(3):
        out = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=60
        )
        seen.update(m["MessageId"] for m in out.get("Messages", []))
    return seen


def test_a_batch_that_succeeds_reports_no_failures_and_commits_every_job(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    b = batch(aws, sqs_client, lambda p: {"double": 2 * p.n}, 3)
    assert b.run(b.event, RunningDown(60)) == {"batchItemFailures": []}
    for job_id in b.job_ids:
        assert read_view(ddb_client, b.settings, job_id).state is JobState.SUCCEEDED
    assert queue_depth(sqs_client, b.url) == 0


def test_a_handler_failure_is_reported_and_the_rest_of_the_batch_commits(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    def work(p: Work) -> dict[str, int]:
        if p.n == 1:
            raise RuntimeError("tool down")
        return {"n": p.n}

    b = batch(aws, sqs_client, work, 3)
    answer = b.run(b.event, RunningDown(60))
    bad = [r["messageId"] for r in b.event["Records"] if job_of(r) == b.job_ids[1]]
    assert failed_ids(answer) == bad
    # Given back for a counted retry, its message kept (hidden for the backoff).
    assert read_view(ddb_client, b.settings, b.job_ids[1]).state is JobState.QUEUED
    for job_id in (b.job_ids[0], b.job_ids[2]):
        assert read_view(ddb_client, b.settings, job_id).state is JobState.SUCCEEDED
    assert queue_depth(sqs_client, b.url) == 1


def test_records_that_cannot_finish_in_the_time_left_are_released_and_reported(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    # Time enough for one record however slow the machine is; the first record then
    # uses all but a second of it, which no other record can start in.
    context = RunningDown(600.0)

    def work(p: Work) -> dict[str, int]:
        context.spend(context.get_remaining_time_in_millis() / 1000 - 1.0)
        return {"n": p.n}

    b = batch(aws, sqs_client, work, 3)
    first, *rest = b.event["Records"]
    answer = b.run(b.event, context)
    assert failed_ids(answer) == [r["messageId"] for r in rest]
    assert read_view(ddb_client, b.settings, job_of(first)).state is JobState.SUCCEEDED
    for r in rest:
        view = read_view(ddb_client, b.settings, job_of(r))
        assert view.state is JobState.QUEUED and view.attempt == 0  # never claimed
    # Each waits as a fresh message (a second or two), not hidden for the rest of the
    # 60 s receive, and not as its received message, which SQS would count again.
    back = drain(sqs_client, b.url, timeout=20, want=len(rest))
    assert sorted(json.loads(m["Body"])["job_id"] for m in back) == sorted(job_of(r) for r in rest)
    assert not {m["MessageId"] for m in back} & {r["messageId"] for r in rest}


def test_a_record_skipped_more_often_than_the_redrive_bound_is_never_dead_lettered(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    # Soak seed 117: a record behind long ones in a user's batch is not started for
    # the time left at every receive; each receive counted, SQS dead-lettered a job
    # that never ran. A redrive bound of one receive: the second receive of the same
    # message would go to the DLQ.
    env = make_env(aws.endpoint_url, aws.prefix, max_receives=1)
    app = App()
    app.job("work", payload=Work, **BUDGET)(lambda ctx, p: {"n": p.n})
    job_id = Producer(env.settings, app).submit("work", Work(n=1), job_id=f"{aws.prefix}-0").job_id
    run = handler(app, env.settings)
    run({"Records": []}, RunningDown(60))  # the first invocation: a 60 s function
    with collect_journal() as journal:
        for _ in range(2):  # more receives than the bound
            answer = run(event_of(sqs_client, env.queue_url, 1), RunningDown(5.0))
            assert len(failed_ids(answer)) == 1  # not started: 6 s + the margin do not fit
    assert len(journal.events("lambda_record_waits", job_id=job_id)) == 2
    assert queue_depth(sqs_client, env.dlq_url) == 0
    view = read_view(ddb_client, env.settings, job_id)
    assert view.state is JobState.QUEUED and view.attempt == 0
    assert waits_of(view.send_id) == 2  # its second fresh message is the current one


def test_a_record_taken_over_meanwhile_has_its_commit_rejected_and_is_reported(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    jobs_table = Settings(prefix=aws.prefix).jobs_table
    job_id = f"{aws.prefix}-0"

    def work(p: Work) -> dict[str, int]:
        # Another consumer claims the job meanwhile: the token moves on past ours.
        ddb_client.update_item(
            TableName=jobs_table,
            Key={"job_id": {"S": job_id}},
            UpdateExpression="SET #t = #t + :one, #o = :other",
            ExpressionAttributeNames={"#t": "token", "#o": "owner"},
            ExpressionAttributeValues={":one": {"N": "1"}, ":other": {"S": "someone-else"}},
        )
        return {"n": p.n}

    b = batch(aws, sqs_client, work, 1)
    with collect_journal() as journal:
        answer = b.run(b.event, RunningDown(60))
    assert failed_ids(answer) == [b.event["Records"][0]["messageId"]]
    view = read_view(ddb_client, b.settings, job_id)
    assert view.state is JobState.RUNNING and view.owner == "someone-else"
    assert journal.events("result_rejected", job_id=job_id)
    assert queue_depth(sqs_client, b.url) == 1  # not deleted: the new owner's message


def test_a_fifo_group_stops_at_its_first_failure_and_reports_the_rest_of_it(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    ran: list[int] = []

    def work(p: Work) -> dict[str, int]:
        ran.append(p.n)
        if len(ran) == 1:
            raise RuntimeError("first of the group fails")
        return {"n": p.n}

    b = batch(aws, sqs_client, work, 3, group="session-1")
    answer = b.run(b.event, RunningDown(60))
    assert len(ran) == 1
    assert failed_ids(answer) == [r["messageId"] for r in b.event["Records"]]
    for r in b.event["Records"][1:]:
        assert read_view(ddb_client, b.settings, job_of(r)).attempt == 0  # never started


def test_the_cold_start_warns_once_when_the_queue_visibility_is_under_six_timeouts(
    aws: AwsTestEnv, sqs_client: SQSClient
) -> None:
    b = batch(aws, sqs_client, lambda p: {"n": p.n}, 0)  # the queue's visibility: 30 s
    with collect_journal() as journal:
        # A clock that stands still: on a busy machine a second passes before the read.
        b.run({"Records": []}, Standing(60))
        b.run({"Records": []}, Standing(60))
    warned = journal.events("lambda_visibility_too_short")
    assert len(warned) == 1
    assert warned[0]["visibility"] == 30 and warned[0]["floor"] == 360


def test_the_visibility_warning_reads_the_timeout_as_known_not_the_first_reading(
    aws: AwsTestEnv, sqs_client: SQSClient
) -> None:
    # An environment frozen before its first read sees 10 s of a 60 s function: the
    # queue's 100 s passes 6 x 10 s. The next invocation reads the whole 60 s, and
    # 100 s is short of 6 x 60 s: the warning must not rest on the first reading
    # (``FunctionTimeout``: the largest reading stands, docs/operations.md).
    b = batch(aws, sqs_client, lambda p: {"n": p.n}, 0)
    sqs_client.set_queue_attributes(QueueUrl=b.url, Attributes={"VisibilityTimeout": "100"})
    with collect_journal() as journal:
        b.run({"Records": []}, Standing(10))
        b.run({"Records": []}, Standing(60))
        b.run({"Records": []}, Standing(60))
    warned = journal.events("lambda_visibility_too_short")
    assert len(warned) == 1
    assert warned[0]["function_timeout"] == 60 and warned[0]["floor"] == 360


def test_an_app_whose_class_can_never_fit_a_lambda_is_refused_at_its_first_invocation(
    aws: AwsTestEnv,
) -> None:
    settings, _url, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    app.job("slow", payload=Work, **FAST)(lambda ctx, p: None)  # the default budget: 3600 s
    run = handler(app, settings)
    with pytest.raises(ConfigError, match=r"job classes slow: stage_budget_seconds"):
        run({"Records": []}, RunningDown(900))


def test_a_stage_whose_own_budget_can_never_fit_a_lambda_is_refused_by_name(
    aws: AwsTestEnv,
) -> None:
    # Issue 26 defect 10: the stages of one job share its name, and the budgets were
    # kept by name: the last stage's (it fits) hid the middle one's (it never does).
    settings, _url, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    report = app.staged("report", payload=Work, **FAST | {"stage_budget_seconds": 600})
    report.stage("fetch")(lambda ctx, p: NextStage("render", p))
    report.stage("render", payload=Work, stage_budget_seconds=3600)(
        lambda ctx, p: NextStage("publish", p)
    )
    report.stage("publish", payload=Work)(lambda ctx, p: {})
    run = handler(app, settings)
    with pytest.raises(ConfigError, match=r"job classes report/render: stage_budget_seconds"):
        run({"Records": []}, RunningDown(900))  # the longest function: fetch's 600 s fit


def test_a_record_not_started_for_the_budget_says_why(
    aws: AwsTestEnv, sqs_client: SQSClient
) -> None:
    b = batch(aws, sqs_client, lambda p: {"n": p.n}, 1)
    with collect_journal() as journal:
        b.run({"Records": []}, RunningDown(60))  # the first invocation: a 60 s function
        answer = b.run(b.event, RunningDown(5.0))  # less than 6 s + the margin left
    assert failed_ids(answer) == [r["messageId"] for r in b.event["Records"]]
    (why,) = journal.events("lambda_record_not_started")
    assert (why["reason"], why["stage_budget"]) == ("stage_budget_does_not_fit", 6.0)
    assert journal.events("lambda_budget_never_fits") == []


def test_a_function_whose_timeout_no_class_budget_fits_refuses_every_invocation_by_name(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    # Issue 27: the function's own timeout (its first invocation's time left), not
    # Lambda's longest, decides; released unstarted each time, the records went to
    # the DLQ with their jobs still queued, and nothing failed loudly.
    b = batch(aws, sqs_client, lambda p: {"n": p.n}, 1)
    with collect_journal() as journal:
        for _ in range(2):
            with pytest.raises(JobClassError) as refused:
                # A 5 s function; the class needs 6 s + 3 s. Standing: on a busy machine
                # the cold start's table checks may take a second before the read.
                b.run(b.event, Standing(5.0))
    assert "work: stage_budget_seconds 6 s (lease " in str(refused.value)
    assert "function timeout is 5 s" in str(refused.value)
    (never,) = journal.events("lambda_budget_never_fits")  # once, at the first invocation
    assert never["job_classes"] == ["work"] and never["function_timeout"] == 5
    assert not journal.events("lambda_record_not_started")  # refused, not looped
    for r in b.event["Records"]:
        assert read_view(ddb_client, b.settings, job_of(r)).attempt == 0  # never started


def test_a_late_first_reading_of_the_time_left_refuses_only_until_a_full_one(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    # Soak seed 1309403: an environment frozen before its first invocation's handler
    # read the time left saw 41 s of a 60 s function; kept as the function's timeout,
    # it refused every later invocation, however much they had, and its records went
    # to the DLQ unstarted. The largest reading stands (``FunctionTimeout``).
    b = batch(aws, sqs_client, lambda p: {"n": p.n}, 1)
    with collect_journal() as journal:
        with pytest.raises(JobClassError):
            b.run(b.event, Standing(5.0))  # read late: 5 s of the function's 60 s
        answer = b.run(b.event, Standing(60.0))  # the next one reads the whole timeout
    assert failed_ids(answer) == []
    (never,) = journal.events("lambda_budget_never_fits")
    assert never["function_timeout"] == 5
    for r in b.event["Records"]:
        assert read_view(ddb_client, b.settings, job_of(r)).state is JobState.SUCCEEDED


def test_a_record_whose_flow_raised_is_reported_and_stops_its_fifo_group() -> None:
    # ``LambdaShell.handle``: a record flow that raised (an AWS failure it could not
    # handle) left its message as it was, so its group's later records must wait
    # behind it (AWS: a FIFO batch's later records of a failed one's group are
    # reported failed too); another group, and a record that is no mapping, go on.
    batch = BatchEnds()
    batch.broke({"messageId": "m1", "attributes": {"MessageGroupId": "session-1"}})
    batch.broke("not a record")
    batch.ended(RecordEnd("m2", True))
    batch.ended(RecordEnd("m3", False))
    batch.ended(None)
    assert batch.failures == ["m1", "m3"]
    assert batch.groups.blocked("session-1")
    assert not batch.groups.blocked("session-2")
    assert batch.unstarted == []


def test_the_function_timeout_is_the_largest_time_left_an_invocation_started_with() -> None:
    seen = FunctionTimeout()
    assert [seen.read(ms) for ms in (41_000, 59_990, 12_000, 60_000, -5)] == [41, 60, 60, 60, 60]
    assert FunctionTimeout().read(0) == 0


def test_the_budget_rule_counts_the_whole_stage_budget_and_the_margin() -> None:
    assert can_start(int((6.0 + END_MARGIN_SECONDS) * 1000), 6.0)
    assert not can_start(int((6.0 + END_MARGIN_SECONDS) * 1000) - 1, 6.0)


def test_a_record_names_its_fifo_group_by_attribute_or_by_the_queue_arn() -> None:
    assert message_group({"attributes": {"MessageGroupId": "g"}}) == "g"
    assert message_group({"attributes": {}, "eventSourceARN": "arn:aws:sqs:r:1:q.fifo"}) == ""
    assert message_group({"attributes": {}, "eventSourceARN": "arn:aws:sqs:r:1:q"}) is None
    stop = GroupStop()
    stop.failed("g")
    assert stop.blocked("g") and not stop.blocked("h") and not stop.blocked(None)


def test_a_long_record_is_heartbeated_with_its_receipt_handle_until_it_commits(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    with collect_journal() as journal:

        def work(p: Work) -> dict[str, int]:
            # Outlive the 3 s lease the record was taken with: only the heartbeat
            # (CMV with the record's own receipt handle) keeps it ours meanwhile.
            journal.wait_for("heartbeat_ok", count=2, timeout=30, job_id=f"{aws.prefix}-0")
            return {"n": p.n}

        b = batch(aws, sqs_client, work, 1)
        answer = b.run(b.event, RunningDown(60))
    assert answer == {"batchItemFailures": []}
    assert read_view(ddb_client, b.settings, b.job_ids[0]).state is JobState.SUCCEEDED


def test_a_poison_record_goes_to_the_dlq_and_is_not_reported_as_a_failure(
    aws: AwsTestEnv, sqs_client: SQSClient
) -> None:
    b = batch(aws, sqs_client, lambda p: {"n": p.n}, 0)
    sqs_client.send_message(QueueUrl=b.url, MessageBody="not a job")
    event = event_of(sqs_client, b.url, 1)
    assert b.run(event, RunningDown(60)) == {"batchItemFailures": []}
    assert queue_depth(sqs_client, b.url) == 0
    dlq = sqs_client.get_queue_url(QueueName=b.settings.dlq)["QueueUrl"]
    assert [m["Body"] for m in drain(sqs_client, dlq, timeout=10, want=1)] == ["not a job"]


ENV_APP = App()


@ENV_APP.job("work", payload=Work, **BUDGET)
def _env_work(ctx: JobContext[Work], p: Work) -> Any:
    return {"triple": 3 * p.n}


def test_the_entry_point_loads_the_app_and_settings_from_the_functions_environment(
    aws: AwsTestEnv,
    sqs_client: SQSClient,
    ddb_client: DynamoDBClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the CDK's LambdaConsumer deploys: handler sqs_lease.aws_lambda.entry, the
    # app and the resource names in the environment, no module of the user's own.
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    monkeypatch.setattr(aws_lambda, "_from_env", [])
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws.endpoint_url)
    monkeypatch.setenv("SQS_LEASE_PREFIX", settings.prefix)
    monkeypatch.setenv("SQS_LEASE_QUEUE", settings.queue)
    monkeypatch.delenv("SQS_LEASE_APP", raising=False)
    with pytest.raises(ConfigError, match="SQS_LEASE_APP"):
        aws_lambda.entry({"Records": []}, RunningDown(60))
    monkeypatch.setenv("SQS_LEASE_APP", f"{__name__}:ENV_APP")
    job_id = Producer(settings, ENV_APP).submit("work", Work(n=5), job_id=f"{aws.prefix}-e").job_id
    assert aws_lambda.entry(event_of(sqs_client, url, 1), RunningDown(60)) == {
        "batchItemFailures": []
    }
    rec = read_record(ddb_client, settings, job_id)
    assert rec.state == "succeeded"
    assert result_of(rec) == {"triple": 15}


def test_the_entry_point_writes_emf_metrics_after_each_invocation_when_asked(
    aws: AwsTestEnv,
    sqs_client: SQSClient,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The alarms of the CDK's LeaseMonitoring read these metrics: a Lambda consumer
    # that wrote none would leave them blind.
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    monkeypatch.setattr(aws_lambda, "_from_env", [])
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws.endpoint_url)
    monkeypatch.setenv("SQS_LEASE_PREFIX", settings.prefix)
    monkeypatch.setenv("SQS_LEASE_APP", f"{__name__}:ENV_APP")
    monkeypatch.setenv("SQS_LEASE_METRICS", "true")
    monkeypatch.setenv("SQS_LEASE_METRICS_NAMESPACE", f"SqsLease/{settings.prefix}")
    Producer(settings, ENV_APP).submit("work", Work(n=2), job_id=f"{aws.prefix}-m")
    capsys.readouterr()
    assert aws_lambda.entry(event_of(sqs_client, url, 1), RunningDown(60)) == {
        "batchItemFailures": []
    }
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "_aws" in line]
    (doc,) = docs
    (directive,) = doc["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == f"SqsLease/{settings.prefix}"
    assert directive["Dimensions"] == [["JobClass"]] and doc["JobClass"] == "work"
    assert doc["JobsSucceeded"] == 1 and doc["JobsClaimed"] == 1
