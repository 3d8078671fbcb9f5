"""The worker as a container's main process: SIGTERM, exit codes, the settings table.

Real ``python -m sqs_lease worker`` processes on the session's moto server over
HTTP, configured only through environment variables, as ECS runs them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from worker_helpers import drain, prepare, read_view, wait_until

from sqs_lease import JobState, Producer, Settings
from sqs_lease._config import ENV_VARIABLES
from sqs_lease._local import spawn_local_server, stop_local_server
from sqs_lease.service import (
    STOP_RESERVE_SECONDS,
    ExitCode,
    WorkerEnv,
    env_table_markdown,
)

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
HANG_GUARD = 120


def worker_env(aws: AwsTestEnv, gates: Path, **extra: str) -> dict[str, str]:
    """The environment of a worker container: everything through variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQS_LEASE_")}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),
            "PYTHONUNBUFFERED": "1",
            "AWS_ENDPOINT_URL": aws.endpoint_url,
            "SQS_LEASE_PREFIX": aws.prefix,
            "SQS_LEASE_APP": "container_app:app",
            "GATE_DIR": str(gates),
        }
    )
    env.update(extra)
    return env


@contextmanager
def worker_process(env: dict[str, str], logs: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m sqs_lease worker`` with stdout and stderr in files under ``logs``."""
    with (logs / "stdout").open("wb") as out, (logs / "stderr").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sqs_lease", "worker"], env=env, stdout=out, stderr=err
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def journal(logs: Path) -> list[dict[str, Any]]:
    lines = (logs / "stderr").read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith('{"event"')]


def scan_states(ddb: DynamoDBClient, settings: Settings) -> dict[str, str]:
    items = ddb.scan(TableName=settings.jobs_table, ConsistentRead=True)["Items"]
    return {i["job_id"]["S"]: i["state"]["S"] for i in items if "state" in i}  # not liveness


# --------------------------------------------------------------------------- SIGTERM


@pytest.mark.integration
@pytest.mark.fault
def test_sigterm_mid_work_hands_back_every_job_and_exits_with_the_clean_code(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient, tmp_path: Path
) -> None:
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    gates = tmp_path / "gates"
    gates.mkdir()
    producer = Producer(settings)
    done = producer.submit("quick", {"n": 1}, job_id=f"{aws.prefix}-done").job_id
    env = worker_env(
        aws,
        gates,
        SQS_LEASE_CONCURRENCY="3",
        SQS_LEASE_RECEIVE_WAIT="20",
        SQS_LEASE_STOP_TIMEOUT="30",  # the grace follows: 30 - 20 - 5 = 5 s
        SQS_LEASE_SWEEP_INTERVAL="0",
    )
    with worker_process(env, tmp_path) as proc:
        wait_until(
            lambda: read_view(ddb_client, settings, done).state is JobState.SUCCEEDED,
            HANG_GUARD,
            "the first job to be committed",
        )
        blocked = producer.submit("blocked", {"n": 2}, job_id=f"{aws.prefix}-blocked").job_id
        polite = producer.submit("polite", {"n": 3}, job_id=f"{aws.prefix}-polite").job_id
        wait_until(
            lambda: all((gates / f).exists() for f in ("blocked-2-started", "polite-3-started")),
            HANG_GUARD,
            "both handlers to run",
        )
        # The third slot is in a 20 s long poll: the job submitted after SIGTERM is
        # received by it (and handed back unstarted), or never received.
        proc.send_signal(signal.SIGTERM)
        wait_until(
            lambda: any(e["event"] == "worker_stopping" for e in journal(tmp_path)),
            HANG_GUARD,
            "the worker to take the signal",
        )
        late = producer.submit("quick", {"n": 4}, job_id=f"{aws.prefix}-late").job_id
        code = proc.wait(timeout=HANG_GUARD)
    events = journal(tmp_path)
    names = [e["event"] for e in events]
    assert code == ExitCode.OK, (tmp_path / "stderr").read_text()[-3000:]
    assert "worker_stopped" in names
    # The blocked call ignored every stop: the worker did not wait for it to end,
    # it released the job after the grace (the handler never finished).
    assert not (gates / "blocked-2-finished").exists()
    assert any(
        e["event"] == "messages_released" and "overran the grace" in e["reason"] for e in events
    ), names
    assert not (gates / "quick-4-started").exists()  # the late job never ran
    # No job left claimed without a decision: committed, or back in the queue
    # with its attempt given back.
    states = scan_states(ddb_client, settings)
    assert states == {done: "succeeded", blocked: "queued", polite: "queued", late: "queued"}
    for job_id in (blocked, polite):
        view = read_view(ddb_client, settings, job_id)
        assert (view.token, view.attempt) == (1, 0), view
    # Visible again at once: the leases were 60 s, the messages come back now.
    got = drain(sqs_client, url, timeout=15, want=3)
    assert sorted(json.loads(m["Body"])["job_id"] for m in got) == sorted([blocked, polite, late])


# --------------------------------------------------------------------------- exit codes


def _run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqs_lease", "worker", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("extra", "code", "words"),
    [
        ({"SQS_LEASE_CONCURRENCY": "0"}, ExitCode.CONFIG, "SQS_LEASE_CONCURRENCY"),
        ({"SQS_LEASE_CONCURENCY": "8"}, ExitCode.CONFIG, "did you mean SQS_LEASE_CONCURRENCY"),
        (
            {"SQS_LEASE_STOP_TIMEOUT": "30", "SQS_LEASE_SHUTDOWN_GRACE": "28"},
            ExitCode.CONFIG,
            "stop_timeout 30",
        ),
        ({"SQS_LEASE_APP": "no_such_module_q:app"}, ExitCode.APP_IMPORT, "no_such_module_q"),
        ({"SQS_LEASE_APP": "container_app:missing"}, ExitCode.APP_IMPORT, "'missing'"),
        ({"SQS_LEASE_PREFIX": "nothing-here"}, ExitCode.RESOURCES_MISSING, "tables create"),
        ({"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, ExitCode.AWS_UNAVAILABLE, "127.0.0.1:9"),
    ],
    ids=[
        "bad-variable",
        "misspelt-variable",
        "grace-over-stop-timeout",
        "no-module",
        "no-app",
        "no-table",
        "no-aws",
    ],
)
def test_a_worker_that_cannot_start_exits_with_the_documented_code(
    aws: AwsTestEnv, tmp_path: Path, extra: dict[str, str], code: ExitCode, words: str
) -> None:
    prepare(aws.endpoint_url, aws.prefix)
    proc = _run_cli(worker_env(aws, tmp_path, **extra))
    assert proc.returncode == code, proc.stderr
    assert words in _one_error_line(proc)


@pytest.mark.integration
@pytest.mark.fault
@pytest.mark.parametrize("use_async", ["false", "true"], ids=["threads", "async"])
def test_a_worker_that_loses_aws_for_good_stops_with_the_aws_code(
    tmp_path: Path, use_async: str
) -> None:
    server, endpoint = spawn_local_server()
    try:
        aws = AwsTestEnv(endpoint_url=endpoint, prefix="lost")
        prepare(endpoint, aws.prefix)
        env = worker_env(
            aws,
            tmp_path,
            SQS_LEASE_AWS_LOST_AFTER="2",
            SQS_LEASE_RECEIVE_WAIT="1",
            SQS_LEASE_SWEEP_INTERVAL="0",
            SQS_LEASE_USE_ASYNC=use_async,
        )
        with worker_process(env, tmp_path) as proc:
            wait_until(
                lambda: any(e["event"] == "worker_started" for e in journal(tmp_path)),
                HANG_GUARD,
                "the worker to start",
            )
            stop_local_server(server)  # AWS is gone, for good
            code = proc.wait(timeout=HANG_GUARD)
    finally:
        stop_local_server(server)
    assert code == ExitCode.AWS_UNAVAILABLE, (tmp_path / "stderr").read_text()[-2000:]
    events = journal(tmp_path)
    lost = [e for e in events if e["event"] == "aws_lost"]
    assert len(lost) == 1 and lost[0]["failing_for"] >= 2
    # Failed receives are paced (0.1 s doubling to 1 s), not a spin that floods the
    # log: a refused connection fails at once, hundreds of times a second unpaced.
    failed = [e for e in events if e["event"] == "receive_failed"]
    assert 1 <= len(failed) <= 30, len(failed)
    assert "every receive failed for 2 s" in (tmp_path / "stderr").read_text()


def test_the_stop_timeout_sets_a_grace_that_fits_and_refuses_one_that_does_not() -> None:
    env = WorkerEnv.load(stop_timeout=30, receive_wait=2)
    assert env.grace == 30 - 2 - STOP_RESERVE_SECONDS
    assert WorkerEnv.load().grace == 20  # no stop_timeout: the old default
    with pytest.raises(Exception, match="exceeds stop_timeout 30"):
        WorkerEnv.load(stop_timeout=30, receive_wait=20, shutdown_grace=6)


# --------------------------------------------------------------------------- the table


def test_operations_md_lists_every_variable_the_worker_reads_as_generated() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    match = re.search(r"<!-- env-table -->\n(.*?)\n<!-- /env-table -->", doc, re.S)
    assert match, "docs/operations.md lost its <!-- env-table --> markers"
    assert match.group(1) == env_table_markdown(), (
        "docs/operations.md's variable table differs from the settings: paste the output "
        "of `python -c 'from sqs_lease.service import env_table_markdown as t; print(t())'`"
    )


def test_the_settings_variables_listed_are_the_ones_from_env_reads() -> None:
    source = (ROOT / "sqs_lease" / "_config.py").read_text()
    read = set(re.findall(r'e\.get\("([A-Z_]+)"\)', source))
    read |= set(re.findall(r'"(AWS_ENDPOINT_URL_[A-Z]+)"', source))
    assert read == {name for name, _, _ in ENV_VARIABLES}
