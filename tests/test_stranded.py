"""One message per job, found again when it is missing: against a real moto server.

Concurrent submits send one message; a message that is not the job's current one
(a stray duplicate, or one naming another class) claims nothing; records left
without a message are found through a sparse index and sent again (worker sweep,
``jobs repair``, a repeated ``jobs resume``); an operator's resume or resolution
grants the attempt it starts; a resolution whose job half went missing is
finished by resolving again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from click.testing import CliRunner, Result
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import WorkerRunner, prepare, read_view, running, wait_until

from sqs_lease import App, Producer, Settings, Worker
from sqs_lease._aws import SyncDriver
from sqs_lease._core.calls import Call, Outcome
from sqs_lease._core.claiming import Claimed, NotClaimed, claim_flow
from sqs_lease._core.messages import Delivery, receive_flow
from sqs_lease._core.records import JobState, awaits_send
from sqs_lease._errors import SqsLeaseError, ToolOutcomeUnknown
from sqs_lease._jobs import EffectCall
from sqs_lease._journal import LOGGER_NAME, Journal
from sqs_lease._resources import create_tables
from sqs_lease._schema.create_table import create_table_params
from sqs_lease._schema.job_requests import JobTable
from sqs_lease._schema.models import IntentRecord, JobRecord
from sqs_lease.cli import cli

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

pytestmark = pytest.mark.integration

HANG = 60.0  # hang guard only


class Doc(BaseModel):
    doc: str


@pytest.fixture
def env(aws: AwsTestEnv) -> Iterator[tuple[Settings, str, str]]:
    yield prepare(aws.endpoint_url, aws.prefix)


def _ddb(settings: Settings) -> DynamoDBClient:
    return boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name="us-east-1")


def _sqs(settings: Settings) -> SQSClient:
    return boto3.client("sqs", endpoint_url=settings.endpoint_url, region_name="us-east-1")


def _cli(settings: Settings, *args: str) -> Result:
    """Run ``sqs-lease ARGS``; the CLI binds the journal to its stderr: give it back."""
    journal = logging.getLogger(LOGGER_NAME)
    saved = (list(journal.handlers), journal.level, journal.propagate)
    assert settings.endpoint_url is not None
    try:
        return CliRunner().invoke(
            cli, ["--endpoint-url", settings.endpoint_url, "--prefix", settings.prefix, *args]
        )
    finally:
        journal.handlers[:] = saved[0]
        journal.setLevel(saved[1])
        journal.propagate = saved[2]


def _receive(settings: Settings, url: str, *, visibility: int = 60) -> list[Delivery]:
    driver = SyncDriver(settings, Journal(worker_id="test"))
    got: list[Delivery] = []
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        batch = driver.run(
            receive_flow(queue_url=url, max_messages=10, wait_seconds=1, visibility=visibility)
        )
        got = [d for d in batch if isinstance(d, Delivery)]
    return got


def _claim(settings: Settings, url: str, d: Delivery, worker: str) -> Claimed | NotClaimed:
    driver = SyncDriver(settings, Journal(worker_id=worker))
    return driver.run(
        claim_flow(
            JobTable(settings.jobs_table),
            queue_url=url,
            delivery=d,
            worker_id=worker,
            wall_now=time.time(),
            lease_seconds=60,
            max_attempts=3,
            nonce="n-1",
        )
    )


def _depth(sqs: SQSClient, url: str) -> int:
    attrs = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return sum(int(v) for v in attrs.values())


def _strand(settings: Settings, job_id: str, *, age: float) -> None:
    """A record as a producer leaves it when it dies between its write and its send."""
    put = JobTable(settings.jobs_table).put_new(
        job_id=job_id,
        job_class="ocr",
        payload_json='{"doc":"x"}',
        payload_hash="h" * 64,
        wall_now=time.time() - age,
        send_id="died-before-sending",
    )
    _ddb(settings).put_item(**put.params)


# =========================================================================== the index


def test_tables_create_adds_the_unsent_index_to_a_jobs_table_made_without_it(
    aws: AwsTestEnv,
) -> None:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    ddb = _ddb(settings)
    older = create_table_params(JobRecord, settings.jobs_table)
    older.pop("GlobalSecondaryIndexes")
    older["AttributeDefinitions"] = [{"AttributeName": "job_id", "AttributeType": "S"}]
    ddb.create_table(**older)
    create_tables(settings)
    indexes = ddb.describe_table(TableName=settings.jobs_table)["Table"].get(
        "GlobalSecondaryIndexes", []
    )
    # every index this version queries: ``unsent`` (the sweep), ``group`` (group cancel),
    # ``attention`` (parked and failed jobs) and ``workers`` (the liveness items)
    keys = {i["IndexName"]: [k["AttributeName"] for k in i["KeySchema"]] for i in indexes}
    assert keys == {
        "unsent": ["unsent", "unsent_since"],
        "group": ["group_id", "created_at"],
        "attention": ["attention", "updated_at"],
        "workers": ["kind"],
    }
    create_tables(settings)  # idempotent


def test_tables_create_remakes_an_index_whose_projection_this_version_widened(
    aws: AwsTestEnv,
) -> None:
    """An index's projection cannot change in place: an index made by an earlier
    version (``attention`` without the lease deadline ``jobs list`` shows) is deleted
    and made anew; the records and the other indexes stay as they were."""
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    ddb = _ddb(settings)
    older = create_table_params(JobRecord, settings.jobs_table)
    for index in older["GlobalSecondaryIndexes"]:
        if index["IndexName"] == "attention":
            index["Projection"]["NonKeyAttributes"].remove("lease_deadline")
    ddb.create_table(**older)
    _strand(settings, "kept", age=5.0)
    create_tables(settings)

    def projections() -> dict[str, list[str]]:
        table = ddb.describe_table(TableName=settings.jobs_table)["Table"]
        return {
            i["IndexName"]: sorted(i["Projection"].get("NonKeyAttributes", []))
            for i in table["GlobalSecondaryIndexes"]
        }

    now = projections()
    wanted = create_table_params(JobRecord, settings.jobs_table)["GlobalSecondaryIndexes"]
    assert now == {
        i["IndexName"]: sorted(i["Projection"].get("NonKeyAttributes", [])) for i in wanted
    }
    assert "lease_deadline" in now["attention"]
    got = ddb.get_item(TableName=settings.jobs_table, Key={"job_id": {"S": "kept"}})
    assert got["Item"]["job_id"]["S"] == "kept"
    create_tables(settings)  # idempotent
    assert projections() == now


# =========================================================================== 14.2


class _SendGate(SyncDriver):
    """A driver that holds its first SendMessage until released (a slow producer)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, Journal(worker_id="producer-a"))
        self.at_send = threading.Event()
        self.release = threading.Event()

    def execute(self, c: Call) -> Outcome:
        if c.op == "SendMessage" and not self.at_send.is_set():
            self.at_send.set()
            assert self.release.wait(HANG)
        return super().execute(c)


def test_two_concurrent_submits_of_one_job_send_one_message(
    env: tuple[Settings, str, str],
) -> None:
    # Regression (issue 14.2): both submitters saw the record without a sent message
    # and both sent one; the second delivery then took the job from its live owner.
    settings, url, _ = env
    sqs = _sqs(settings)
    gate = _SendGate(settings)
    first: dict[str, Any] = {}
    a = threading.Thread(
        target=lambda: first.update(
            r=Producer(settings, driver=gate).submit("ocr", {"doc": "x"}, "j1")
        )
    )
    a.start()
    try:
        assert gate.at_send.wait(HANG)  # A wrote the record and is about to send
        second = Producer(settings).submit("ocr", {"doc": "x"}, "j1")
        assert (second.created, second.message_id) == (False, None)
        assert "another submission is sending its message" in second.note
        assert _depth(sqs, url) == 0  # B sent nothing
    finally:
        gate.release.set()
        a.join(HANG)
    assert first["r"].created is True and first["r"].message_id
    deliveries = _receive(settings, url)
    assert len(deliveries) == 1
    assert isinstance(_claim(settings, url, deliveries[0], "w1"), Claimed)
    assert _depth(sqs, url) == 1  # only the claimed message is left, in flight


def test_a_stray_message_is_deleted_and_the_live_owner_keeps_the_job(
    env: tuple[Settings, str, str],
) -> None:
    # Regression (issue 14.2): a second message of a running job claimed it, moving
    # the token and fencing out the owner that was working.
    settings, url, _ = env
    sqs, ddb = _sqs(settings), _ddb(settings)
    Producer(settings).submit("ocr", {"doc": "x"}, "j2")
    (d,) = _receive(settings, url)
    owner = _claim(settings, url, d, "w1")
    assert isinstance(owner, Claimed) and owner.token == 1
    stray = {"v": 1, "job_id": "j2", "job_class": "ocr", "send_id": "a-losing-sender"}
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(stray))
    (d2,) = _receive(settings, url)
    got = _claim(settings, url, d2, "w2")
    assert isinstance(got, NotClaimed) and got.outcome == "stray"
    view = read_view(ddb, settings, "j2")
    assert (view.state, view.token, view.owner) == (JobState.RUNNING, 1, "w1")
    assert _depth(sqs, url) == 1  # the stray is gone; the owner's message stays


# =========================================================================== 7.6


def test_a_message_naming_another_class_claims_nothing_and_goes_to_the_dlq(
    env: tuple[Settings, str, str],
) -> None:
    # Regression (issue 7.6): the mismatched message was claimed and the job failed,
    # fencing out its live owner. Both classes are known to the worker here.
    settings, url, dlq = env
    sqs, ddb = _sqs(settings), _ddb(settings)
    Producer(settings).submit("ocr", {"doc": "x"}, "j3")
    (d,) = _receive(settings, url)
    assert isinstance(_claim(settings, url, d, "w1"), Claimed)
    item = ddb.get_item(TableName=settings.jobs_table, Key={"job_id": {"S": "j3"}})["Item"]
    wrong: dict[str, Any] = {"v": 1, "job_id": "j3", "job_class": "browser"}
    if "send_id" in item:  # the job's current message, but for another class
        wrong["send_id"] = item["send_id"]["S"]
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(wrong))

    app = App()
    for name in ("ocr", "browser"):
        app.job(name, payload=Doc)(lambda ctx, p: {"ok": True})
    worker = Worker(app, settings, receive_wait=1, journal=Journal(worker_id="w2"))
    WorkerRunner(worker, max_messages=1).start().join(HANG)
    view = read_view(ddb, settings, "j3")
    assert (view.state, view.token, view.owner) == (JobState.RUNNING, 1, "w1")
    copy = sqs.receive_message(QueueUrl=dlq, MessageAttributeNames=["All"])["Messages"][0]
    assert json.loads(copy["Body"]) == wrong
    assert "job class" in copy["MessageAttributes"]["sqs_lease_reason"]["StringValue"]


# =========================================================================== 7.8


def test_a_record_stranded_without_a_message_is_listed_and_sent_by_jobs_repair(
    env: tuple[Settings, str, str],
) -> None:
    # Regression (issue 7.8): a producer that died between its write and its send left
    # a queued record that nothing would ever find again.
    settings, url, _ = env
    sqs, ddb = _sqs(settings), _ddb(settings)
    _strand(settings, "old", age=300)
    _strand(settings, "young", age=0)  # its producer may still be sending

    dry = _cli(settings, "jobs", "repair", "--dry-run")
    assert dry.exit_code == 0, (dry.output, dry.exception)
    listed, summary = dry.stdout.splitlines()  # "young" is inside the grace: not listed
    assert listed.startswith("old\tocr\tunsent for ") and listed.endswith("\twould send again")
    assert summary == "1 stranded (dry run: nothing sent)"
    assert _depth(sqs, url) == 0

    real = _cli(settings, "jobs", "repair")
    assert real.exit_code == 0, (real.output, real.exception)
    assert "old\tocr" in real.stdout and "sent again" in real.stdout
    assert real.stdout.splitlines()[-1] == "1 stranded, 1 sent again"
    (d,) = _receive(settings, url)
    record = read_view(ddb, settings, "old")
    assert d.send_id == record.send_id != "died-before-sending"
    assert (record.message_sent, record.unsent_since) == (True, None)
    assert isinstance(_claim(settings, url, d, "w1"), Claimed)
    again = _cli(settings, "jobs", "repair", "--older-than", "0")
    young, summary = again.stdout.splitlines()
    assert young.startswith("young\tocr\tunsent for ") and young.endswith("\tsent again")
    assert summary == "1 stranded, 1 sent again"


def _unsent_index(settings: Settings) -> list[str]:
    out = _ddb(settings).query(
        TableName=settings.jobs_table,
        IndexName="unsent",
        KeyConditionExpression="#u = :u",
        ExpressionAttributeNames={"#u": "unsent"},
        ExpressionAttributeValues={":u": {"S": "unsent"}},
    )
    return sorted(i["job_id"]["S"] for i in out["Items"])


def test_cancelled_never_sent_jobs_leave_the_index_and_never_hide_a_stranded_job(
    env: tuple[Settings, str, str],
) -> None:
    # Issue 26 defect 2: a cancel of a never-sent record left it in the unsent index;
    # the sweep read the oldest 25 and answered "moved" for each, for good, so once
    # 25 existed no stranded job was ever sent again.
    settings, url, _ = env
    producer = Producer(settings)
    for i in range(30):
        _strand(settings, f"dead-{i:02}", age=900 - i)
        producer.cancel(f"dead-{i:02}", "the user changed their mind")
    _strand(settings, "lost", age=120)
    assert _unsent_index(settings) == ["lost"]
    report = producer.repair(older_than=60, limit=25)
    assert [(j.job_id, j.verdict) for j in report.jobs] == [("lost", "resent")]
    (d,) = _receive(settings, url)
    assert d.job_id == "lost"


def test_dead_entries_an_older_version_left_are_cleared_and_the_stranded_job_is_sent(
    env: tuple[Settings, str, str],
) -> None:
    # The sweep's half of defect 2: entries it cannot act on (here 30 records an
    # older version's cancel ended but left in the index) are taken out, and read
    # past, within one run, so the stranded job behind them is sent.
    settings, url, _ = env
    ddb = _ddb(settings)
    for i in range(30):
        _strand(settings, f"dead-{i:02}", age=900 - i)
        ddb.update_item(  # the cancel as it was written before the fix
            TableName=settings.jobs_table,
            Key={"job_id": {"S": f"dead-{i:02}"}},
            UpdateExpression="SET #s = :f",
            ExpressionAttributeNames={"#s": "state"},
            ExpressionAttributeValues={":f": {"S": "failed"}},
        )
    _strand(settings, "lost", age=120)
    report = Producer(settings).repair(older_than=60, limit=25)
    verdicts = [(j.job_id, j.verdict) for j in report.jobs]
    assert verdicts[-1] == ("lost", "resent")
    assert verdicts[:-1] == [(f"dead-{i:02}", "cleared") for i in range(30)]
    assert _unsent_index(settings) == []
    (d,) = _receive(settings, url)
    assert d.job_id == "lost"
    assert read_view(ddb, settings, "dead-00").state is JobState.FAILED  # untouched otherwise


def test_the_worker_sweep_sends_a_stranded_job_behind_more_dead_entries_than_its_limit(
    env: tuple[Settings, str, str],
) -> None:
    settings, _, _ = env
    ddb = _ddb(settings)
    producer = Producer(settings)
    for i in range(8):
        _strand(settings, f"dead-{i}", age=900 - i)
        producer.cancel(f"dead-{i}")
    _strand(settings, "lost", age=120)
    app = App()
    app.job("ocr", payload=Doc)(lambda ctx, p: {"doc": p.doc})
    worker = Worker(
        app,
        settings,
        receive_wait=1,
        sweep_interval=0.2,
        sweep_grace=60,
        sweep_limit=5,
        journal=Journal(worker_id="sweeper"),
    )
    with running(worker):
        wait_until(
            lambda: read_view(ddb, settings, "lost").state is JobState.SUCCEEDED,
            HANG,
            "the stranded job behind the cancelled ones to succeed",
        )


def test_a_record_stamped_by_a_clock_hours_ahead_is_stamped_again_then_sent_by_jobs_repair(
    env: tuple[Settings, str, str],
) -> None:
    # Soak seed 1469822: a writer whose clock ran 3.9 h ahead died before its send;
    # the age query hid its record until the sweepers' clocks passed the stamp.
    settings, url, _ = env
    sqs, ddb = _sqs(settings), _ddb(settings)
    _strand(settings, "ahead", age=-14_000)
    first = _cli(settings, "jobs", "repair")
    assert first.exit_code == 0, (first.output, first.exception)
    line = first.stdout.splitlines()[0]
    assert line.startswith("ahead\tocr\t") and "stamped again here" in line
    assert _depth(sqs, url) == 0  # its age cannot be told: not sent on sight
    stamp = read_view(ddb, settings, "ahead").unsent_since
    assert stamp is not None and abs(stamp - time.time()) < HANG  # on this clock now
    again = _cli(settings, "jobs", "repair", "--older-than", "0")
    assert again.stdout.splitlines()[-1] == "1 stranded, 1 sent again", again.output
    (d,) = _receive(settings, url)
    assert d.job_id == "ahead"


def test_the_worker_sweep_sends_a_job_stranded_by_a_clock_hours_ahead(
    env: tuple[Settings, str, str],
) -> None:
    settings, _, _ = env
    ddb = _ddb(settings)
    _strand(settings, "ahead", age=-14_000)
    app = App()
    app.job("ocr", payload=Doc)(lambda ctx, p: {"doc": p.doc})
    worker = Worker(
        app,
        settings,
        receive_wait=1,
        sweep_interval=0.2,
        sweep_grace=1,
        journal=Journal(worker_id="sweeper"),
    )
    with running(worker):
        wait_until(
            lambda: read_view(ddb, settings, "ahead").state is JobState.SUCCEEDED,
            HANG,
            "the job stamped 3.9 h ahead to be sent again and to succeed",
        )


@pytest.mark.parametrize("ending", ["cancel", "park_undelivered", "claim", "mark_sent"])
def test_a_record_is_in_the_unsent_index_exactly_while_it_waits_for_its_message(
    env: tuple[Settings, str, str], ending: str
) -> None:
    settings, _, _ = env
    ddb, table = _ddb(settings), JobTable(settings.jobs_table)
    _strand(settings, "j", age=120)
    assert _unsent_index(settings) == ["j"]
    now = time.time()
    write = {
        "cancel": lambda: table.cancel("j", "by request", now),
        "park_undelivered": lambda: table.park_undelivered(
            "j", job_class="ocr", send_id="died-before-sending", reason="r", wall_now=now
        ),
        "claim": lambda: table.claim(
            "j", "w", now, 60, job_class="ocr", send_id="died-before-sending"
        ),
        "mark_sent": lambda: table.mark_sent("j", "died-before-sending", now),
    }[ending]()
    ddb.update_item(**write.params)
    view = read_view(ddb, settings, "j")
    assert awaits_send(view) is False
    assert _unsent_index(settings) == []


def test_the_worker_sweep_sends_a_stranded_record_and_the_job_runs(
    env: tuple[Settings, str, str],
) -> None:
    settings, _, _ = env
    ddb = _ddb(settings)
    _strand(settings, "lost", age=120)
    app = App()
    app.job("ocr", payload=Doc)(lambda ctx, p: {"doc": p.doc})
    worker = Worker(
        app,
        settings,
        receive_wait=1,
        sweep_interval=0.2,
        sweep_grace=60,
        sweep_limit=5,
        journal=Journal(worker_id="sweeper"),
    )
    with running(worker):
        wait_until(
            lambda: read_view(ddb, settings, "lost").state is JobState.SUCCEEDED,
            HANG,
            "the swept job to succeed",
        )


def test_a_resume_whose_send_failed_can_be_resumed_again(env: tuple[Settings, str, str]) -> None:
    # Regression (issue 7.8): after a resume whose send failed, a second resume said
    # "not parked" and the job stayed queued without a message.
    settings, url, _ = env
    sqs, ddb = _sqs(settings), _ddb(settings)
    Producer(settings).submit("ocr", {"doc": "x"}, "p1")
    sqs.purge_queue(QueueUrl=url)
    ddb.update_item(
        TableName=settings.jobs_table,
        Key={"job_id": {"S": "p1"}},
        UpdateExpression="SET #s = :p",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":p": {"S": "parked"}},
    )
    broken = Producer(settings)
    broken._queue_url = url + "-gone"  # the send fails: no such queue
    with pytest.raises(SqsLeaseError, match="NonExistentQueue") as caught:
        broken.resume("p1")
    assert read_view(ddb, settings, "p1").state is JobState.QUEUED
    assert _depth(sqs, url) == 0

    again = _cli(settings, "jobs", "resume", "p1")
    assert again.exit_code == 0, (again.output, again.exception)
    assert "queued without a message: message sent" in again.stdout
    (d,) = _receive(settings, url)
    assert isinstance(_claim(settings, url, d, "w1"), Claimed)
    third = _cli(settings, "jobs", "resume", "p1")
    assert third.exit_code != 0 and "not parked" in third.output
    assert "jobs resume p1" in str(caught.value)  # the first failure said what to do


# =========================================================================== 14.1 / 14.6


def _parking_app(calls: list[EffectCall]) -> App:
    app = App()
    app.target("payments")  # no check: nobody can tell after a timeout

    def capture(call: EffectCall) -> dict[str, str]:
        calls.append(call)
        if len(calls) == 1:
            raise ToolOutcomeUnknown("read timeout")
        return {"charge_id": "ch_again"}

    @app.job("capture", payload=Doc, max_attempts=1, lease_seconds=10, heartbeat_seconds=2)
    def handler(ctx: Any, p: Doc) -> dict[str, Any]:
        done = ctx.effect("capture", "payments", {"doc": p.doc}, capture, key=f"pay:{p.doc}")
        return {"charge_id": done.external_id, "replayed": done.replayed}

    return app


def test_a_job_parked_on_its_last_attempt_and_resolved_confirmed_succeeds_calling_once(
    env: tuple[Settings, str, str],
) -> None:
    # Regression (issue 14.1): max attempts 1, the effect timed out with no check, the
    # job parked; after `intents resolve --confirmed` it ended "failed: attempts
    # exhausted (1 of 1)" though the charge happened and was confirmed.
    settings, _, _ = env
    ddb = _ddb(settings)
    calls: list[EffectCall] = []
    app = _parking_app(calls)
    Producer(settings, app).submit("capture", {"doc": "inv-1"}, "pay-1")
    worker = Worker(app, settings, receive_wait=1, journal=Journal(worker_id="w1"))
    with running(worker):
        wait_until(
            lambda: read_view(ddb, settings, "pay-1").state is JobState.PARKED, HANG, "the park"
        )
        resolved = _cli(settings, "intents", "resolve", "pay:inv-1", "--confirmed", "ch_1")
        assert resolved.exit_code == 0, (resolved.output, resolved.exception)
        wait_until(lambda: read_view(ddb, settings, "pay-1").state.terminal, HANG, "the job to end")
    view = read_view(ddb, settings, "pay-1")
    assert (view.state, view.reason) == (JobState.SUCCEEDED, None)
    assert len(calls) == 1  # the resolved step replayed the operator's confirmation
    assert (view.attempt, view.granted_attempts) == (2, 1)
    assert "re-enqueued (one attempt granted)" in resolved.stdout
    shown = _cli(settings, "jobs", "show", "pay-1")
    assert "granted_attempts: 1" in shown.stdout


def test_a_resolution_whose_job_half_was_lost_is_finished_by_resolving_again(
    env: tuple[Settings, str, str],
) -> None:
    # Regression (issue 14.6): the intent was settled but the unpark got no answer;
    # a second `resolve` said "nothing to resolve" and the job stayed parked.
    settings, url, _ = env
    sqs, ddb = _sqs(settings), _ddb(settings)
    Producer(settings).submit("ocr", {"doc": "x"}, "half")
    sqs.purge_queue(QueueUrl=url)
    ddb.update_item(
        TableName=settings.jobs_table,
        Key={"job_id": {"S": "half"}},
        UpdateExpression="SET #s = :p",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":p": {"S": "parked"}},
    )
    now = time.time()
    intent = IntentRecord(
        intent_key="k-half",
        job_id="half",
        stage="main",
        action="capture",
        target="payments",
        state="confirmed",
        payload="{}",
        payload_hash="h",
        attempts=1,
        last_token=1,
        external_id="ch_1",
        created_at=now - 60,
        updated_at=now,
        resolution="confirmed",
        resolved_by="alice@ops",
        resolved_at=now,
        resolution_reason="seen in the dashboard",
    )
    ddb.put_item(TableName=settings.intents_table, Item=intent.serialize())

    again = _cli(settings, "intents", "resolve", "k-half", "--confirmed", "ch_1")
    assert again.exit_code == 0, (again.output, again.exception)
    assert "already resolved (confirmed by alice@ops)" in again.stdout
    assert "still parked" in again.stdout
    view = read_view(ddb, settings, "half")
    assert (view.state, view.message_sent, view.granted_attempts) == (JobState.QUEUED, True, 1)
    (d,) = _receive(settings, url)
    assert d.send_id == view.send_id
    done = _cli(settings, "intents", "resolve", "k-half", "--confirmed", "ch_1")
    assert done.exit_code == 3 and "nothing to do" in done.output
