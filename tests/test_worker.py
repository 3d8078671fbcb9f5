"""The sync worker against a real moto server over HTTP.

Every test builds its own table and queue (unique prefix), an App whose job
classes use short leases, submits with the Producer, runs a Worker in a thread
and asserts on the job records (consistent reads) and on the journal.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import (
    FAST,
    HANG_GUARD,
    ROOMY,
    TextCapture,
    collect_journal,
    drain,
    prepare,
    queue_depth,
    read_record,
    read_view,
    result_of,
    running,
    use_shell,
    wait_until,
)

from sqs_lease import (
    App,
    JobCancelled,
    JobClass,
    JobClassError,
    JobContext,
    JobPolicy,
    JobState,
    PermanentError,
    Producer,
    Settings,
    TransientError,
    Worker,
)
from sqs_lease._core.timing import backoff_delay

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

pytestmark = pytest.mark.integration

Shell: Any = Worker  # each worker shell in turn (use_shell)
shell = use_shell(__name__)


class Work(BaseModel):
    n: int
    note: str = ""


JITTER = 0.99


class FixedRandom(random.Random):
    """Backoff jitter pinned near its ceiling, so the delays are known in advance."""

    def random(self) -> float:
        return JITTER


def make_worker(app: App, settings: Settings, name: str, **kw: Any) -> Any:
    kw.setdefault("receive_wait", 1)
    kw.setdefault("shutdown_grace", 5.0)
    return Shell(app, settings, worker_id=f"{name}-{settings.prefix}", **kw)


def job_events(events: list[dict[str, Any]], job_id: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("job_id") == job_id]


# --------------------------------------------------------------------------- 1. happy path


def test_happy_path_five_jobs_succeed_once_and_leave_the_queue_empty(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("work", payload=Work, **ROOMY)
    def work(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        return {"double": p.n * 2}

    producer = Producer(settings, app)
    ids = [producer.submit("work", Work(n=i), job_id=f"{aws.prefix}-{i}").job_id for i in range(5)]
    worker = make_worker(app, settings, "w")
    with collect_journal() as journal, running(worker) as (runner,):
        wait_until(
            lambda: all(
                read_view(ddb_client, settings, j).state is JobState.SUCCEEDED for j in ids
            ),
            20,
            "all five jobs succeeded",
        )
        stats = runner.stop()

    assert (stats.claimed, stats.committed, stats.reclaimed, stats.rejected) == (5, 5, 0, 0)
    for i, job_id in enumerate(ids):
        rec = read_record(ddb_client, settings, job_id)
        assert rec.state == "succeeded"
        assert result_of(rec) == {"double": 2 * i}
        assert (rec.token, rec.attempt, rec.owner) == (1, 1, worker.worker_id)
        assert rec.reason is None and rec.error_code is None
        claimed = journal.events("job_claimed", job_id=job_id)
        assert [(e["token"], e["attempt"], e["lease_seconds"]) for e in claimed] == [(1, 1, 30)]
        assert [e["token"] for e in journal.events("result_committed", job_id=job_id)] == [1]
    # Every message was deleted after its commit; or, where the batched delete got no
    # answer on an overloaded machine (or the lease lapsed before it went: a stale
    # handle deletes nothing), it comes back on the queue when its lease lapses and
    # the next worker deletes it as already done: it never runs a finished job again.
    # That worker waits out the lease (a hang guard: it returns at the last message).
    left = queue_depth(sqs_client, url)
    if left:
        again = make_worker(app, settings, "w2").run(max_messages=left, idle_exit=HANG_GUARD)
        assert again.claimed == 0 and again.already_done == left, again
    wait_until(lambda: queue_depth(sqs_client, url) == 0, 3, "an empty queue")


# --------------------------------------------------------------------------- 2. heartbeat


def test_handler_longer_than_its_lease_is_kept_alive_by_the_heartbeat(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("long", payload=Work, **FAST)
    def long(ctx: JobContext[Any], p: Work) -> dict[str, Any]:
        cancelled = ctx.wait(2.5 * ctx.job_class.lease_seconds)
        return {"cancelled": cancelled, "token": ctx.token}

    job_id = Producer(settings, app).submit("long", Work(n=1), job_id=f"{aws.prefix}-long").job_id
    # Free slots: a message whose lease lapsed would be received and claimed again.
    worker = make_worker(app, settings, "w", concurrency=4)
    with collect_journal() as journal, running(worker) as (runner,):
        journal.wait_for("result_committed", job_id=job_id, timeout=20)
        stats = runner.stop()

    rec = read_record(ddb_client, settings, job_id)
    assert rec.state == "succeeded"
    assert result_of(rec) == {"cancelled": False, "token": 1}
    assert (rec.token, rec.attempt) == (1, 1)
    assert len(journal.events("job_claimed", job_id=job_id)) == 1
    assert stats.claimed == 1 and stats.reclaimed == 0
    beats = journal.events("heartbeat_ok", job_id=job_id, token=1)
    assert len(beats) >= 4, f"only {len(beats)} heartbeats in 7.5 s at 1 s"
    assert all(0 < b["lease_left"] <= 3 for b in beats)
    # (A slow moto may cost a round as ownership_unknown; that alone is not a failure.)
    for bad in ("heartbeat_lost", "lease_dropped", "result_rejected", "job_abandoned"):
        assert journal.events(bad, job_id=job_id) == [], bad


# --------------------------------------------------------------------------- 3/4. errors


def test_transient_errors_retry_with_backoff_until_attempts_are_spent(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    calls: dict[str, int] = {"flaky": 0, "once": 0}
    # A lease a loaded machine cannot lapse by accident (seen: the loop held 3.2 s, the
    # 3 s lease lapsed and the job was re-claimed): this test is about the backoff.
    policy: JobPolicy = {
        **FAST,
        "lease_seconds": 20,
        "heartbeat_seconds": 5.0,
        "max_attempts": 3,
        "backoff_base_seconds": 1.5,
        "backoff_max_seconds": 4.0,
    }
    delays = [backoff_delay(a, 1.5, 4.0, JITTER) for a in (1, 2)]
    assert delays[0] >= 1 and delays[1] > delays[0]  # exponential, and long enough to see

    @app.job("flaky", payload=Work, **policy)
    def flaky(ctx: JobContext[Any], p: Work) -> None:
        calls["flaky"] += 1
        raise TransientError("upstream answered 503", code="upstream_503")

    @app.job("once", payload=Work, **policy)
    def once(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        calls["once"] += 1
        if ctx.attempt == 1:
            raise TransientError("first try times out", code="timeout")
        return {"attempt": ctx.attempt}

    producer = Producer(settings, app)
    flaky_id = producer.submit("flaky", Work(n=1), job_id=f"{aws.prefix}-flaky").job_id
    once_id = producer.submit("once", Work(n=1), job_id=f"{aws.prefix}-once").job_id
    worker = make_worker(app, settings, "w", rng=FixedRandom())
    with collect_journal() as journal, running(worker) as (runner,):
        journal.wait_for("job_failed", job_id=flaky_id, timeout=20)
        journal.wait_for("result_committed", job_id=once_id, timeout=10)
        runner.stop()

    rec = read_record(ddb_client, settings, flaky_id)
    assert rec.state == "failed"
    assert rec.error_code == "attempts_exhausted"
    assert rec.reason is not None and "attempts exhausted (3 of 3)" in rec.reason
    assert "upstream answered 503" in rec.reason
    assert (rec.attempt, rec.token) == (3, 3)
    assert calls["flaky"] == 3
    retries = journal.events("job_retry_scheduled", job_id=flaky_id)
    assert [(e["attempt"], e["delay"], e["error_code"]) for e in retries] == [
        (1, delays[0], "upstream_503"),
        (2, delays[1], "upstream_503"),
    ]
    assert all(e["visibility_set"] for e in retries)
    claims = journal.events("job_claimed", job_id=flaky_id)
    assert [e["attempt"] for e in claims] == [1, 2, 3]
    # The delay is real: the message stayed invisible for it.
    assert claims[1]["_mono"] - retries[0]["_mono"] >= delays[0] - 0.5
    assert claims[2]["_mono"] - retries[1]["_mono"] >= delays[1] - 0.5
    assert journal.events("result_committed", job_id=flaky_id) == []

    ok = read_record(ddb_client, settings, once_id)
    assert ok.state == "succeeded"
    assert (ok.attempt, ok.token) == (2, 2)
    assert result_of(ok) == {"attempt": 2}
    assert calls["once"] == 2
    assert [e["error_code"] for e in journal.events("job_retry_scheduled", job_id=once_id)] == [
        "timeout"
    ]


def test_permanent_error_fails_at_once_with_reason_and_code(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    # The subject is the failure, not a lapse: a 3 s lease lapsed beside two CPU hogs
    # before the fail was written, and its re-claim spent a second attempt.
    @app.job("pay", payload=Work, **ROOMY | {"max_attempts": 5})
    def pay(ctx: JobContext[Any], p: Work) -> None:
        raise PermanentError("card declined by issuer", code="card_declined")

    job_id = Producer(settings, app).submit("pay", Work(n=1), job_id=f"{aws.prefix}-pay").job_id
    worker = make_worker(app, settings, "w")
    with collect_journal() as journal, running(worker) as (runner,):
        journal.wait_for("job_failed", job_id=job_id)
        stats = runner.stop()

    rec = read_record(ddb_client, settings, job_id)
    assert rec.state == "failed"
    assert (rec.reason, rec.error_code) == ("card declined by issuer", "card_declined")
    assert (rec.attempt, rec.token) == (1, 1)
    assert journal.events("job_retry_scheduled", job_id=job_id) == []
    assert len(journal.events("job_claimed", job_id=job_id)) == 1
    (failed,) = journal.events("job_failed", job_id=job_id)
    assert (failed["error_code"], failed["attempt"]) == ("card_declined", 1)
    assert stats.failed == 1


# --------------------------------------------------------------------------- 5. poison


def test_poison_messages_never_stop_the_worker(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    settings, url, dlq = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("work", payload=Work, **FAST)
    def work(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        return {"n": p.n}

    blind = Producer(settings)  # no app: validates nothing, knows no classes
    raw_id = sqs_client.send_message(QueueUrl=url, MessageBody="this is {not json")["MessageId"]
    unknown_id = blind.submit("mystery", {"n": 1}, job_id=f"{aws.prefix}-unknown").job_id
    invalid_id = blind.submit("work", {"m": 1}, job_id=f"{aws.prefix}-invalid").job_id
    ghost_id = f"ghost-{aws.prefix}"
    sqs_client.send_message(
        QueueUrl=url, MessageBody=json.dumps({"v": 1, "job_id": ghost_id, "job_class": "work"})
    )
    good_id = Producer(settings, app).submit("work", Work(n=7), job_id=f"{aws.prefix}-ok").job_id

    # A class no worker knows goes to the DLQ at its first receive with this bound.
    worker = make_worker(app, settings, "w", concurrency=2, unknown_class_receives=1)
    with collect_journal() as journal, running(worker) as (runner,):
        journal.wait_for("message_poisoned", count=4, timeout=15)
        journal.wait_for("result_committed", job_id=good_id, timeout=10)
        assert runner.thread.is_alive(), "a poison message stopped the worker"
        stats = runner.stop()

    poisoned = journal.events("message_poisoned")
    assert len(poisoned) == 4 and all(e["reason"] for e in poisoned)
    # (a) not JSON: copied to the DLQ, deleted from the queue.
    (raw,) = [e for e in poisoned if e.get("message_id") == raw_id]
    assert raw["reason"] == "message body is not JSON" and raw["moved_to_dlq"] is True
    # (b) unknown class: never claimed (a newer worker may own it); to the DLQ with
    # the reason, the job parked first (undeliverable) so its record says where it is.
    (unknown,) = job_events(poisoned, unknown_id)
    assert unknown["moved_to_dlq"] is True and "'mystery'" in unknown["reason"]
    rec = read_record(ddb_client, settings, unknown_id)
    assert (rec.state, rec.token, rec.error_code) == ("parked", 1, "undeliverable")
    # (c) invalid payload: the record ends failed with the code.
    (invalid,) = job_events(poisoned, invalid_id)
    assert invalid["error_code"] == "invalid_payload"
    assert "'n'" in invalid["reason"] and "Field required" in invalid["reason"]
    rec = read_record(ddb_client, settings, invalid_id)
    assert (rec.state, rec.error_code) == ("failed", "invalid_payload")
    assert rec.reason == invalid["reason"]
    # (d) a message naming no record.
    (ghost,) = job_events(poisoned, ghost_id)
    assert ghost["reason"] == "no job record for the message"
    # The normal job went through; nothing is left in the queue; one message in the DLQ.
    good = read_record(ddb_client, settings, good_id)
    assert (good.state, good.token) == ("succeeded", 1)
    assert result_of(good) == {"n": 7}
    assert stats.poisoned == 4
    wait_until(lambda: queue_depth(sqs_client, url) == 0, 3, "an empty queue")
    assert queue_depth(sqs_client, dlq) == 2
    dead = drain(sqs_client, dlq, timeout=3, want=2)
    reasons = sorted(m["MessageAttributes"]["sqs_lease_reason"]["StringValue"] for m in dead)
    assert reasons[0] == "message body is not JSON" and "'mystery'" in reasons[1]


def test_poison_copy_in_the_dlq_keeps_the_original_body(
    aws: AwsTestEnv, sqs_client: SQSClient
) -> None:
    settings, url, dlq = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("work", payload=Work, **FAST)
    def work(ctx: JobContext[Any], p: Work) -> None:
        return None

    body = f"<xml>not json {uuid.uuid4().hex}</xml>"
    sqs_client.send_message(QueueUrl=url, MessageBody=body)
    worker = make_worker(app, settings, "w")
    with collect_journal() as journal, running(worker) as (runner,):
        journal.wait_for("message_poisoned")
        runner.stop()
    (dead,) = drain(sqs_client, dlq, timeout=3, want=1)
    assert dead["Body"] == body


# --------------------------------------------------------------------------- 6. cancel


@pytest.mark.parametrize("ending", ["return", "check"])
def test_cancel_fences_the_running_owner_out(
    ending: str, aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    seen: dict[str, bool] = {}

    # The cancel reaches the handler at a beat; a lease no busy machine lapses keeps a
    # late beat from ending the attempt some other way first (the subject is the cancel).
    @app.job("long", payload=Work, **ROOMY)
    def long(ctx: JobContext[Any], p: Work) -> dict[str, bool]:
        deadline = time.monotonic() + HANG_GUARD
        try:
            while not ctx.wait(0.1) and time.monotonic() < deadline:
                pass  # the wait raises JobCancelled once the heartbeat sees the cancel
        except JobCancelled:
            seen["cancelled"] = ctx.cancelled
            if ending == "check":
                raise
        return {"finished": True}  # returned after the stop: discarded, never committed

    producer = Producer(settings, app)
    job_id = producer.submit("long", Work(n=1), job_id=f"{aws.prefix}-cancel").job_id
    worker = make_worker(app, settings, "w")
    with collect_journal() as journal, running(worker) as (runner,):
        journal.wait_for("job_claimed", job_id=job_id)
        view = producer.cancel(job_id, "user closed the session")
        assert (view.state, view.token, view.error_code) == (JobState.CANCELLED, 2, "cancelled")
        end = "result_discarded" if ending == "return" else "job_abandoned"
        (last,) = journal.wait_for(end, job_id=job_id, timeout=10)
        runner.stop()

    assert seen == {"cancelled": True}
    (lost,) = journal.events("heartbeat_lost", job_id=job_id)
    assert (lost["token"], lost["cancelled"]) == (1, True)
    assert (last["token"], last["stop"]) == (1, "cancelled")
    if ending == "return":
        assert last["error_code"] == "result_discarded"
    else:
        assert last["error_code"] == "JobCancelled"
    assert journal.events("result_committed", job_id=job_id) == []
    rec = read_record(ddb_client, settings, job_id)
    assert (rec.state, rec.error_code, rec.token) == ("cancelled", "cancelled", 2)
    assert rec.reason == "cancelled: user closed the session"
    assert rec.result is None


# --------------------------------------------------------------------------- 7. watchdog


@pytest.mark.parametrize(
    ("why", "policy"),
    [
        ("stage_budget_exceeded", {"stage_budget_seconds": 5.5, "effect_timeout_seconds": 0.5}),
        ("no_progress", {"progress_timeout_seconds": 1.5}),
    ],
)
def test_watchdog_drops_an_overrunning_attempt_and_discards_its_late_result(
    why: str, policy: JobPolicy, aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    saw_cancel: dict[int, bool] = {}

    @app.job(
        "stuck", payload=Work, **FAST | {"lease_seconds": 4, "backoff_base_seconds": 0.0} | policy
    )
    def stuck(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        if ctx.attempt == 1:
            time.sleep(2.8)  # a blocked tool: no progress, deaf to cancellation
            saw_cancel[1] = ctx.cancelled
        return {"attempt": ctx.attempt}

    job_id = Producer(settings, app).submit("stuck", Work(n=1), job_id=f"{aws.prefix}-st").job_id
    worker = make_worker(app, settings, "w", concurrency=2)
    with collect_journal() as journal, running(worker) as (runner,):
        journal.wait_for("result_discarded", job_id=job_id, token=1, timeout=15)
        journal.wait_for("result_committed", job_id=job_id, timeout=10)
        runner.stop()

    (dropped,) = journal.events("lease_dropped", job_id=job_id)
    assert (dropped["reason"], dropped["token"]) == (why, 1)
    (retry,) = journal.events("job_retry_scheduled", job_id=job_id)
    assert (retry["token"], retry["error_code"], retry["reason"]) == (1, why, f"watchdog: {why}")
    # Not kept alive: no extension of token 1 after the drop.
    assert all(
        b["_mono"] < dropped["_mono"]
        for b in journal.events("heartbeat_ok", job_id=job_id, token=1)
    )
    assert saw_cancel == {1: True}
    committed = journal.events("result_committed", job_id=job_id)
    assert [e["token"] for e in committed] == [2]
    (discarded,) = journal.events("result_discarded", job_id=job_id)
    # Let go by the watchdog, then superseded by this worker's own claim of token 2.
    assert discarded["token"] == 1 and discarded["stop"] in ("let_go", "lease_lost")
    assert journal.events("result_rejected", job_id=job_id) == []  # never even tried
    rec = read_record(ddb_client, settings, job_id)
    assert (rec.state, rec.token, rec.attempt) == ("succeeded", 2, 2)
    assert result_of(rec) == {"attempt": 2}


def test_reclaim_by_the_same_worker_keeps_the_new_attempt_heartbeated(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    done = threading.Event()  # set by the test once the job is terminal

    @app.job(
        "stuck",
        payload=Work,
        **FAST | {"progress_timeout_seconds": 1.5, "backoff_base_seconds": 0.0},
    )
    def stuck(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        if ctx.attempt == 1:
            time.sleep(2.8)  # dropped by the watchdog at ~1.5 s, returns late
        elif ctx.attempt == 2:
            deadline = time.monotonic() + 6.0  # two leases, with progress
            while time.monotonic() < deadline and not ctx.cancelled and not done.is_set():
                ctx.progress()
                ctx.wait(0.2)
        return {"attempt": ctx.attempt}

    job_id = Producer(settings, app).submit("stuck", Work(n=1), job_id=f"{aws.prefix}-rc").job_id
    worker = make_worker(app, settings, "w", concurrency=2, shutdown_grace=0.5)
    with collect_journal() as journal, running(worker) as (runner,):
        wait_until(
            lambda: read_view(ddb_client, settings, job_id).state.terminal, 20, "a terminal job"
        )
        done.set()
        runner.stop()
    claims = journal.events("job_claimed", job_id=job_id)
    assert [e["token"] for e in claims] == [1, 2]
    rec = read_record(ddb_client, settings, job_id)
    assert (rec.state, rec.token) == ("succeeded", 2)
    assert result_of(rec) == {"attempt": 2}


# --------------------------------------------------------------------------- 8. no payload in logs


def test_the_logs_never_contain_the_payload(
    aws: AwsTestEnv, ddb_client: DynamoDBClient, capfd: pytest.CaptureFixture[str]
) -> None:
    secret = f"SECRET-{uuid.uuid4()}"
    root = logging.getLogger()
    journal_logger = logging.getLogger("sqs_lease.journal")
    everything, journal_text = TextCapture(), TextCapture()
    # botocore's own DEBUG wire trace prints every request body by design (an SDK
    # opt-in, not this package's logging); keep the SDK at WARNING, all else at DEBUG.
    sdk = {n: logging.getLogger(n).level for n in ("botocore", "boto3", "urllib3", "s3transfer")}
    old_root = root.level
    root.setLevel(logging.DEBUG)
    root.addHandler(everything)
    journal_logger.addHandler(journal_text)
    for name in sdk:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
        app = App()

        @app.job("leaky", payload=Work, **FAST | {"backoff_base_seconds": 0.0})
        def leaky(ctx: JobContext[Any], p: Work) -> dict[str, str]:
            if ctx.attempt == 1:
                raise ValueError(f"could not parse note {p.note!r}")
            return {"echo": p.note}

        job_id = (
            Producer(settings, app)
            .submit("leaky", Work(n=1, note=secret), job_id=f"{aws.prefix}-leak")
            .job_id
        )
        worker = make_worker(app, settings, "w")
        with collect_journal() as journal, running(worker) as (runner,):
            journal.wait_for("result_committed", job_id=job_id, timeout=15)
            runner.stop()
    finally:
        root.removeHandler(everything)
        journal_logger.removeHandler(journal_text)
        root.setLevel(old_root)
        for name, level in sdk.items():
            logging.getLogger(name).setLevel(level)

    rec = read_record(ddb_client, settings, job_id)
    assert result_of(rec) == {"echo": secret}  # the secret did flow through the job
    (retry,) = journal.events("job_retry_scheduled", job_id=job_id)
    # The exception's type and message are kept; the payload's text is taken out.
    assert (retry["reason"], retry["error_code"]) == (
        "ValueError: could not parse note '<payload>'",
        "ValueError",
    )
    assert "job_claimed" in journal_text.text() and "result_committed" in everything.text()
    assert secret not in everything.text()
    assert secret not in journal_text.text()
    assert all(secret not in json.dumps(e) for e in journal.events())
    out, err = capfd.readouterr()
    assert secret not in out and secret not in err


# --------------------------------------------------------------------------- 9. shutdown


def test_stop_releases_running_jobs_at_once(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    started = threading.Semaphore(0)
    lease = 120  # long, so "visible before the lease" cannot be the lease lapsing

    @app.job(
        "slow",
        payload=Work,
        lease_seconds=lease,
        heartbeat_seconds=1.0,
        jitter_seconds=1.0,
        missed_heartbeats=2,
    )
    def slow(ctx: JobContext[Any], p: Work) -> dict[str, bool]:
        started.release()
        deadline = time.monotonic() + 30
        while not ctx.wait(0.1) and time.monotonic() < deadline:
            pass
        ctx.check()  # told to stop: take no further step
        return {"finished": True}

    producer = Producer(settings, app)
    ids = [producer.submit("slow", Work(n=i), job_id=f"{aws.prefix}-s{i}").job_id for i in (1, 2)]
    worker = make_worker(app, settings, "w", shutdown_grace=1.0)
    with collect_journal() as journal, running(worker) as (runner,):
        for _ in ids:
            assert started.acquire(timeout=HANG_GUARD)
        t0 = time.monotonic()
        stats = runner.stop(timeout=10)
        stopped_in = time.monotonic() - t0
    assert stopped_in < lease  # released, not held until the lease ran out
    assert stats.released == 2
    released = journal.events("messages_released")
    assert sum(e["count"] for e in released) == 2
    assert all("shutdown" in e["reason"] for e in released)
    for job_id in ids:
        rec = read_record(ddb_client, settings, job_id)
        assert (rec.state, rec.token, rec.error_code) == ("queued", 1, "released")
        assert rec.attempt == 0  # the worker stopped it: the attempt is given back
        assert rec.reason is not None and "shutdown" in rec.reason
        assert journal.events("result_committed", job_id=job_id) == []
    got = drain(sqs_client, url, timeout=lease / 2, want=2)  # returns once both came
    assert sorted(json.loads(m["Body"])["job_id"] for m in got) == sorted(ids)


_WORKER_SCRIPT = """
import time

from pydantic import BaseModel

from sqs_lease import App, Settings, SHELL
from sqs_lease._journal import configure_stderr


class Work(BaseModel):
    n: int
    note: str = ""


app = App()


@app.job("slow", payload=Work, lease_seconds=20, heartbeat_seconds=1.0,
         jitter_seconds=1.0, missed_heartbeats=2)
def slow(ctx, p):
    deadline = time.monotonic() + 30
    while not ctx.wait(0.1) and time.monotonic() < deadline:
        pass
    return {"cancelled": ctx.cancelled}


configure_stderr()
worker = SHELL(app, Settings.from_env(), receive_wait=1, shutdown_grace=GRACE)
worker.install_signal_handlers()
worker.run()
"""


def test_sigterm_stops_a_worker_process_with_a_decision_for_its_job(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient, tmp_path: Path
) -> None:
    grace = 2.0
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    script = tmp_path / "worker_main.py"
    script.write_text(
        textwrap.dedent(_WORKER_SCRIPT)
        .replace("GRACE", repr(grace))
        .replace("SHELL", Shell.__name__)
    )
    job_id = Producer(settings).submit("slow", {"n": 1}, job_id=f"{aws.prefix}-sig").job_id
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": aws.endpoint_url,
        "SQS_LEASE_PREFIX": aws.prefix,
        "PYTHONUNBUFFERED": "1",
    }
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(script)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_until(
            lambda: read_view(ddb_client, settings, job_id).state is JobState.RUNNING,
            20,
            "the worker process to claim the job",
        )
        time.sleep(0.5)  # the handler is inside its tool call
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)  # a hang guard
        exited_in = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    lines = log_path.read_text().splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    names = [e.get("event") for e in events]
    assert code == 0, lines[-20:]
    # The handler runs 30 s unless told to stop: the worker did not wait for it.
    assert exited_in < 30, f"exit took {exited_in:.1f} s"
    assert any(e.get("signal") == "SIGTERM" for e in events if e.get("event") == "worker_stopping")
    assert "worker_stopped" in names
    view = read_view(ddb_client, settings, job_id)
    assert view.token == 1
    # Released (queued, message visible at once, the attempt given back); never the
    # handler's partial work committed as success, never left running undecided.
    assert (view.state, view.attempt) == (JobState.QUEUED, 0), view
    assert view.reason is not None and "shutdown" in view.reason
    assert "result_committed" not in names
    got = drain(sqs_client, url, timeout=3, want=1)
    assert [json.loads(m["Body"])["job_id"] for m in got] == [job_id]


# --------------------------------------------------------------------------- 10/11. timing


class SneakyPayload(BaseModel):
    lease_seconds: int
    heartbeat_seconds: float = 0.1


def test_a_payload_cannot_set_its_own_lease(aws: AwsTestEnv, ddb_client: DynamoDBClient) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("sneaky", payload=SneakyPayload, **ROOMY)
    def sneaky(ctx: JobContext[Any], p: SneakyPayload) -> dict[str, int]:
        ctx.wait(2.0)  # twice the payload's "lease"
        return {"class_lease": ctx.job_class.lease_seconds}

    job_id = (
        Producer(settings, app)
        .submit("sneaky", SneakyPayload(lease_seconds=1), job_id=f"{aws.prefix}-sn")
        .job_id
    )
    worker = make_worker(app, settings, "w", concurrency=4)
    with collect_journal() as journal, running(worker) as (runner,):
        journal.wait_for("job_claimed", job_id=job_id)
        # The advisory lease in the record (for people) is the class's too.
        running_rec = read_record(ddb_client, settings, job_id)
        journal.wait_for("result_committed", job_id=job_id, timeout=15)
        runner.stop()
    (claimed,) = journal.events("job_claimed", job_id=job_id)
    lease = ROOMY["lease_seconds"]
    assert claimed["lease_seconds"] == lease
    assert running_rec.state == "running"
    assert running_rec.lease_deadline is not None
    # Written by the claim (at its updated_at), which writes no last_heartbeat.
    assert running_rec.lease_deadline - running_rec.updated_at == pytest.approx(lease, abs=0.01)
    rec = read_record(ddb_client, settings, job_id)
    assert (rec.state, rec.token, rec.attempt) == ("succeeded", 1, 1)
    assert result_of(rec) == {"class_lease": lease}


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            {
                "lease_seconds": 3,
                "heartbeat_seconds": 1,
                "jitter_seconds": 1,
                "missed_heartbeats": 2,
            },
            r"lease_seconds=3 must exceed .* = 2 x 1 \+ 1 = 3",
        ),
        (
            {
                "lease_seconds": 4,
                "heartbeat_seconds": 2.5,
                "jitter_seconds": 0,
                "missed_heartbeats": 1,
            },
            r"heartbeat_seconds=2\.5 > lease_seconds/2=2",
        ),
        (
            {"lease_seconds": 50_000, "heartbeat_seconds": 60, "jitter_seconds": 5},
            r"lease_seconds=50000 exceeds SQS's 43200",
        ),
    ],
    ids=["lease-vs-missed-beats", "heartbeat-over-half-lease", "over-12-hours"],
)
def test_job_class_breaking_a_timing_rule_is_refused(policy: JobPolicy, message: str) -> None:
    with pytest.raises(JobClassError, match=message):
        JobClass(name="bad", payload_model=Work, **policy)
    app = App()
    with pytest.raises(JobClassError, match=message):
        app.job("bad", payload=Work, **policy)
    assert app.classes == {}


def test_job_class_at_the_timing_limits_is_accepted() -> None:
    # L - H = 2.5 s left at every beat, just above H + J = 2.4 s (and 4 > 1 x 1.5 + 0.9)
    jc = JobClass(
        name="edge",
        payload_model=Work,
        lease_seconds=4,
        heartbeat_seconds=1.5,
        jitter_seconds=0.9,
        missed_heartbeats=1,
    )
    assert jc.lease_seconds == 4


def test_a_job_class_that_extends_with_less_than_a_beat_plus_jitter_left_is_refused() -> None:
    # Passes L > R x H + J (3 > 1.9) but each beat extends with 1.5 s left: one
    # missed beat and the lease lapses. The error names the numbers and the fix.
    policy: JobPolicy = {
        "lease_seconds": 3,
        "heartbeat_seconds": 1.5,
        "jitter_seconds": 0.4,
        "missed_heartbeats": 1,
    }
    with pytest.raises(JobClassError, match=r"1\.5 \+ 0\.4 = 1\.9 s.*at least 4"):
        JobClass(name="late", payload_model=Work, **policy)
    app = App()
    with pytest.raises(JobClassError, match=r"lease_seconds - heartbeat_seconds = 3 - 1\.5"):
        app.job("late", payload=Work, **policy)
    assert app.classes == {}


# --------------------------------------------------------------------------- 12. duplicates


def test_idle_exit_waits_for_a_retry_the_worker_just_scheduled(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("slowfail", payload=Work, **FAST | {"backoff_base_seconds": 3.0})
    def slowfail(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        if ctx.attempt == 1:
            ctx.wait(2.5)
            raise TransientError("try again", code="again")
        return {"attempt": ctx.attempt}

    job_id = Producer(settings, app).submit("slowfail", Work(n=1), job_id=f"{aws.prefix}-ie").job_id
    delay = backoff_delay(1, 3.0, FAST.get("backoff_max_seconds", 300.0), JITTER)
    assert delay >= 2  # the retry comes back well after the worker's idle check
    worker = make_worker(app, settings, "w", rng=FixedRandom())
    with collect_journal() as journal:
        worker.run(idle_exit=4.0)
    (retry,) = journal.events("job_retry_scheduled", job_id=job_id)
    assert retry["delay"] == delay
    assert read_view(ddb_client, settings, job_id).state is JobState.SUCCEEDED
