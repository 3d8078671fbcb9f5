"""Jobs whose message SQS itself moved to the DLQ are parked, not left ``queued`` or
``running`` forever: on a real moto server over HTTP, with a queue whose redrive
policy moves a message after one receive (issue 7, "nothing lost")."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from click.testing import CliRunner, Result
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import HANG_GUARD, collect_journal, read_view, running, wait_until

from sqs_lease import App, AsyncWorker, Producer, Settings, Worker
from sqs_lease._aws import SyncDriver
from sqs_lease._core.claiming import Claimed, claim_flow
from sqs_lease._core.messages import Delivery, receive_flow
from sqs_lease._core.records import DEAD_LETTERED_CODE, JobState
from sqs_lease._journal import LOGGER_NAME, Journal
from sqs_lease._resources import create_queue, create_tables
from sqs_lease._schema.job_requests import JobTable
from sqs_lease.cli import cli

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

pytestmark = pytest.mark.integration

HANG = HANG_GUARD  # hang guard only


class Doc(BaseModel):
    doc: str


class Env:
    """Tables, a job queue that moves a message to its DLQ once it was received once
    (``maxReceiveCount`` 1), and clients."""

    def __init__(self, aws: AwsTestEnv) -> None:
        self.settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
        create_tables(self.settings)
        self.url, self.dlq = create_queue(self.settings, visibility=30, max_receives=1)
        self.sqs: SQSClient = boto3.client(
            "sqs", endpoint_url=aws.endpoint_url, region_name="us-east-1"
        )
        self.ddb: DynamoDBClient = boto3.client(
            "dynamodb", endpoint_url=aws.endpoint_url, region_name="us-east-1"
        )

    def submit(self, job_id: str) -> str:
        sent = Producer(self.settings).submit("ocr", {"doc": job_id}, job_id)
        assert sent.send_id is not None
        return sent.send_id

    def receive_without_claiming(self) -> list[Any]:
        """A worker that received the message and died before it claimed: nothing is
        deleted, the message comes back at once (visibility 0)."""
        return self.sqs.receive_message(
            QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=0
        ).get("Messages", [])

    def claim_and_crash(self, job_id: str) -> Claimed:
        """A worker that claimed the job and died: the record says ``running``."""
        driver = SyncDriver(self.settings)
        (d,) = driver.run(
            receive_flow(queue_url=self.url, max_messages=1, wait_seconds=1, visibility=0)
        )
        assert isinstance(d, Delivery) and d.job_id == job_id
        claimed = driver.run(
            claim_flow(
                JobTable(self.settings.jobs_table),
                queue_url=self.url,
                delivery=d,
                worker_id="crashed-worker",
                wall_now=time.time(),
                lease_seconds=30,
                max_attempts=5,
                dlq_url=self.dlq,
                nonce="n-1",
            )
        )
        assert isinstance(claimed, Claimed)
        # The worker dies: its lease lapses and the message is visible again.
        self.sqs.change_message_visibility(
            QueueUrl=self.url, ReceiptHandle=d.receipt_handle, VisibilityTimeout=0
        )
        return claimed

    def let_sqs_move_it(self) -> None:
        """The next receive finds the message past its maxReceiveCount: SQS moves it to
        the DLQ instead of delivering it."""
        deadline = time.monotonic() + HANG
        while self.depth(self.dlq) == 0:
            assert time.monotonic() < deadline, "SQS never moved the message to the DLQ"
            assert self.receive_without_claiming() == [], "delivered past maxReceiveCount"
        assert self.depth(self.url) == 0

    def depth(self, url: str) -> int:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]) + int(
            attrs["ApproximateNumberOfMessagesNotVisible"]
        )

    def cli(self, *args: str) -> Result:
        """``sqs-lease ARGS``; the CLI binds the journal to its stderr: give it back."""
        journal = logging.getLogger(LOGGER_NAME)
        saved = (list(journal.handlers), journal.level, journal.propagate)
        assert self.settings.endpoint_url is not None
        try:
            return CliRunner().invoke(
                cli,
                [
                    "--endpoint-url",
                    self.settings.endpoint_url,
                    "--prefix",
                    self.settings.prefix,
                    *args,
                ],
            )
        finally:
            journal.handlers[:] = saved[0]
            journal.setLevel(saved[1])
            journal.propagate = saved[2]

    def reconcile(self, *args: str) -> dict[str, dict[str, Any]]:
        """``dlq list --reconcile --json``: one object per message, by job id."""
        out = self.cli("dlq", "list", "--reconcile", "--json", *args)
        assert out.exit_code == 0, (out.output, out.exception)
        rows = [json.loads(line) for line in out.stdout.splitlines()]
        return {str(r["job_id"]): r for r in rows}


@pytest.fixture
def env(aws: AwsTestEnv) -> Env:
    return Env(aws)


def _app() -> App:
    app = App()
    app.job("ocr", payload=Doc)(lambda ctx, p: {"doc": p.doc})
    return app


def test_reconcile_parks_a_queued_job_whose_message_sqs_moved_to_the_dlq(env: Env) -> None:
    send_id = env.submit("lost")
    assert len(env.receive_without_claiming()) == 1
    env.let_sqs_move_it()
    # Before: nothing will ever run it, yet the record says queued.
    assert read_view(env.ddb, env.settings, "lost").state is JobState.QUEUED

    rows = env.reconcile()

    row = rows["lost"]
    assert (row["verdict"], row["job_state"], row["send_id"]) == ("parked", "parked", send_id)
    view = read_view(env.ddb, env.settings, "lost")
    assert view.state is JobState.PARKED and view.error_code == DEAD_LETTERED_CODE
    assert view.token == 1  # moved on: any owner of the old message is fenced out
    assert view.reason is not None
    assert f"{env.settings.dlq}" in view.reason and "receives" in view.reason
    assert "sqs-lease jobs resume lost" in view.reason
    # The message stays in the DLQ (evidence), visible again for the next look.
    assert env.depth(env.dlq) == 1
    listed = env.cli("dlq", "list", "--json")
    assert [json.loads(line)["job_id"] for line in listed.stdout.splitlines()] == ["lost"]
    # A second reconcile changes nothing.
    assert env.reconcile()["lost"]["verdict"] == "already_parked"


def test_a_job_resumed_after_its_dlq_message_is_not_parked_again_and_runs(env: Env) -> None:
    env.submit("back")
    env.receive_without_claiming()
    env.let_sqs_move_it()
    assert env.reconcile()["back"]["verdict"] == "parked"
    resumed = env.cli("jobs", "resume", "back")
    assert resumed.exit_code == 0, resumed.output
    fresh = read_view(env.ddb, env.settings, "back")
    assert fresh.state is JobState.QUEUED and fresh.send_id is not None

    # The old message is still in the DLQ; the record now names a new send.
    row = env.reconcile()["back"]
    assert (row["verdict"], row["job_state"]) == ("superseded", "queued")
    assert read_view(env.ddb, env.settings, "back").state is JobState.QUEUED
    # And the re-sent job runs to its end.
    worker = Worker(_app(), env.settings, receive_wait=1, journal=Journal(worker_id="w"))
    worker.run(max_messages=1, idle_exit=5)
    assert read_view(env.ddb, env.settings, "back").state is JobState.SUCCEEDED


def test_a_finished_jobs_dlq_message_is_reported_and_deleted_on_request(env: Env) -> None:
    env.submit("done")
    env.receive_without_claiming()
    env.let_sqs_move_it()
    cancelled = env.cli("jobs", "cancel", "done", "--reason", "no longer wanted")
    assert cancelled.exit_code == 0, cancelled.output

    dry = env.cli("dlq", "list", "--reconcile")
    assert dry.exit_code == 0, dry.output
    assert "job finished" in dry.stdout and "--delete-finished" in dry.stdout
    assert env.depth(env.dlq) == 1  # reported, kept

    row = env.reconcile("--delete-finished")["done"]
    assert (row["verdict"], row["job_state"]) == ("deleted", "cancelled")
    assert env.depth(env.dlq) == 0
    view = read_view(env.ddb, env.settings, "done")
    assert view.state is JobState.CANCELLED and view.error_code == "cancelled"  # untouched


def test_a_dry_run_reconcile_changes_nothing(env: Env) -> None:
    env.submit("maybe")
    env.receive_without_claiming()
    env.let_sqs_move_it()
    assert env.reconcile("--dry-run")["maybe"]["verdict"] == "would_park"
    assert read_view(env.ddb, env.settings, "maybe").state is JobState.QUEUED
    refused = env.cli("dlq", "list", "--dry-run")
    assert refused.exit_code == 2 and "--reconcile" in refused.output


def test_the_worker_sweep_parks_a_crashed_workers_running_job_left_in_the_dlq(
    env: Env,
) -> None:
    # Regression (issue 7): a message SQS moved to the DLQ left its record running
    # (or queued) forever; nothing parked it and nobody could see why.
    env.submit("crashed")
    claimed = env.claim_and_crash("crashed")
    assert read_view(env.ddb, env.settings, "crashed").state is JobState.RUNNING
    env.let_sqs_move_it()

    worker = Worker(_app(), env.settings, receive_wait=1, journal=Journal(worker_id="sweeper"))
    with collect_journal() as journal:
        worker.sweep_once()

    view = read_view(env.ddb, env.settings, "crashed")
    assert view.state is JobState.PARKED, view
    assert view.error_code == DEAD_LETTERED_CODE and view.token == claimed.token + 1
    (event,) = journal.events("job_dead_lettered")
    assert (event["job_id"], event["previous_state"], event["previous_owner"]) == (
        "crashed",
        "running",
        "crashed-worker",
    )
    assert event["by"] == "sweep" and event["dlq"] == env.settings.dlq
    assert env.depth(env.dlq) == 1  # the message is given back to the DLQ


def test_the_worker_sweep_leaves_a_job_resent_since_alone(env: Env) -> None:
    env.submit("again")
    env.receive_without_claiming()
    env.let_sqs_move_it()
    # Someone re-sent the job (a new send id) before anything parked it.
    env.ddb.update_item(
        TableName=env.settings.jobs_table,
        Key={"job_id": {"S": "again"}},
        UpdateExpression="SET send_id = :s",
        ExpressionAttributeValues={":s": {"S": "a-newer-send"}},
    )
    worker = Worker(_app(), env.settings, receive_wait=1, journal=Journal(worker_id="sweeper"))
    with collect_journal() as journal:
        worker.sweep_once()
    assert read_view(env.ddb, env.settings, "again").state is JobState.QUEUED
    assert journal.events("job_dead_lettered") == []


def test_the_async_workers_sweep_parks_a_job_left_in_the_dlq_too(env: Env) -> None:
    env.submit("async-lost")
    env.receive_without_claiming()
    env.let_sqs_move_it()
    worker = AsyncWorker(
        _app(),
        env.settings,
        receive_wait=1,
        sweep_interval=0.2,
        journal=Journal(worker_id="async-sweeper"),
    )
    with running(worker):
        wait_until(
            lambda: read_view(env.ddb, env.settings, "async-lost").state is JobState.PARKED,
            HANG,
            "the async worker's sweep to park the job",
        )
    assert read_view(env.ddb, env.settings, "async-lost").error_code == DEAD_LETTERED_CODE
