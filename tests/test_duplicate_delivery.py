"""A duplicate delivery to a live owner defers; a dead owner is still taken over
(issue 26, signals), with real worker processes on the moto server over HTTP.

SQS delivers at least once: a copy of a job's message can reach a second worker
while the first runs the job. Here the copy is a second message with the job's
body (the same send id: to the protocol it is the job's current message, as SQS's
own copy is). The second worker watches the owner's liveness record, finds it
beating and defers its copy (``claim_deferred``, reason ``owner_alive``); the
owner finishes, the handler ran once. When the owner is SIGKILLed instead, its
job is taken over (``job_reclaimed``) within the lease plus the watch (L + 2H).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from conftest import AwsTestEnv
from dup_worker import HEARTBEAT, LEASE
from worker_helpers import HANG_GUARD, WorkerProcess

from sqs_lease import Producer, Settings, create_queue
from sqs_lease._core.messages import message_body
from sqs_lease._resources import create_tables
from sqs_lease._schema.views import view_of

HERE = Path(__file__).resolve().parent


@pytest.fixture
def env(aws: AwsTestEnv) -> Settings:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    create_queue(settings, visibility=LEASE)
    return settings


@pytest.fixture
def procs() -> Iterator[list[WorkerProcess]]:
    made: list[WorkerProcess] = []
    yield made
    for p in made:
        p.stop()


def _wait(pred: Any, what: str, procs: list[WorkerProcess], timeout: float = 0.0) -> float:
    """Wait for ``pred`` (at least HANG_GUARD: a hang guard, never a speed check);
    returns the seconds it took."""
    start = time.monotonic()
    deadline = start + max(timeout, HANG_GUARD)
    while time.monotonic() < deadline:
        if pred():
            return time.monotonic() - start
        time.sleep(0.1)
    logs = "\n".join(f"--- {p.name}\n" + p.log.read_text()[-4000:] for p in procs)
    raise AssertionError(f"no {what} within {deadline - start:.0f}s; logs:\n{logs}")


def _record(settings: Settings, job_id: str) -> Any:
    ddb = boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name="us-east-1")
    item = ddb.get_item(
        TableName=settings.jobs_table, Key={"job_id": {"S": job_id}}, ConsistentRead=True
    )["Item"]
    return view_of(item)


def _send_copy(settings: Settings, job_id: str) -> None:
    """A second message with the job's body: SQS's at-least-once copy, as the protocol
    sees one (the job's current send id)."""
    view = _record(settings, job_id)
    sqs = boto3.client("sqs", endpoint_url=settings.endpoint_url, region_name="us-east-1")
    url = sqs.get_queue_url(QueueName=settings.queue)["QueueUrl"]
    body = message_body(job_id, view.job_class, view.stage, view.send_id)
    sqs.send_message(QueueUrl=url, MessageBody=body)


def _start(name: str, env: Settings, tmp: Path, shell: str = "thread") -> WorkerProcess:
    return WorkerProcess(
        HERE / "dup_worker.py",
        name,
        env,
        tmp / f"{name}.log",
        RUNS=str(tmp / "runs"),
        GATE=str(tmp / "gate"),
        SQS_LEASE_SHELL=shell,
    )


def _runs(tmp: Path) -> list[str]:
    path = tmp / "runs"
    return path.read_text().split() if path.exists() else []


def _submit(env: Settings) -> str:
    job_id = f"{env.prefix}-d-{uuid.uuid4().hex[:6]}"
    Producer(env).submit("long", {"n": 1}, job_id)
    return job_id


@pytest.mark.integration
@pytest.mark.parametrize("shell", ["thread", "async"])
def test_a_duplicate_delivery_to_a_live_owner_is_deferred_and_the_handler_runs_once(
    env: Settings, procs: list[WorkerProcess], tmp_path: Path, shell: str
) -> None:
    # The owner runs the thread worker; the worker that gets the copy runs ``shell``
    # (the rule is the core's: both shells run it).
    job_id = _submit(env)
    a = _start("A", env, tmp_path)
    procs.append(a)
    _wait(lambda: _runs(tmp_path) == ["A"], "A running the job", procs)
    b = _start("B", env, tmp_path, shell)
    procs.append(b)
    _send_copy(env, job_id)
    deferred: list[dict[str, Any]] = []

    def b_deferred() -> bool:
        deferred[:] = [e for e in b.events("claim_deferred") if e["reason"] == "owner_alive"]
        return bool(deferred)

    _wait(b_deferred, "B deferring the copy to the live owner", procs)
    assert deferred[0]["job_id"] == job_id and deferred[0]["owner"] == "A"
    assert deferred[0]["token"] == 1 and deferred[0]["visibility_set"] is True
    assert deferred[0]["delay"] >= LEASE
    # The owner keeps working a while longer (its copy deferred, not deleted), then ends.
    time.sleep(2 * HEARTBEAT)
    (tmp_path / "gate").touch()
    _wait(lambda: _record(env, job_id).state.value == "succeeded", "A's commit", procs)
    # The deferred copy comes back (to either worker), meets the ended record and is
    # deleted.
    _wait(
        lambda: any(p.events("job_already_done") for p in (a, b)),
        "the copy meeting the ended job",
        procs,
    )
    view = _record(env, job_id)
    assert (view.owner, view.token, view.attempt) == ("A", 1, 1)
    assert _runs(tmp_path) == ["A"]  # the handler ran once
    for p in (a, b):
        assert not p.events("job_reclaimed"), p.name
        assert not p.events("heartbeat_lost"), p.name
    # Watching and deferring charged the job nothing, and the copy left the queue.
    assert [e["attempt"] for e in a.events("result_committed")] == [1]


@pytest.mark.integration
def test_a_sigkilled_owner_is_still_taken_over_within_the_lease_and_the_watch(
    env: Settings, procs: list[WorkerProcess], tmp_path: Path
) -> None:
    job_id = _submit(env)
    a = _start("A", env, tmp_path)
    procs.append(a)
    _wait(lambda: _runs(tmp_path) == ["A"], "A running the job", procs)
    b = _start("B", env, tmp_path)
    procs.append(b)
    _send_copy(env, job_id)
    _wait(lambda: b.events("claim_deferred"), "B deferring the copy while A lives", procs)
    a.proc.kill()  # SIGKILL: no hand-back, no last beat
    a.proc.wait(30)
    killed = time.monotonic()
    (tmp_path / "gate").touch()  # the next attempt finishes at once
    # Whichever copy comes back first (A's, its lease lapsed; or B's deferred one),
    # B watches A's liveness record for 2H, sees it still, and takes the job over.
    _wait(
        lambda: b.events("job_reclaimed"),
        "B taking the dead owner's job over",
        procs,
        timeout=LEASE + 2 * HEARTBEAT,
    )
    took = time.monotonic() - killed
    (reclaimed,) = b.events("job_reclaimed")
    assert reclaimed["job_id"] == job_id and reclaimed["previous_owner"] == "A"
    assert reclaimed["previous_token"] == 1 and reclaimed["token"] == 2
    _wait(lambda: _record(env, job_id).state.value == "succeeded", "B's commit", procs)
    view = _record(env, job_id)
    assert (view.owner, view.token) == ("B", 2)
    assert _runs(tmp_path) == ["A", "B"]
    # The bound, L + 2H after A's last beat, plus the receive's long poll and a busy
    # machine's slack (a hang guard, not a speed check: the semantic is that a dead
    # owner is taken over, by a watch that ends).
    print(f"taken over {took:.1f} s after the kill (L + 2H = {LEASE + 2 * HEARTBEAT:.0f} s)")
