"""An ECS worker exits before its task's stopTimeout, whatever its handlers do: a
real ``sqs-lease worker`` process, a handler that ignores every stop, SIGTERM."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import AwsTestEnv
from test_ecs_worker import HANG_GUARD, journal, scan_states, worker_env, worker_process
from worker_helpers import prepare, wait_until

from sqs_lease import Producer
from sqs_lease.service import EXIT_MARGIN_SECONDS, ExitCode

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient


@pytest.mark.integration
@pytest.mark.fault
@pytest.mark.parametrize(
    ("receive_wait", "use_async"), [("20", "false"), ("1", "false"), ("1", "true")]
)
def test_a_worker_whose_handler_ignores_the_stop_exits_two_seconds_before_sigkill(
    aws: AwsTestEnv,
    ddb_client: DynamoDBClient,
    tmp_path: Path,
    receive_wait: str,
    use_async: str,
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    gates = tmp_path / "gates"
    gates.mkdir()
    stop_timeout = 30.0
    env = worker_env(
        aws,
        gates,
        SQS_LEASE_CONCURRENCY="2",
        SQS_LEASE_RECEIVE_WAIT=receive_wait,
        SQS_LEASE_STOP_TIMEOUT=f"{stop_timeout:g}",
        SQS_LEASE_SWEEP_INTERVAL="0",
        SQS_LEASE_USE_ASYNC=use_async,  # the async shell runs a plain handler in a pool
    )
    producer = Producer(settings)
    blocked = producer.submit("blocked", {"n": 1}, job_id=f"{aws.prefix}-blocked").job_id
    with worker_process(env, tmp_path) as proc:
        wait_until(lambda: (gates / "blocked-1-started").exists(), HANG_GUARD, "the handler to run")
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=HANG_GUARD)
        took = time.monotonic() - signalled
    names = [e["event"] for e in journal(tmp_path)]
    # ECS sends SIGKILL at stopTimeout: the worker is gone before, with its margin,
    # even though the handler never returned, and it said what it did.
    assert took <= stop_timeout - EXIT_MARGIN_SECONDS, (took, names)
    assert code == ExitCode.OK, (tmp_path / "stderr").read_text()[-3000:]
    # The hand-back happened; the run ended, or the deadline ended the process.
    assert "messages_released" in names
    assert "worker_stopped" in names or "worker_exit_forced" in names, names
    assert not (gates / "blocked-1-finished").exists()
    assert scan_states(ddb_client, settings) == {blocked: "queued"}
