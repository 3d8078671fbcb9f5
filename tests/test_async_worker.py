"""The async worker's own behaviour against a real moto server over HTTP: async
handlers and their awaitable context, plain handlers in its thread pool, and a
blocked event loop (which must never pass for a live worker).

The protocol behaviour both shells share runs against both in the parametrised
integration tests (test_worker*.py, test_intents.py, test_proof.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import (
    FAST,
    ROOMY,
    collect_journal,
    prepare,
    queue_depth,
    read_record,
    read_view,
    result_of,
    running,
    wait_until,
)

from sqs_lease import (
    App,
    AsyncJobContext,
    AsyncWorker,
    AttemptTimedOut,
    ConfigError,
    EffectCall,
    JobContext,
    JobPolicy,
    JobState,
    NextStage,
    Producer,
    Settings,
    ToolResult,
    Worker,
)
from sqs_lease._aio import AsyncDriver
from sqs_lease._core.calls import Call, Outcome

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

pytestmark = pytest.mark.integration


class Work(BaseModel):
    n: int


def make_worker(app: App, settings: Settings, name: str, **kw: Any) -> AsyncWorker:
    kw.setdefault("receive_wait", 1)
    kw.setdefault("shutdown_grace", 5.0)
    return AsyncWorker(app, settings, worker_id=f"{name}-{settings.prefix}", **kw)


def test_async_handlers_run_on_the_loop_and_plain_handlers_in_the_thread_pool(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    threads: dict[str, str] = {}

    # ROOMY: the claims are counted exactly, and a busy machine lapses a short lease
    # (claimed 4 on a loaded one); the await outlasts the first heartbeat instead.
    @app.job("aio", payload=Work, **ROOMY)
    async def aio(ctx: AsyncJobContext[Work], p: Work) -> dict[str, Any]:
        threads["aio"] = threading.current_thread().name
        await ctx.check()
        # Past the first heartbeat (5 s, 1 s of jitter): the heartbeat task extends
        # the lease while the handler awaits on the loop.
        assert await ctx.wait(7.0) is False
        return {"n": p.n, "ctx": type(ctx).__name__}

    @app.job("plain", payload=Work, **ROOMY)
    def plain(ctx: JobContext[Work], p: Work) -> dict[str, Any]:
        threads["plain"] = threading.current_thread().name
        ctx.check()
        ctx.wait(0.2)
        return {"n": p.n, "ctx": type(ctx).__name__}

    producer = Producer(settings, app)
    a = producer.submit("aio", Work(n=1), job_id=f"{aws.prefix}-a").job_id
    b = producer.submit("plain", Work(n=2), job_id=f"{aws.prefix}-b").job_id
    worker = make_worker(app, settings, "w")
    with collect_journal() as journal, running(worker) as (runner,):
        wait_until(
            lambda: all(
                read_view(ddb_client, settings, j).state is JobState.SUCCEEDED for j in (a, b)
            ),
            30,
            "both jobs succeeded",
        )
        stats = runner.stop()
    assert (stats.claimed, stats.committed) == (2, 2)
    assert result_of(read_record(ddb_client, settings, a)) == {"n": 1, "ctx": "AsyncJobContext"}
    assert result_of(read_record(ddb_client, settings, b)) == {"n": 2, "ctx": "JobContext"}
    assert not threads["aio"].startswith("sqs-lease-job")  # the loop's thread
    assert threads["plain"].startswith("sqs-lease-job")  # the pool's
    assert journal.events("heartbeat_ok", job_id=a)  # extended while it awaited
    assert [e["token"] for e in journal.events("result_committed", job_id=a)] == [1]


def test_an_async_handlers_effects_await_async_tools_and_run_plain_tools_in_the_pool(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    app.target("svc")
    calls: list[tuple[str, str, int, str]] = []

    async def async_tool(call: EffectCall) -> ToolResult:
        await asyncio.sleep(0.05)
        calls.append(("async", call.key, call.token, threading.current_thread().name))
        return ToolResult({"ok": True}, external_id="x-1")

    def plain_tool(call: EffectCall) -> ToolResult:
        time.sleep(0.05)  # blocking: must not run on the loop
        calls.append(("plain", call.key, call.token, threading.current_thread().name))
        return ToolResult({"ok": True}, external_id="x-2")

    # Tokens counted exactly, and the subject is where the tools run, not a lapse.
    @app.job("two", payload=Work, **ROOMY)
    async def two(ctx: AsyncJobContext[Work], p: Work) -> dict[str, Any]:
        first = await ctx.effect("first", "svc", {"n": p.n}, async_tool)
        second = await ctx.effect("second", "svc", {"n": p.n}, plain_tool)
        return {"ids": [first.external_id, second.external_id]}

    job_id = Producer(settings, app).submit("two", Work(n=3), job_id=f"{aws.prefix}-e").job_id
    worker = make_worker(app, settings, "w")
    with collect_journal() as journal, running(worker) as (runner,):
        wait_until(
            lambda: read_view(ddb_client, settings, job_id).state is JobState.SUCCEEDED,
            30,
            "the job succeeded",
        )
        runner.stop()
    assert result_of(read_record(ddb_client, settings, job_id)) == {"ids": ["x-1", "x-2"]}
    assert [(c[0], c[1], c[2]) for c in calls] == [
        ("async", f"{job_id}:main:first:svc", 1),
        ("plain", f"{job_id}:main:second:svc", 1),
    ]
    assert not calls[0][3].startswith("sqs-lease-job")
    assert calls[1][3].startswith("sqs-lease-job")
    assert len(journal.events("intent_confirmed", job_id=job_id)) == 2


def test_the_thread_worker_refuses_async_handlers_naming_them() -> None:
    app = App()

    @app.job("aio", payload=Work, **FAST)
    async def aio(ctx: AsyncJobContext[Work], p: Work) -> None:
        return None

    with pytest.raises(ConfigError, match=r"aio.*AsyncWorker"):
        Worker(app, Settings(endpoint_url="http://127.0.0.1:9", prefix="x"))


def test_a_tolerated_loop_lag_that_a_lease_cannot_survive_is_refused() -> None:
    app = App()

    @app.job("short", payload=Work, **FAST)  # survives a stall of 3 - 1 - 0.5 = 1.5 s
    async def short(ctx: AsyncJobContext[Work], p: Work) -> None:
        return None

    with pytest.raises(ConfigError, match=r"max_loop_lag=2.*1\.5.*'short'"):
        AsyncWorker(app, Settings(endpoint_url="http://127.0.0.1:9", prefix="x"), max_loop_lag=2)


SLOW: JobPolicy = {
    "lease_seconds": 60,
    "heartbeat_seconds": 10.0,
    "jitter_seconds": 5.0,
}  # a 45 s stall


def _staged_app() -> App:
    """A staged job whose defaults survive a 45 s stall, with one stage of the short
    lease (it survives 3 - 1 - 0.5 = 1.5 s)."""
    app = App()
    report = app.staged("report", payload=Work, **SLOW)

    @report.stage("fetch")
    async def fetch(ctx: AsyncJobContext[Work], p: Work) -> NextStage:
        return NextStage("render", p)

    @report.stage("render", payload=Work, **FAST)
    async def render(ctx: AsyncJobContext[Work], p: Work) -> None:
        return None

    return app


def _planned_app() -> App:
    """A planned job whose defaults survive a 45 s stall, with one tool of a lease
    that survives 4 - 1 - 1 = 2 s."""
    app = App()
    agent = app.planned("agent", **SLOW)
    agent.tool("search", args=Work)(lambda ctx, p: None)

    tight: JobPolicy = {"heartbeat_seconds": 1.0, "jitter_seconds": 1.0, "missed_heartbeats": 2}

    @agent.tool("mail", args=Work, **tight | {"lease_seconds": 4})
    async def mail(ctx: AsyncJobContext[Work], p: Work) -> None:
        return None

    return app


@pytest.mark.parametrize(
    ("make_app", "named", "limit"),
    [(_staged_app, "report/render", 1.5), (_planned_app, "agent/mail", 2)],
)
def test_every_stage_and_tool_bounds_the_tolerated_loop_lag_not_only_its_job(
    make_app: Any, named: str, limit: float
) -> None:
    # Issue 26 defect 10: the tolerated loop lag was read from the jobs' defaults
    # only; a stall it tolerated lost the tighter stage's (or tool's) lease, with no
    # loop_blocked, and the attempt went back uncharged, every time.
    settings = Settings(endpoint_url="http://127.0.0.1:9", prefix="x")
    with pytest.raises(ConfigError, match=rf"max_loop_lag=10.*below {limit:g},.*'{named}'"):
        AsyncWorker(make_app(), settings, max_loop_lag=10)


# --------------------------------------------------------------------------- a blocked loop


def test_a_handler_that_blocks_the_loop_loses_its_lease_and_the_other_leases_lapse_journaled(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    waiting = threading.Event()
    seen: dict[int, str] = {}

    @app.job("hog", payload=Work, **FAST | {"max_attempts": 3, "backoff_base_seconds": 0})
    async def hog(ctx: AsyncJobContext[Work], p: Work) -> dict[str, int]:
        if ctx.token == 1:
            while not waiting.is_set():
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # the other job is inside its wait
            # Blocks the event loop (and so the heartbeat) well past the tolerated
            # lag (0.75 s here) and past every lease's reserve (3 - 1 - 0.5 = 1.5 s).
            time.sleep(2.6)
            try:
                await ctx.check()
            except AttemptTimedOut as exc:
                seen[1] = str(exc)
                raise
        return {"token": ctx.token}

    @app.job("patient", payload=Work, **FAST | {"max_attempts": 3, "backoff_base_seconds": 0})
    async def patient(ctx: AsyncJobContext[Work], p: Work) -> dict[str, int]:
        waiting.set()
        await ctx.wait(6.0)
        return {"token": ctx.token}

    producer = Producer(settings, app)
    hog_id = producer.submit("hog", Work(n=1), job_id=f"{aws.prefix}-hog").job_id
    other_id = producer.submit("patient", Work(n=2), job_id=f"{aws.prefix}-pat").job_id
    worker = make_worker(app, settings, "w")
    assert worker.max_loop_lag == 0.75
    with collect_journal() as journal, running(worker) as (runner,):
        wait_until(
            lambda: read_view(ddb_client, settings, hog_id).state is JobState.SUCCEEDED,
            60,
            "the hog's second attempt succeeded",
        )
        journal.wait_for("lease_dropped_late", job_id=other_id, timeout=30)
        runner.stop()
    # The blocker never kept its own lease: it was dropped for holding the loop,
    # its check raised, and the job ran again under a new token.
    blocked = journal.events("loop_blocked", job_id=hog_id, token=1)
    assert len(blocked) == 1, journal.events("loop_blocked")
    assert blocked[0]["blocked_for"] > blocked[0]["tolerated"] == 0.75
    (ended,) = journal.events("loop_unblocked", job_id=hog_id, token=1)
    assert ended["blocked_for"] >= 2.5 and ended["blocker_dropped"] is True
    dropped = journal.events("lease_dropped", job_id=hog_id, token=1)
    assert [e["reason"] for e in dropped] == ["loop_blocked"]
    assert "loop_blocked" in seen[1]
    late = [
        e
        for e in journal.events("heartbeat_ok", job_id=hog_id, token=1)
        if e["_mono"] > dropped[0]["_mono"]
    ]
    assert late == []
    rec = read_record(ddb_client, settings, hog_id)
    assert rec.token >= 2 and result_of(rec) == {"token": rec.token}
    assert not journal.events("result_committed", job_id=hog_id, token=1)
    # The other job's lease lapsed while the loop was held: never silently, and as the
    # worker's own lateness (issue 12): handed back with its attempt not charged.
    assert ended["lapsed"] == 1
    assert journal.events("lease_dropped", job_id=other_id, token=1) == []
    assert len(journal.events("lease_dropped_late", job_id=other_id, token=1)) == 1
    # The attempt is given back: a later claim (the message returns within a second)
    # is again attempt 1, and whether the stop came before or after it, the record
    # does not count the lapsed attempt.
    claims = journal.events("job_claimed", job_id=other_id)
    # The hand-back sent no visibility change with the lapsed lease's old handle: one
    # that reached SQS after the message was received again made it visible under its
    # new owner, and this same worker claimed it a third time (moto applies it).
    assert journal.events("job_reclaimed", job_id=other_id) == []
    assert [c["attempt"] for c in claims] == [1] * len(claims) and claims, claims
    assert read_record(ddb_client, settings, other_id).attempt <= 1


def test_a_stall_within_the_tolerated_lag_costs_no_lease(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    # Tolerated lag: half the heartbeat (1.5 s) against a 0.05 s step. A margin of 30
    # times, not 4: a busy machine measured FAST's 0.2 s step (0.75 s tolerated) at
    # 1.15 s. The wait spans two heartbeats, so the kept lease is the point.
    policy: JobPolicy = {**ROOMY, "lease_seconds": 15, "heartbeat_seconds": 3.0}

    @app.job("brief", payload=Work, **policy)
    async def brief(ctx: AsyncJobContext[Work], p: Work) -> dict[str, int]:
        time.sleep(0.05)  # a short synchronous step: well within the lag tolerated
        await ctx.wait(7.0)
        return {"token": ctx.token}

    job_id = Producer(settings, app).submit("brief", Work(n=1), job_id=f"{aws.prefix}-b").job_id
    worker = make_worker(app, settings, "w")
    with collect_journal() as journal, running(worker) as (runner,):
        wait_until(
            lambda: read_view(ddb_client, settings, job_id).state is JobState.SUCCEEDED,
            30,
            "the job succeeded",
        )
        runner.stop()
    assert journal.events("loop_blocked") == journal.events("loop_unblocked") == []
    assert journal.events("lease_dropped") == []
    assert read_record(ddb_client, settings, job_id).token == 1


def test_a_stop_during_a_delete_flush_still_deletes_that_batch(
    aws: AwsTestEnv, monkeypatch: pytest.MonkeyPatch, sqs_client: SQSClient
) -> None:
    # The delete loop takes a batch from the pending deletes, then awaits its
    # DeleteMessageBatch. A stop that cancelled the loop there lost the batch: its
    # messages stayed in flight after the worker said every finished job's message
    # was deleted (seen: 12 of 20 deleted in tests/test_floor.py on a busy machine).
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("quick", payload=Work, **FAST)
    async def quick(ctx: AsyncJobContext[Work], p: Work) -> dict[str, int]:
        return {"n": p.n}

    in_flight = threading.Event()
    execute = AsyncDriver.execute

    async def slow_deletes(driver: AsyncDriver, c: Call) -> Outcome:
        if c.op != "DeleteMessageBatch":
            return await execute(driver, c)
        in_flight.set()
        await asyncio.sleep(3.0)  # the stop arrives while this batch is in flight
        try:
            return await execute(driver, c)
        finally:
            in_flight.clear()

    monkeypatch.setattr(AsyncDriver, "execute", slow_deletes)
    producer = Producer(settings, app)
    for i in range(3):
        producer.submit("quick", Work(n=i), job_id=f"{aws.prefix}-{i}")
    with collect_journal() as journal, running(make_worker(app, settings, "w")) as (runner,):
        wait_until(lambda: len(journal.events("result_committed")) == 3, 60, "all committed")
        wait_until(in_flight.is_set, 60, "a delete batch in flight")
        runner.stop()
    assert len(journal.events("result_committed")) == 3
    assert journal.events("message_delete_failed") == []
    assert queue_depth(sqs_client, url) == 0
