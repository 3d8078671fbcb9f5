"""The sync worker against a real moto server: mixed versions on one queue, handler
errors an operator can read, one lease-loss event per attempt, records the code
cannot read, and DynamoDB's permanent refusals."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import (
    FAST,
    HANG_GUARD,
    collect_journal,
    drain,
    hold_heartbeat,
    prepare,
    read_record,
    running,
    use_shell,
    wait_until,
)

from sqs_lease import App, JobContext, JobPolicy, Producer, Worker
from sqs_lease._dlq import find_in_dlq
from sqs_lease.cli import cli

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

pytestmark = pytest.mark.integration

Shell: Any = Worker  # each worker shell in turn (use_shell)
shell = use_shell(__name__)


class Work(BaseModel):
    n: int
    note: str = ""


def make_worker(app: App, settings: Any, name: str, **kw: Any) -> Any:
    kw.setdefault("receive_wait", 1)
    kw.setdefault("shutdown_grace", 3.0)
    return Shell(app, settings, worker_id=f"{name}-{settings.prefix}", **kw)


# --------------------------------------------------------------------------- 7.6


def test_a_worker_that_does_not_know_a_job_class_leaves_the_job_for_one_that_does(
    aws: AwsTestEnv, ddb_client: DynamoDBClient, sqs_client: SQSClient
) -> None:
    settings, _, dlq = prepare(aws.endpoint_url, aws.prefix)
    old, new = App(), App()

    @old.job("work", payload=Work, **FAST)
    def work(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        return {"n": p.n}

    @new.job("work", payload=Work, **FAST)
    def work2(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        return {"n": p.n}

    @new.job("report", payload=Work, **FAST)
    def report(ctx: JobContext[Any], p: Work) -> dict[str, str]:
        return {"made_by": "new"}

    job_id = Producer(settings, new).submit("report", Work(n=1), job_id=f"{aws.prefix}-r").job_id
    old_worker = make_worker(old, settings, "old")
    with collect_journal() as journal, running(old_worker) as (runner,):
        journal.wait_for("job_class_unknown", job_id=job_id, timeout=15)
        stats = runner.stop()
    # Not claimed, not failed: the record is as the producer wrote it.
    rec = read_record(ddb_client, settings, job_id)
    assert (rec.state, rec.token, rec.attempt) == ("queued", 0, 0) and rec.error_code is None
    assert stats.claimed == 0 and stats.failed == 0 and stats.deferred >= 1
    (first, *_) = journal.events("job_class_unknown", job_id=job_id)
    assert first["job_class"] == "report" and first["delay"] >= 1
    assert journal.events("job_failed", job_id=job_id) == []

    # The new version's worker takes it (once the backoff lapses) and runs it.
    new_worker = make_worker(new, settings, "new")
    with collect_journal() as journal, running(new_worker) as (runner,):
        journal.wait_for("result_committed", job_id=job_id, timeout=20)
        runner.stop()
    rec = read_record(ddb_client, settings, job_id)
    assert (rec.state, rec.token) == ("succeeded", 1)
    assert drain(sqs_client, dlq, timeout=1, want=1) == []


def test_a_message_of_an_unknown_class_goes_to_the_dlq_with_the_reason_after_the_bound(
    aws: AwsTestEnv, ddb_client: DynamoDBClient, sqs_client: SQSClient
) -> None:
    settings, _, dlq = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("work", payload=Work, **FAST)
    def work(ctx: JobContext[Any], p: Work) -> None:
        return None

    job_id = Producer(settings).submit("mystery", {"n": 1}, job_id=f"{aws.prefix}-m").job_id
    worker = make_worker(app, settings, "w", unknown_class_receives=2)
    with collect_journal() as journal, running(worker) as (runner,):
        journal.wait_for("message_poisoned", job_id=job_id, timeout=20)
        runner.stop()
    moved = journal.events("job_class_unknown", job_id=job_id, moved_to_dlq=True)
    assert [e["receive_count"] for e in moved] == [2]
    # The journal names the message it moved, and its copy in the DLQ (issue 29): an
    # operator goes from either to the other (`dlq show` takes the journal's id).
    (poisoned,) = journal.events("message_poisoned", job_id=job_id)
    shown = find_in_dlq(settings, poisoned["message_id"])
    assert [(m.message_id, m.source_message_id) for m in shown] == [
        (poisoned["dlq_message_id"], poisoned["message_id"])
    ]
    assert poisoned["dlq_message_id"] != poisoned["message_id"]
    (dead,) = drain(sqs_client, dlq, timeout=3, want=1)
    reason = dead["MessageAttributes"]["sqs_lease_reason"]["StringValue"]
    assert "'mystery'" in reason and "2 receives" in reason
    assert dead["MessageId"] == poisoned["dlq_message_id"]
    # Where the job is, on its record: parked, naming the DLQ and the way back.
    rec = read_record(ddb_client, settings, job_id)
    assert (rec.state, rec.token, rec.error_code) == ("parked", 1, "undeliverable")
    assert "in the DLQ" in (rec.reason or "") and "jobs resume" in (rec.reason or "")


def test_a_job_whose_owner_lapsed_and_whose_message_went_to_the_dlq_is_parked_then_resumed(
    aws: AwsTestEnv, ddb_client: DynamoDBClient, sqs_client: SQSClient
) -> None:
    # Soak seed 207201, on a real server: the new version's worker that held the job
    # was cut off past its lease (its record says `running`), and the old version's
    # workers moved the message to the DLQ after the bound. The record must not say
    # `running` for good: it is parked with the reason, and a resume runs it.
    settings, _, dlq = prepare(aws.endpoint_url, aws.prefix)
    old, new = App(), App()

    @old.job("work", payload=Work, **FAST)
    def work(ctx: JobContext[Any], p: Work) -> None:
        return None

    @new.job("report", payload=Work, **FAST)
    def report(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        return {"n": p.n}

    job_id = Producer(settings, new).submit("report", Work(n=7), job_id=f"{aws.prefix}-l").job_id
    # The cut-off owner's claim, as it left the record.
    ddb_client.update_item(
        TableName=settings.jobs_table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="SET #s = :r, #o = :o, #t = :one, #a = :one",
        ExpressionAttributeNames={"#s": "state", "#o": "owner", "#t": "token", "#a": "attempt"},
        ExpressionAttributeValues={
            ":r": {"S": "running"},
            ":o": {"S": "new-cut-off"},
            ":one": {"N": "1"},
        },
    )
    old_worker = make_worker(old, settings, "old", unknown_class_receives=1)
    with collect_journal() as journal, running(old_worker) as (runner,):
        journal.wait_for("message_poisoned", job_id=job_id, timeout=20)
        runner.stop()
    (parked,) = journal.events("job_parked", job_id=job_id)
    assert parked["previous_owner"] == "new-cut-off" and parked["undeliverable"] is True
    rec = read_record(ddb_client, settings, job_id)
    assert (rec.state, rec.token, rec.attempt) == ("parked", 2, 1)
    assert rec.error_code == "undeliverable" and "'report'" in (rec.reason or "")
    assert len(drain(sqs_client, dlq, timeout=3, want=1)) == 1

    resumed = CliRunner().invoke(
        cli,
        ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix, "jobs", "resume", job_id],
    )
    assert resumed.exit_code == 0, resumed.output
    new_worker = make_worker(new, settings, "new")
    with collect_journal() as journal, running(new_worker) as (runner,):
        journal.wait_for("result_committed", job_id=job_id, timeout=20)
        runner.stop()
    rec = read_record(ddb_client, settings, job_id)
    assert (rec.state, rec.token) == ("succeeded", 3)


# --------------------------------------------------------------------------- 7.10


def test_a_handler_error_keeps_its_type_and_message_on_the_record_and_in_jobs_show(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("q", payload=Work, **FAST | {"max_attempts": 2, "backoff_base_seconds": 0.0})
    def q(ctx: JobContext[Any], p: Work) -> None:
        raise ValueError(f"upstream quota exceeded for tenant {p.note}")

    job_id = (
        Producer(settings, app)
        .submit("q", Work(n=1, note="SECRET-tenant"), job_id=f"{aws.prefix}-q")
        .job_id
    )
    worker = make_worker(app, settings, "w")
    with collect_journal() as journal, running(worker) as (runner,):
        journal.wait_for("job_failed", job_id=job_id, timeout=15)
        runner.stop()
    want = "ValueError: upstream quota exceeded for tenant <payload>"
    (retry,) = journal.events("job_retry_scheduled", job_id=job_id)
    assert (retry["reason"], retry["error_code"]) == (want, "ValueError")
    rec = read_record(ddb_client, settings, job_id)
    assert rec.state == "failed" and rec.reason is not None and want in rec.reason
    shown = CliRunner().invoke(
        cli, ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix, "jobs", "show", job_id]
    )
    assert shown.exit_code == 0, shown.output
    assert want in shown.output
    assert "SECRET-tenant" not in str(journal.events())


def test_a_configuration_error_in_a_handler_fails_the_job_at_once(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("pay", payload=Work, **FAST | {"max_attempts": 4, "backoff_base_seconds": 0.0})
    def pay(ctx: JobContext[Any], p: Work) -> None:
        ctx.effect("capture", "psp-typo", {"n": p.n}, lambda call: {"ok": True})

    job_id = Producer(settings, app).submit("pay", Work(n=1), job_id=f"{aws.prefix}-c").job_id
    worker = make_worker(app, settings, "w")
    with collect_journal() as journal, running(worker) as (runner,):
        journal.wait_for("job_failed", job_id=job_id, timeout=15)
        runner.stop()
    rec = read_record(ddb_client, settings, job_id)
    assert (rec.state, rec.attempt, rec.error_code) == ("failed", 1, "ConfigError")
    assert rec.reason is not None and "'psp-typo' is not declared" in rec.reason
    assert journal.events("job_retry_scheduled", job_id=job_id) == []


# --------------------------------------------------------------------------- 7.14


def test_a_worker_that_learns_after_a_pause_that_its_job_was_taken_journals_one_loss(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    release = threading.Event()

    @app.job("slow", payload=Work, **FAST)
    def slow(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        if ctx.token == 1:
            release.wait(HANG_GUARD)  # a blocked call: the process is paused meanwhile
        return {"token": ctx.token}

    job_id = Producer(settings, app).submit("slow", Work(n=1), job_id=f"{aws.prefix}-p").job_id
    a = make_worker(app, settings, "a", concurrency=1)
    paused = threading.Event()
    hold_heartbeat(a, paused)  # the heartbeat of a paused process does nothing
    b = make_worker(app, settings, "b")
    with collect_journal() as journal, running(a):
        journal.wait_for("job_claimed", job_id=job_id, worker=a.worker_id)
        paused.set()
        with running(b):
            journal.wait_for("result_committed", job_id=job_id, worker=b.worker_id, timeout=20)
        paused.clear()
        release.set()
        # Its late result is refused by the commit's fence or, where its heartbeat saw
        # its own lateness first (a loaded machine), discarded without a commit.
        wait_until(
            lambda: bool(
                journal.events("result_rejected", job_id=job_id, worker=a.worker_id)
                + journal.events("result_discarded", job_id=job_id, worker=a.worker_id)
            ),
            15,
            "the first owner's late result refused or discarded",
        )
        wait_until(
            lambda: bool(journal.events("heartbeat_lost", job_id=job_id, worker=a.worker_id)),
            5,
            "the loss journaled",
        )
        time.sleep(1.5)  # a second report would come within a heartbeat or two
    lost = journal.events("heartbeat_lost", job_id=job_id, worker=a.worker_id)
    assert len(lost) == 1, lost
    # commit: the fence refused its late result; heartbeat: its ownership read saw the
    # new token; release: its own lateness dropped the attempt first (a loaded
    # machine) and the hand-back of the job, fenced too, was refused.
    assert lost[0]["token"] == 1
    assert lost[0]["detected_by"] in ("commit", "heartbeat", "release"), lost
    rec = read_record(ddb_client, settings, job_id)
    assert (rec.state, rec.token, rec.owner) == ("succeeded", 2, b.worker_id)


# --------------------------------------------------------------------------- 14.4


def test_one_unreadable_record_does_not_cost_the_other_jobs_their_leases(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    go = threading.Event()

    @app.job("hold", payload=Work, **FAST | {"max_attempts": 1})
    def hold(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        go.wait(HANG_GUARD)  # set by the test: a hang guard
        ctx.wait(4.0)  # more than a lease after the edit, kept alive by the heartbeat
        return {"n": p.n}

    producer = Producer(settings, app)
    ids = [producer.submit("hold", Work(n=i), job_id=f"{aws.prefix}-h{i}").job_id for i in range(3)]
    worker = make_worker(app, settings, "w", concurrency=3)
    weird = ids[1]
    with collect_journal() as journal, running(worker) as (runner,):
        for job_id in ids:
            journal.wait_for("job_claimed", job_id=job_id, timeout=15)
        ddb_client.update_item(
            TableName=settings.jobs_table,
            Key={"job_id": {"S": weird}},
            UpdateExpression="SET #s = :w",
            ExpressionAttributeNames={"#s": "state"},
            ExpressionAttributeValues={":w": {"S": "weird"}},
        )
        edited = time.monotonic()
        go.set()
        for job_id in (ids[0], ids[2]):
            journal.wait_for("result_committed", job_id=job_id, timeout=20)
        journal.wait_for("job_record_unreadable", job_id=weird, timeout=5)
        runner.stop()
    assert journal.events("heartbeat_error") == []
    for job_id in (ids[0], ids[2]):
        beats = [e for e in journal.events("heartbeat_ok", job_id=job_id) if e["_mono"] > edited]
        assert len(beats) >= 2, f"{job_id}: the heartbeat stopped after the edit"
        assert journal.events("lease_dropped", job_id=job_id) == []
        rec = read_record(ddb_client, settings, job_id)
        assert (rec.state, rec.token) == ("succeeded", 1)
    assert journal.events("result_committed", job_id=weird) == []


# --------------------------------------------------------------------------- 14.5


def test_a_result_that_with_its_payload_breaks_the_item_limit_fails_the_job_naming_it(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("big", payload=Work, **FAST | {"max_attempts": 3})
    def big(ctx: JobContext[Any], p: Work) -> dict[str, str]:
        return {"text": "r" * 200_000}  # alone under the old 350,000-byte rule

    note = "p" * 250_000
    job_id = Producer(settings, app).submit("big", Work(n=1, note=note), job_id=f"{aws.prefix}-b")
    worker = make_worker(app, settings, "w")
    with collect_journal() as journal, running(worker) as (runner,):
        journal.wait_for("job_failed", job_id=job_id.job_id, timeout=15)
        runner.stop()
    rec = read_record(ddb_client, settings, job_id.job_id)
    assert (rec.state, rec.attempt, rec.error_code) == ("failed", 1, "result_too_large")
    assert rec.reason is not None and "409600" in rec.reason
    assert journal.events("ownership_unknown", job_id=job_id.job_id) == []


def test_a_record_lacking_an_attribute_the_claim_needs_is_poison_not_ownership_unknown(
    aws: AwsTestEnv, ddb_client: DynamoDBClient, sqs_client: SQSClient
) -> None:
    settings, _, dlq = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("work", payload=Work, **FAST)
    def work(ctx: JobContext[Any], p: Work) -> None:
        return None

    job_id = Producer(settings, app).submit("work", Work(n=1), job_id=f"{aws.prefix}-t").job_id
    ddb_client.update_item(
        TableName=settings.jobs_table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="SET #t = :bad",
        ExpressionAttributeNames={"#t": "token"},
        ExpressionAttributeValues={":bad": {"S": "not a number"}},
    )
    worker = make_worker(app, settings, "w")
    with collect_journal() as journal, running(worker) as (runner,):
        journal.wait_for("message_poisoned", job_id=job_id, timeout=15)
        runner.stop()
    assert journal.events("ownership_unknown", job_id=job_id) == []
    (dead,) = drain(sqs_client, dlq, timeout=3, want=1)
    assert (
        "DynamoDB refused the claim" in dead["MessageAttributes"]["sqs_lease_reason"]["StringValue"]
    )


def test_a_fence_refusal_of_a_call_paused_before_its_send_is_told_as_a_lease_loss(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    """The before-send scenario (issue 26): W1's intent started, then its process
    paused before the call went out; W2 took the job over; W1's late call is refused
    by the fenced receiver (412 stale_token). That refusal proves another owner:
    ``heartbeat_lost`` (``detected_by: intent_start``) and ``job_abandoned LeaseLost``,
    as docs/operations.md says, never ``OwnershipUnknown`` because the lease lapsed
    while the process was paused."""
    from sqs_lease import FenceRefused

    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    app.target("psp")
    at_send, go = threading.Event(), threading.Event()

    def late_call(call: Any) -> Any:
        at_send.set()
        go.wait(30)  # paused with the request about to go out
        # What effects.http_json raises on the receiver's 412 stale_token.
        raise FenceRefused(f"psp: the receiver rejected fencing token {call.token}")

    @app.job("pay", payload=Work, **FAST | {"max_attempts": 1})
    def pay(ctx: JobContext[Any], p: Work) -> None:
        ctx.effect("capture", "psp", {"n": p.n}, late_call)

    job_id = Producer(settings, app).submit("pay", Work(n=1), job_id=f"{aws.prefix}-b").job_id
    w = make_worker(app, settings, "w", concurrency=1)
    paused = threading.Event()
    with collect_journal() as journal, running(w):
        journal.wait_for("intent_started", job_id=job_id)
        assert at_send.wait(15)
        paused.set()
        hold_heartbeat(w, paused)  # the whole process is paused: its heartbeat too
        ddb_client.update_item(  # W2's claim: the token moves on under the paused call
            TableName=settings.jobs_table,
            Key={"job_id": {"S": job_id}},
            UpdateExpression="SET #t = :t, #o = :o",
            ExpressionAttributeNames={"#t": "token", "#o": "owner"},
            ExpressionAttributeValues={":t": {"N": "2"}, ":o": {"S": "other"}},
        )
        time.sleep(float(FAST["lease_seconds"]) + 1.0)  # the local lease lapses meanwhile
        go.set()
        journal.wait_for("job_abandoned", job_id=job_id, timeout=15)
        paused.clear()
        time.sleep(1.0)
    ended = journal.events("job_abandoned", job_id=job_id)
    assert [(e["error_code"], e["stop"]) for e in ended] == [("LeaseLost", "lease_lost")]
    lost = journal.events("heartbeat_lost", job_id=job_id)
    assert [(e["token"], e["detected_by"]) for e in lost] == [(1, "intent_start")]
    failed = journal.events("tool_request_failed", job_id=job_id)
    # the refusal proves the call was not applied: never told as an unknown outcome
    assert [(e["error_code"], e["outcome_unknown"]) for e in failed] == [("FenceRefused", False)]


def test_a_refused_intent_start_after_a_takeover_journals_the_loss_once(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    app.target("psp")
    taken = threading.Event()
    called: list[int] = []
    slow: JobPolicy = {"lease_seconds": 20, "heartbeat_seconds": 5.0, "jitter_seconds": 2.0}

    @app.job("pay", payload=Work, **slow | {"max_attempts": 1})
    def pay(ctx: JobContext[Any], p: Work) -> None:
        taken.wait(HANG_GUARD)  # set by the test: a hang guard
        ctx.effect("capture", "psp", {"n": p.n}, lambda call: called.append(call.token))

    job_id = Producer(settings, app).submit("pay", Work(n=1), job_id=f"{aws.prefix}-i").job_id
    w = make_worker(app, settings, "w", concurrency=1)
    paused = threading.Event()
    paused.set()
    hold_heartbeat(w, paused)  # keep the heartbeat out of it: the intent start learns first
    with collect_journal() as journal, running(w):
        journal.wait_for("job_claimed", job_id=job_id)
        # Another owner's claim (by hand): the token moves on under the handler.
        ddb_client.update_item(
            TableName=settings.jobs_table,
            Key={"job_id": {"S": job_id}},
            UpdateExpression="SET #t = :t, #o = :o",
            ExpressionAttributeNames={"#t": "token", "#o": "owner"},
            ExpressionAttributeValues={":t": {"N": "2"}, ":o": {"S": "other"}},
        )
        taken.set()
        journal.wait_for("job_abandoned", job_id=job_id, timeout=15)
        paused.clear()
        time.sleep(1.0)
    assert called == []
    lost = journal.events("heartbeat_lost", job_id=job_id)
    assert [(e["token"], e["detected_by"]) for e in lost] == [(1, "intent_start")]
