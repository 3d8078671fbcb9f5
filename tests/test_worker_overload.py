"""A worker holding more sleeping handlers than its heartbeat keeps on time fails no job.

Issue 12 item 3, on a real moto server over HTTP, with each worker shell: many
handlers that sleep through several heartbeats, a short lease, one attempt per
job. The worker's backpressure (it takes on no more than its rounds keep on
time) and its lateness rule (a lease its own late heartbeat let run out is
handed back without charging the attempt) must leave every job succeeded on its
first and only attempt: a re-claim because of the worker's own lateness would
spend the second attempt ``max_attempts=1`` does not have, and fail the job.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from conftest import REGION, AwsTestEnv
from pydantic import BaseModel
from worker_helpers import collect_journal, prepare, read_record, running, use_shell, wait_until

from sqs_lease import App, JobContext, JobPolicy, JobState, Producer, Timeouts, Worker
from sqs_lease._local import spawn_local_server, stop_local_server

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient

# One xdist worker runs this file (`make test` uses --dist loadgroup): its module
# fixture starts a moto server of its own once.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("worker_overload")]

Shell: Any = Worker  # each worker shell in turn (use_shell)
shell = use_shell(__name__)

JOBS = 120
SHORT: JobPolicy = {"lease_seconds": 4, "heartbeat_seconds": 1.0, "jitter_seconds": 1.5}
# Calls that answer late are the overload under test, not an outage: patient client
# timeouts keep "no answer" (ownership unknown, a claim that may have applied) out of
# a test of the worker's own lateness on a shared, busy machine.
PATIENT = Timeouts(read=30.0, attempts=1)


class Nap(BaseModel):
    n: int


@pytest.fixture(scope="module")
def own_endpoint(moto_endpoint: str) -> Iterator[str]:
    """A moto server of this module's own: late in the suite the shared one holds
    thousands of queues and tables and answers slowly, which this test would measure
    as the worker's lateness (seen: 300 s instead of 30 s in a full run)."""
    proc, endpoint = spawn_local_server()
    try:
        yield endpoint
    finally:
        stop_local_server(proc)


@pytest.fixture
def aws(own_endpoint: str) -> AwsTestEnv:
    return AwsTestEnv(endpoint_url=own_endpoint, prefix=f"t{uuid.uuid4().hex[:10]}")


@pytest.fixture
def ddb_client(own_endpoint: str) -> DynamoDBClient:
    return boto3.client("dynamodb", endpoint_url=own_endpoint, region_name=REGION)


# The backpressure under test sets the pace: on a busy machine most rounds complete
# later than this lease's 0.5 s budget, and a throttled worker holds only what one
# round's cost projects, down to one lease at a time (at load 20 the 120 jobs took
# longer than pytest's 300 s default). That pace is the machine's, and this test checks
# semantics, never speed: its hang guard allows it.
GUARD = 900


@pytest.mark.timeout(GUARD + 60)
def test_an_overloaded_worker_fails_no_job_and_reclaims_none_by_its_own_lateness(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("nap", payload=Nap, **SHORT | {"missed_heartbeats": 2, "max_attempts": 1})
    def nap(ctx: JobContext[Any], p: Nap) -> dict[str, int]:
        ctx.wait(2.5)  # sleeps through two heartbeats (raises if told to stop)
        return {"n": p.n}

    producer = Producer(settings, app)
    ids = [
        producer.submit("nap", Nap(n=i), job_id=f"{aws.prefix}-{i:03d}").job_id for i in range(JOBS)
    ]
    worker = Shell(
        app,
        settings,
        worker_id=f"ov-{aws.prefix}",
        concurrency=JOBS,
        receive_wait=1,
        timeouts=PATIENT,
    )
    with collect_journal() as journal, running(worker) as (runner,):
        wait_until(
            lambda: len(journal.events("result_committed")) >= JOBS,
            GUARD,  # a hang guard only
            f"{JOBS} committed results",
            interval=0.5,
        )
        stats = runner.stop(timeout=60)

    records = [read_record(ddb_client, settings, j) for j in ids]
    assert {r.state for r in records} == {JobState.SUCCEEDED.value}
    # One attempt each: no lateness of the worker's was charged to a job.
    assert {r.attempt for r in records} == {1}
    assert stats.failed == 0 and stats.committed == JOBS
    assert stats.reclaimed == 0 and journal.events("job_reclaimed") == []
    assert journal.events("job_failed") == []
    # A lease it let go by its own lateness, if any, went back uncharged, never lapsed.
    assert stats.released_late == len(journal.events("lease_dropped_late"))


def test_claims_of_a_class_whose_lease_outlasts_the_receives_turn_no_backpressure_on(
    aws: AwsTestEnv,
) -> None:
    # The receive's visibility is the shortest lease of the worker's classes (20 s),
    # so a claim of the 120 s class has its first beat due at once, its schedule 90 s
    # before the claim. The pace measured that as a round 90 s late and stopped all
    # new work after every such claim; a round run at once is on time.
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    app.job("brief", payload=Nap, lease_seconds=20, heartbeat_seconds=5.0, jitter_seconds=2.0)(
        lambda ctx, p: {}
    )

    @app.job("long", payload=Nap, lease_seconds=120, heartbeat_seconds=10.0, jitter_seconds=5.0)
    def long(ctx: JobContext[Any], p: Nap) -> None:
        ctx.wait(600)  # held until the worker stops (raises then)

    producer = Producer(settings, app)
    for i in range(20):
        producer.submit("long", Nap(n=i), job_id=f"{aws.prefix}-l{i:02d}")
    worker = Shell(app, settings, concurrency=20, receive_wait=1, timeouts=PATIENT)
    assert worker.receive_visibility == 20
    with collect_journal() as journal, running(worker) as (runner,):
        wait_until(lambda: len(worker.book) == 20, 120, "all 20 held")  # a hang guard only
        # Their first beats (due at once) ran: every lease was brought to L.
        wait_until(lambda: len(journal.events("heartbeat_ok")) >= 20, 120, "their first beats")
        runner.stop(timeout=60)
    assert journal.events("backpressure_on") == []
