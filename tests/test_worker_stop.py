"""A handler told to stop does not commit partial work as success (real worker, real moto).

After a stop request (the worker shuts down, the lease is lost, the job is
cancelled, the watchdog stops the attempt) the context's waits and checks
raise the matching ``LeaseError``, and a result the handler returns anyway is
not committed: at shutdown the job goes back to the queue without spending an
attempt; otherwise the result is discarded (``result_discarded``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import (
    FAST,
    HANG_GUARD,
    ROOMY,
    collect_journal,
    drain,
    prepare,
    read_record,
    read_view,
    result_of,
    running,
    use_shell,
    wait_until,
)

from sqs_lease import (
    App,
    AttemptTimedOut,
    CheckAnswer,
    EffectCall,
    IntentView,
    JobCancelled,
    JobContext,
    JobState,
    LeaseError,
    Producer,
    ToolResult,
    Verdict,
    Worker,
    WorkerShuttingDown,
)

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

pytestmark = pytest.mark.integration

Shell: Any = Worker  # each worker shell in turn (use_shell)
shell = use_shell(__name__)


class Work(BaseModel):
    n: int


def _worker(app: App, settings: Any, name: str, **kw: Any) -> Any:
    kw.setdefault("receive_wait", 1)
    return Shell(app, settings, worker_id=f"{name}-{settings.prefix}", **kw)


def _looping_handler(app: App, seen: list[str], started: threading.Event, **policy: Any) -> None:
    """The documented wait loop, written as a handler that returns its partial work
    whether the loop ended by ``wait`` returning True (the old behaviour) or raising."""

    @app.job("loop", payload=Work, **{**ROOMY, **policy})
    def loop(ctx: JobContext[Any], p: Work) -> dict[str, Any]:
        done = 0
        started.set()
        try:
            while done < 100_000:  # bounded: a hang guard, never reached
                if ctx.wait(0.2):
                    seen.append("wait returned True")
                    break
                done += 1
        except LeaseError as exc:
            seen.append(type(exc).__name__)
        return {"partial": done}


def test_a_partial_result_returned_at_shutdown_is_not_committed_and_spends_no_attempt(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    seen: list[str] = []
    started = threading.Event()
    _looping_handler(app, seen, started)
    job_id = Producer(settings, app).submit("loop", Work(n=1), job_id=f"{aws.prefix}-sd").job_id
    # A grace far longer than the test: the stop must reach the handler at once,
    # not when the grace runs out.
    worker = _worker(app, settings, "w", shutdown_grace=60.0)
    with collect_journal() as journal, running(worker) as (runner,):
        assert started.wait(HANG_GUARD)
        journal.wait_for("job_claimed", job_id=job_id)
        stats = runner.stop(timeout=60)

    assert seen == ["WorkerShuttingDown"]
    rec = read_record(ddb_client, settings, job_id)
    assert rec.state != "succeeded"
    assert (rec.state, rec.token, rec.error_code) == ("queued", 1, "released")
    assert rec.attempt == 0  # the worker stopped it, not the job: the attempt is given back
    assert rec.result is None
    assert journal.events("result_committed", job_id=job_id) == []
    assert stats.released == 1 and stats.committed == 0
    (released,) = journal.events("messages_released")
    assert released["count"] == 1 and "shutdown" in released["reason"]
    got = drain(sqs_client, url, timeout=5, want=1)  # visible again at once
    assert [json.loads(m["Body"])["job_id"] for m in got] == [job_id]


def test_a_released_job_runs_again_from_its_first_attempt(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    attempts: list[tuple[int, int]] = []
    first = threading.Event()

    @app.job("once", payload=Work, **ROOMY | {"max_attempts": 1})
    def once(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        attempts.append((ctx.attempt, ctx.token))
        if ctx.token == 1:
            first.set()
            while True:
                ctx.wait(0.2)  # raises WorkerShuttingDown at the stop
        return {"attempt": ctx.attempt}

    job_id = Producer(settings, app).submit("once", Work(n=1), job_id=f"{aws.prefix}-ag").job_id
    with running(_worker(app, settings, "a", shutdown_grace=60.0)) as (runner,):
        assert first.wait(HANG_GUARD)
        runner.stop(timeout=60)
    assert read_view(ddb_client, settings, job_id).state is JobState.QUEUED
    # max_attempts=1: had the shutdown spent the only attempt, the job would fail now.
    with running(_worker(app, settings, "b")) as (runner,):
        wait_until(
            lambda: read_view(ddb_client, settings, job_id).state.terminal, 20, "a terminal job"
        )
        runner.stop()
    rec = read_record(ddb_client, settings, job_id)
    assert (rec.state, rec.attempt, rec.token) == ("succeeded", 1, 2)
    assert attempts == [(1, 1), (1, 2)]
    assert result_of(rec) == {"attempt": 1}


def test_a_partial_result_returned_after_the_message_was_lost_is_discarded(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    # SQS took the message away (purged) while the record still shows our token: a
    # commit would land. The heartbeat sees the lease lost; the handler's wait
    # raises; what it returns anyway must not become the job's result.
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    seen: list[str] = []
    started = threading.Event()
    _looping_handler(app, seen, started)
    job_id = Producer(settings, app).submit("loop", Work(n=1), job_id=f"{aws.prefix}-lo").job_id
    worker = _worker(app, settings, "w")
    with collect_journal() as journal, running(worker) as (runner,):
        assert started.wait(HANG_GUARD)
        journal.wait_for("job_claimed", job_id=job_id)
        sqs_client.purge_queue(QueueUrl=url)
        (discarded,) = journal.wait_for("result_discarded", job_id=job_id, timeout=20)
        runner.stop()

    assert seen == ["LeaseLost"]
    assert (discarded["token"], discarded["stop"]) == (1, "lease_lost")
    assert journal.events("heartbeat_lost", job_id=job_id)
    assert journal.events("result_committed", job_id=job_id) == []
    rec = read_record(ddb_client, settings, job_id)
    assert rec.state != "succeeded" and rec.result is None


def test_a_cancelled_jobs_handler_gets_job_cancelled_and_its_result_is_discarded(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    seen: list[str] = []
    started = threading.Event()
    _looping_handler(app, seen, started)
    producer = Producer(settings, app)
    job_id = producer.submit("loop", Work(n=1), job_id=f"{aws.prefix}-ca").job_id
    with collect_journal() as journal, running(_worker(app, settings, "w")) as (runner,):
        assert started.wait(HANG_GUARD)
        journal.wait_for("job_claimed", job_id=job_id)
        producer.cancel(job_id, "the session ended")
        (discarded,) = journal.wait_for("result_discarded", job_id=job_id, timeout=20)
        runner.stop()
    assert seen == [JobCancelled.__name__]
    assert discarded["stop"] == "cancelled"
    assert journal.events("result_committed", job_id=job_id) == []
    rec = read_record(ddb_client, settings, job_id)
    assert (rec.state, rec.error_code, rec.token) == ("cancelled", "cancelled", 2)


def test_the_watchdog_stop_raises_attempt_timed_out_in_the_handlers_wait(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    seen: list[str] = []
    started = threading.Event()
    # The loop never reports progress: the no-progress timeout stops it.
    _looping_handler(app, seen, started, progress_timeout_seconds=1.0, max_attempts=1)
    job_id = Producer(settings, app).submit("loop", Work(n=1), job_id=f"{aws.prefix}-wd").job_id
    with collect_journal() as journal, running(_worker(app, settings, "w")) as (runner,):
        (dropped,) = journal.wait_for("lease_dropped", job_id=job_id, timeout=20)
        journal.wait_for("result_discarded", job_id=job_id, timeout=20)
        runner.stop()
    assert dropped["reason"] == "no_progress"
    assert seen == [AttemptTimedOut.__name__]
    assert journal.events("result_committed", job_id=job_id) == []
    assert read_view(ddb_client, settings, job_id).state is JobState.FAILED  # attempts spent


class Charge(BaseModel):
    invoice: str


def test_an_effect_call_past_its_timeout_is_outcome_unknown_and_reconciled_next_attempt(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    """The per-call timeout: the call gets it, and the watchdog stops an attempt whose
    call runs past it (plus the margin). Whether that call applied is unknown, so the
    next attempt asks the target's check instead of calling again."""
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    release_call = threading.Event()
    timeouts: list[float] = []
    calls: list[int] = []
    checks: list[str] = []

    def lookup(view: IntentView) -> CheckAnswer:
        checks.append(view.key)
        return CheckAnswer(Verdict.CONFIRMED, external_id="ch_1", response={"id": "ch_1"})

    app.target("payments", check=lookup)

    def capture(call: EffectCall) -> ToolResult:
        timeouts.append(call.timeout)
        calls.append(call.token)
        # The request was sent and the target applied it; the answer never comes in time.
        assert release_call.wait(HANG_GUARD)
        return ToolResult({"id": "ch_1"}, "ch_1")

    @app.job(
        "pay",
        payload=Charge,
        **FAST | {"lease_seconds": 4, "backoff_base_seconds": 0.0, "effect_timeout_seconds": 0.5},
    )
    def pay(ctx: JobContext[Any], p: Charge) -> dict[str, Any]:
        out = ctx.effect("capture", "payments", {"invoice": p.invoice}, capture)
        return {"charge": out.external_id, "reconciled": out.reconciled, "token": ctx.token}

    job_id = Producer(settings, app).submit("pay", Charge(invoice="i-1"), job_id=f"{aws.prefix}-e")
    jid = job_id.job_id
    worker = _worker(app, settings, "w", concurrency=2)
    with collect_journal() as journal, running(worker) as (runner,):
        (dropped,) = journal.wait_for("lease_dropped", job_id=jid, timeout=30)
        journal.wait_for("result_committed", job_id=jid, timeout=30)
        release_call.set()  # the first call's late answer; its intent is confirmed already
        journal.wait_for("result_discarded", job_id=jid, timeout=30)
        runner.stop()
    assert (dropped["reason"], dropped["token"]) == ("effect_timeout", 1)
    assert timeouts == [0.5]  # the call got its timeout; the target was called once
    assert calls == [1]
    assert len(checks) == 1  # attempt 2 asked the check, it did not call again
    rec = read_record(ddb_client, settings, jid)
    assert rec.state == "succeeded"
    assert result_of(rec) == {"charge": "ch_1", "reconciled": True, "token": 2}
    (retry,) = journal.events("job_retry_scheduled", job_id=jid)
    assert (retry["token"], retry["error_code"]) == (1, "effect_timeout")


def test_a_wait_after_the_stop_raises_at_once_and_cancelled_reads_true(
    aws: AwsTestEnv,
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    seen: dict[str, Any] = {}
    started = threading.Event()

    @app.job("twice", payload=Work, **ROOMY)
    def twice(ctx: JobContext[Any], p: Work) -> None:
        started.set()
        with pytest.raises(WorkerShuttingDown):
            while True:
                ctx.wait(0.2)
        seen["cancelled"] = ctx.cancelled
        with pytest.raises(WorkerShuttingDown):
            ctx.wait(600)  # already stopped: raises without sleeping (stop's join guards)
        with pytest.raises(WorkerShuttingDown):
            ctx.check()
        with pytest.raises(WorkerShuttingDown):
            ctx.effect("x", "t", {}, lambda c: None)  # no effect starts after a stop
        seen["done"] = True

    app.target("t")
    Producer(settings, app).submit("twice", Work(n=1), job_id=f"{aws.prefix}-tw")
    with running(_worker(app, settings, "w", shutdown_grace=60.0)) as (runner,):
        assert started.wait(HANG_GUARD)
        runner.stop(timeout=60)
    assert seen == {"cancelled": True, "done": True}


def test_a_worker_done_after_max_messages_lets_its_running_handlers_finish(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    # Reaching max_messages ends the receive loop; it is not a stop request: the
    # handler still running gets its grace to finish and its result is committed.
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    first_running = threading.Event()
    finish = threading.Event()
    seen: list[str] = []

    @app.job("drain", payload=Work, **ROOMY)
    def drain_job(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        if p.n == 1:
            first_running.set()
            try:
                while not finish.is_set():
                    ctx.wait(0.1)
            except LeaseError as exc:
                seen.append(type(exc).__name__)
                raise
        return {"n": p.n}

    producer = Producer(settings, app)
    first = producer.submit("drain", Work(n=1), job_id=f"{aws.prefix}-d1").job_id
    worker = _worker(app, settings, "w", concurrency=2, shutdown_grace=60.0)
    with collect_journal() as journal, running(worker, max_messages=2) as (runner,):
        assert first_running.wait(HANG_GUARD)
        second = producer.submit("drain", Work(n=2), job_id=f"{aws.prefix}-d2").job_id
        journal.wait_for("job_claimed", job_id=second, timeout=20)  # the loop is done now
        journal.wait_for("result_committed", job_id=second, timeout=20)
        finish.set()
        runner.join(HANG_GUARD)
    assert seen == []
    for job_id, n in ((first, 1), (second, 2)):
        rec = read_record(ddb_client, settings, job_id)
        assert (rec.state, rec.attempt) == ("succeeded", 1)
        assert result_of(rec) == {"n": n}


def test_releases_of_handlers_that_stopped_within_the_grace_finish_and_count_before_run_returns(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient, monkeypatch: Any
) -> None:
    # Every handler stops at once, but handing its job back (visibility 0) answers
    # later than the grace: the worker must not return (or cancel the hand-back)
    # while an attempt is still writing its own end; WorkerStats.released counts them.
    from sqs_lease._aio import AsyncDriver
    from sqs_lease._aws import SyncDriver

    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    held = threading.Semaphore(0)

    @app.job("hold", payload=Work, **ROOMY)
    def hold(ctx: JobContext[Any], p: Work) -> None:
        held.release()
        while True:
            ctx.wait(0.2)  # raises WorkerShuttingDown at the stop

    def slow_release(call: Any) -> bool:
        entries = call.params.get("Entries", [])
        return call.op == "ChangeMessageVisibilityBatch" and all(
            e["VisibilityTimeout"] == 0 for e in entries
        )

    sync_execute, async_execute = SyncDriver.execute, AsyncDriver.execute

    def execute(self: SyncDriver, call: Any) -> Any:
        if slow_release(call):
            time.sleep(1.5)
        return sync_execute(self, call)

    async def aexecute(self: AsyncDriver, call: Any) -> Any:
        if slow_release(call):
            await asyncio.sleep(1.5)
        return await async_execute(self, call)

    monkeypatch.setattr(SyncDriver, "execute", execute)
    monkeypatch.setattr(AsyncDriver, "execute", aexecute)
    jobs = 4
    producer = Producer(settings, app)
    ids = [
        producer.submit("hold", Work(n=i), job_id=f"{aws.prefix}-r{i}").job_id for i in range(jobs)
    ]
    worker = _worker(app, settings, "w", concurrency=jobs, shutdown_grace=0.3)
    with collect_journal() as journal, running(worker) as (runner,):
        for _ in range(jobs):
            assert held.acquire(timeout=HANG_GUARD)
        stats = runner.stop(timeout=60)
        names = journal.names()

    assert stats.released == jobs
    assert names.count("messages_released") == jobs
    assert names.index("worker_stopped") > max(
        i for i, n in enumerate(names) if n == "messages_released"
    )
    for job_id in ids:
        rec = read_record(ddb_client, settings, job_id)
        assert (rec.state, rec.attempt, rec.error_code) == ("queued", 0, "released")
    got = drain(sqs_client, url, timeout=5, want=jobs)  # visible again at once
    assert len(got) == jobs
