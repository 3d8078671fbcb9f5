"""The protocol's floor on a real moto server: what a short job costs, per call.

A short job needs receive/10 + claim + commit + delete/10 (DESIGN.md section 5):
the receive's own VisibilityTimeout is the first lease (no ChangeMessageVisibility
per claim), ended jobs' messages are deleted 10 per DeleteMessageBatch, and a
receive waits for enough free slots to ask for a full batch. Deleting later is
safe because a redelivered message of a finished job meets its terminal record
at the claim and is deleted then, never run again. Calls are counted as the
workers' drivers send them (to the moto server, over HTTP); each test runs with
the thread worker and the async worker.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import (
    HANG_GUARD,
    collect_journal,
    prepare,
    queue_depth,
    read_view,
    use_shell,
    wait_until,
)

from sqs_lease import App, JobContext, JobState, Producer, Worker
from sqs_lease._aio import AsyncDriver
from sqs_lease._aws import SyncDriver
from sqs_lease._core.calls import Call, Outcome
from sqs_lease._core.deletes import DeleteBatch, PendingDelete

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

pytestmark = pytest.mark.integration

Shell: Any = Worker  # each worker shell in turn (use_shell)
shell = use_shell(__name__)

# Long enough that a claim on a busy machine still finds more than H + J of the
# receive's lease left (else it sets the lease itself, as it should).
TIMING: dict[str, Any] = {"lease_seconds": 30, "heartbeat_seconds": 5.0, "jitter_seconds": 2.0}


class Page(BaseModel):
    n: int


class Calls:
    """Counts the calls both drivers send (by op, and DeleteMessageBatch entries)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ops: Counter[str] = Counter()
        self.received: list[int] = []  # messages per non-empty receive
        self.deleted_entries = 0
        self.on = False
        self._lock = threading.Lock()
        sync_execute, async_execute = SyncDriver.execute, AsyncDriver.execute

        def seen(c: Call, out: Outcome) -> None:
            if not self.on:
                return
            with self._lock:
                self.ops[c.op] += 1
                if c.op == "DeleteMessageBatch":
                    self.deleted_entries += len(c.params["Entries"])
                if c.op == "ReceiveMessage":
                    got = len(getattr(out, "response", {}).get("Messages", []) or [])
                    if got:
                        self.received.append(got)

        def counted(driver: SyncDriver, c: Call) -> Outcome:
            out = sync_execute(driver, c)
            seen(c, out)
            return out

        async def acounted(driver: AsyncDriver, c: Call) -> Outcome:
            out = await async_execute(driver, c)
            seen(c, out)
            return out

        monkeypatch.setattr(SyncDriver, "execute", counted)
        monkeypatch.setattr(AsyncDriver, "execute", acounted)


def _app(ran: Counter[str]) -> App:
    app = App()

    @app.job("floor.page", payload=Page, **TIMING)
    def page(ctx: JobContext[Page], payload: Page) -> dict[str, int]:
        ran[ctx.job_id] += 1
        return {"n": payload.n}

    return app


def test_a_short_job_costs_a_claim_a_commit_and_a_tenth_of_a_receive_and_a_delete(
    aws: AwsTestEnv, monkeypatch: pytest.MonkeyPatch, sqs_client: SQSClient
) -> None:
    calls = Calls(monkeypatch)
    ran: Counter[str] = Counter()
    app = _app(ran)
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    producer = Producer(settings, app)
    jobs = 20
    for i in range(jobs):
        producer.submit("floor.page", Page(n=i), f"job-{i:02d}")
    worker = Shell(app, settings, concurrency=10, receive_wait=1, sweep_interval=None)
    calls.on = True
    stats = worker.run(max_messages=jobs, idle_exit=5)
    calls.on = False
    assert stats.committed == jobs and sorted(ran.values()) == [1] * jobs
    # No visibility change per claim: the receive's 30 s lease carried every job.
    assert calls.ops["ChangeMessageVisibility"] == 0
    # No delete per job: all 20 went in batches (a stop flushes what is pending).
    assert calls.ops["DeleteMessage"] == 0
    assert calls.deleted_entries == jobs
    assert calls.ops["DeleteMessageBatch"] < jobs / 2
    # Receives asked for full batches of free slots, not one slot at a time.
    assert sum(calls.received) == jobs
    # (A loaded machine frees slots slowly, and a receive that waited its fill window
    # asks for what it can hold: fewer than ten, still never one per job.)
    assert len(calls.received) <= jobs // 2, calls.received
    assert calls.ops["UpdateItem"] == 2 * jobs  # claim + commit, nothing else per job
    assert queue_depth(sqs_client, url) == 0


def test_a_batching_window_gathers_a_trickle_into_one_receive(
    aws: AwsTestEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Jobs that trickle in arrive one per long poll; with a window the worker waits
    # after a short receive, so those sent meanwhile come in one receive.
    calls = Calls(monkeypatch)
    ran: Counter[str] = Counter()
    app = _app(ran)
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    producer = Producer(settings, app)
    jobs = 10
    window = 4.0

    def trickle() -> None:
        producer.submit("floor.page", Page(n=0), "job-00")
        wait_until(lambda: bool(calls.received), HANG_GUARD, "the first job received")
        for i in range(1, jobs):
            producer.submit("floor.page", Page(n=i), f"job-{i:02d}")
            time.sleep(0.1)  # a trickle: each lands while a long poll waits

    t = threading.Thread(target=trickle)
    worker = Shell(
        app, settings, concurrency=20, receive_wait=1, receive_window=window, sweep_interval=None
    )
    calls.on = True
    t.start()
    try:
        stats = worker.run(max_messages=jobs, idle_exit=HANG_GUARD)
    finally:
        t.join(HANG_GUARD)
    assert stats.committed == jobs and sorted(ran.values()) == [1] * jobs
    assert calls.received[0] == 1 and sum(calls.received) == jobs
    # The nine sent within the window came in one receive (two, on a machine slow
    # enough that the sends outlast the window), never one receive each.
    assert len(calls.received) <= 3, calls.received


class _LostDeletes(DeleteBatch):
    """A worker that dies before its pending deletes go: none is ever sent."""

    def take(self, now: float, *, force: bool = False) -> list[PendingDelete]:
        return []


def test_a_redelivered_message_of_a_finished_job_is_deleted_and_not_run_again(
    aws: AwsTestEnv, ddb_client: DynamoDBClient, sqs_client: SQSClient
) -> None:
    ran: Counter[str] = Counter()
    app = App()

    @app.job(
        "floor.short",
        payload=Page,
        lease_seconds=3,
        heartbeat_seconds=1.0,
        jitter_seconds=0.5,
        missed_heartbeats=2,
    )
    def short(ctx: JobContext[Page], payload: Page) -> dict[str, int]:
        ran[ctx.job_id] += 1
        return {"n": payload.n}

    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    Producer(settings, app).submit("floor.short", Page(n=1), "job-once")
    first = Shell(app, settings, receive_wait=1, sweep_interval=None)
    first.env.deletes = _LostDeletes()  # committed, its delete lost with the worker
    assert first.run(max_messages=1, idle_exit=2).committed == 1
    assert read_view(ddb_client, settings, "job-once").state is JobState.SUCCEEDED
    assert queue_depth(sqs_client, url) == 1  # the message outlived its job
    with collect_journal() as journal:
        second = Shell(app, settings, receive_wait=1, sweep_interval=None)
        stats = second.run(max_messages=1, idle_exit=10)
    assert stats.already_done == 1 and stats.claimed == 0
    assert ran["job-once"] == 1  # never run again
    assert [e["job_id"] for e in journal.events("job_already_done")] == ["job-once"]
    wait_until(lambda: queue_depth(sqs_client, url) == 0, 10, "the redelivery deleted")


def test_deletes_still_pending_when_the_worker_stops_are_sent_before_it_returns(
    aws: AwsTestEnv, sqs_client: SQSClient
) -> None:
    ran: Counter[str] = Counter()
    app = _app(ran)
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    producer = Producer(settings, app)
    for i in range(3):
        producer.submit("floor.page", Page(n=i), f"job-{i}")
    worker = Shell(app, settings, concurrency=10, receive_wait=1, sweep_interval=None)
    worker.deletes.window = 3600.0  # nothing would go before the stop but for its flush
    stats = worker.run(max_messages=3, idle_exit=5)
    assert stats.committed == 3
    assert len(worker.deletes) == 0
    assert queue_depth(sqs_client, url) == 0  # deleted, not merely in flight


def test_a_delete_batch_never_mixes_queues() -> None:
    """A DeleteMessageBatch names one queue: a worker that reads the interactive and
    the batch queue sends each queue's handles in batches of their own."""
    batch = DeleteBatch(window=1.0)
    for i in range(9):
        assert not batch.add(f"rh-b{i}", f"b{i}", 1, 0.0, "q/batch")
    assert not batch.add("rh-i0", "i0", 1, 0.1, "q/interactive")
    assert batch.take(0.5) == []  # ten handles, but no queue has ten yet
    assert batch.add("rh-b9", "b9", 1, 0.2, "q/batch")  # the batch queue's tenth
    full = batch.take(0.5)
    assert [p.queue_url for p in full] == ["q/batch"] * 10
    rest = batch.take(1.1)  # the interactive one waited the window
    assert [(p.queue_url, p.job_id) for p in rest] == [("q/interactive", "i0")]
    assert len(batch) == 0
