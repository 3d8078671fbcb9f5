"""Jobs waiting for a concurrency slot on a real moto server: a long line of waiters
behind a limit of 1, on a queue whose redrive allows only a few receives, all end
succeeded and none goes to the DLQ (``_core/slots.py``, rule 4: waiting is not a
receive the redrive counts)."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import (
    HANG_GUARD,
    ROOMY,
    collect_journal,
    queue_depth,
    read_view,
    running,
    use_shell,
    wait_until,
)

from sqs_lease import App, JobContext, JobState, Producer, Worker
from sqs_lease.testing import make_env

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

pytestmark = pytest.mark.integration

Shell: Any = Worker  # each worker shell in turn (use_shell)
shell = use_shell(__name__)

MAX_RECEIVES = 2  # the redrive: a message's third receive moves it to the DLQ
JOBS = 6  # all received at once: job k cannot start before k x HOLD seconds, so
HOLD = 1.0  # jobs 3..5 wait at least twice (today: a third receive, the DLQ)


class Work(BaseModel):
    n: int


def test_a_long_line_of_waiters_behind_a_limit_of_one_all_succeed_and_none_is_dead_lettered(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    env = make_env(aws.endpoint_url, aws.prefix, max_receives=MAX_RECEIVES)
    settings = env.settings
    app = App()
    lock = threading.Lock()
    inside = [0]
    most = [0]

    @app.job("tool", payload=Work, **ROOMY | {"concurrency_limit": 1})
    def tool(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            time.sleep(HOLD)
        finally:
            with lock:
                inside[0] -= 1
        return {"n": p.n}

    producer = Producer(settings, app)
    ids = [
        producer.submit("tool", Work(n=i), job_id=f"{aws.prefix}-{i}").job_id for i in range(JOBS)
    ]
    worker = Shell(app, settings, worker_id=f"w-{aws.prefix}", concurrency=JOBS, receive_wait=1)

    def ended() -> bool:
        # Either every job ended, or one message went to the DLQ (today's failure: the
        # test then fails at once rather than at the hang guard).
        if queue_depth(sqs_client, env.dlq_url):
            return True
        return all(read_view(ddb_client, settings, j).state.terminal for j in ids)

    with collect_journal() as journal, running(worker) as (runner,):
        wait_until(ended, 120, "every job ended (or one was dead-lettered)")
        runner.stop()

    assert queue_depth(sqs_client, env.dlq_url) == 0, "a waiting job's message was dead-lettered"
    states = {j: read_view(ddb_client, settings, j).state for j in ids}
    assert set(states.values()) == {JobState.SUCCEEDED}, states
    assert most[0] == 1  # the limit held
    waited = journal.events("job_waiting_for_slot")
    assert waited, "no job waited: the test did not build a line of waiters"
    # Someone waited more often than the redrive's receives: the redrive did not count it.
    per_job: dict[str, int] = {}
    for e in waited:
        per_job[e["job_id"]] = per_job.get(e["job_id"], 0) + 1
    assert max(per_job.values()) >= MAX_RECEIVES, per_job
    assert HANG_GUARD  # the hang guard bounds the wait above
