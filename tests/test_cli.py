"""The ``sqs-lease`` CLI against a real moto server (CliRunner), and ``local`` as a process."""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import AwsTestEnv

from sqs_lease._journal import LOGGER_NAME
from sqs_lease.cli import cli

ROOT = Path(__file__).resolve().parent.parent


def run(aws: AwsTestEnv | None, *args: str, prefix: str | None = None) -> Result:
    opts: list[str] = []
    if aws is not None:
        opts = ["--endpoint-url", aws.endpoint_url, "--prefix", prefix or aws.prefix]
    return CliRunner().invoke(cli, [*opts, *args])


def assert_one_line_error(result: Result, code: int = 2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def ready(aws: AwsTestEnv) -> None:
    assert run(aws, "tables", "create").exit_code == 0
    assert run(aws, "queue", "create").exit_code == 0


@pytest.fixture
def restore_journal() -> Iterator[None]:
    """``worker`` binds a stderr handler to the runner's stream: undo it after the test."""
    logger = logging.getLogger(LOGGER_NAME)
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    try:
        yield
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


# --------------------------------------------------------------------------- no AWS needed


def test_invalid_json_payload_is_one_line_naming_the_option() -> None:
    result = CliRunner().invoke(
        cli, ["--endpoint-url", "http://127.0.0.1:9", "submit", "ocr", "--payload", "{nope"]
    )
    line = assert_one_line_error(result)
    assert "--payload" in line and "JSON" in line


def test_payload_must_be_an_object(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text("[1, 2]")
    result = CliRunner().invoke(
        cli, ["--endpoint-url", "http://127.0.0.1:9", "submit", "ocr", "--payload", f"@{f}"]
    )
    assert "--payload @" in assert_one_line_error(result)


def test_bad_prefix_is_a_config_error() -> None:
    line = assert_one_line_error(CliRunner().invoke(cli, ["--prefix", "bad name", "tables"]))
    assert "prefix" in line


@pytest.mark.parametrize(
    "args",
    [
        ["tables", "create"],
        ["queue", "create"],
        ["submit", "ocr", "--payload", "{}"],
        ["jobs", "list"],
        ["jobs", "show", "x"],
        ["jobs", "cancel", "x"],
    ],
)
def test_unreachable_endpoint_is_one_line(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["--endpoint-url", "http://127.0.0.1:9", *args])
    line = assert_one_line_error(result)
    assert "127.0.0.1:9" in line or "did not answer" in line


# --------------------------------------------------------------------------- moto server


@pytest.mark.integration
def test_tables_and_queue_create_are_idempotent(aws: AwsTestEnv) -> None:
    printed = []
    for _ in range(2):
        result = run(aws, "tables", "create")
        assert result.exit_code == 0, result.output
        printed.append(result.stdout.split())
    assert printed[0] == printed[1]
    assert f"{aws.prefix}-jobs" in printed[0]
    assert all(name.startswith(f"{aws.prefix}-") for name in printed[0])
    for _ in range(2):
        result = run(aws, "queue", "create", "--visibility", "45", "--max-receives", "7")
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert lines[0].startswith("queue http") and lines[0].endswith(f"/{aws.prefix}-jobs")
        assert lines[1].startswith("dlq http") and lines[1].endswith(f"/{aws.prefix}-jobs-dlq")


@pytest.mark.integration
def test_submit_list_show_cancel(aws: AwsTestEnv) -> None:
    ready(aws)
    first = run(aws, "submit", "ocr", "--payload", '{"doc": "secret-text"}', "--id", "j1")
    assert first.exit_code == 0, first.output
    assert first.stdout.strip().split("\t")[:2] == ["j1", "created"]

    again = run(aws, "submit", "ocr", "--payload", '{"doc": "secret-text"}', "--id", "j1")
    assert again.exit_code == 0, again.output
    assert again.stdout.count("\n") == 1
    assert "already" in again.stdout and "already submitted" in again.stdout

    conflict = run(aws, "submit", "ocr", "--payload", '{"doc": "other"}', "--id", "j1")
    assert "j1" in assert_one_line_error(conflict)

    listed = run(aws, "jobs", "list")
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:3] == ["JOB", "ID", "CLASS"]
    assert len(rows) == 1
    assert rows[0].split()[:6] == ["j1", "ocr", "queued", "-", "0", "0"]

    as_json = run(aws, "jobs", "list", "--json", "--state", "queued", "--scan")
    (record,) = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert record["job_id"] == "j1" and record["token"] == 0 and "payload" not in record
    assert run(aws, "jobs", "list", "--state", "running").stdout.splitlines()[1:] == []

    shown = run(aws, "jobs", "show", "j1")
    assert shown.exit_code == 0, shown.output
    fields = dict(line.split(": ", 1) for line in shown.stdout.splitlines())
    assert fields["token"] == "0" and fields["state"] == "queued"
    assert len(fields["payload_hash"]) == 64
    assert "secret-text" not in shown.stdout
    with_payload = run(aws, "jobs", "show", "j1", "--payload", "--json")
    assert json.loads(with_payload.stdout)["payload"] == {"doc": "secret-text"}

    cancelled = run(aws, "jobs", "cancel", "j1", "--reason", "operator said so")
    assert cancelled.exit_code == 0, cancelled.output
    job_id, state, token, code, reason = cancelled.stdout.strip().split("\t")
    assert (job_id, state, token, code) == ("j1", "cancelled", "token 1", "cancelled")
    assert "operator said so" in reason
    after = run(aws, "jobs", "show", "j1").stdout
    assert "state: cancelled" in after
    assert "attention" not in after  # the index key repeats the state: one name per fact

    missing = run(aws, "jobs", "show", "nope")
    assert "no job 'nope'" in assert_one_line_error(missing, code=1)
    assert "no job" in assert_one_line_error(run(aws, "jobs", "cancel", "nope"))


@pytest.mark.integration
def test_missing_queue_says_queue_create(aws: AwsTestEnv) -> None:
    line = assert_one_line_error(run(aws, "submit", "ocr", "--payload", "{}"))
    assert "sqs-lease queue create" in line


@pytest.mark.integration
def test_missing_table_says_tables_create(aws: AwsTestEnv) -> None:
    assert run(aws, "queue", "create").exit_code == 0
    line = assert_one_line_error(run(aws, "submit", "ocr", "--payload", "{}"))
    assert "sqs-lease tables create" in line
    assert "sqs-lease tables create" in assert_one_line_error(run(aws, "jobs", "list"))


APP_SOURCE = """
from pydantic import BaseModel
from sqs_lease import App, JobContext

app = App()


class Doc(BaseModel):
    doc: str


@app.job("upper", payload=Doc, lease_seconds=10, heartbeat_seconds=2, jitter_seconds=1)
def upper(ctx: JobContext[Doc], payload: Doc) -> dict[str, str]:
    return {"text": payload.doc.upper()}
"""


@pytest.mark.integration
def test_worker_processes_a_submitted_job(
    aws: AwsTestEnv,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    restore_journal: None,
) -> None:
    module = f"cli_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(APP_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = f"{module}:app"
    ready(aws)

    bad = run(aws, "submit", "upper", "--payload", '{"doc": 1}', "--app", spec)
    assert "doc" in assert_one_line_error(bad)
    unknown = run(aws, "submit", "nope", "--payload", "{}", "--app", spec)
    assert "nope" in assert_one_line_error(unknown)

    sub = run(aws, "submit", "upper", "--payload", '{"doc": "abc"}', "--app", spec, "--id", "w1")
    assert sub.exit_code == 0, sub.output

    before = signal.getsignal(signal.SIGINT)
    result = run(
        aws, "worker", spec, "--idle-exit", "2", "--receive-wait", "1", "--worker-id", "cli-w"
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert signal.getsignal(signal.SIGINT) is before
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert stats["claimed"] == 1 and stats["committed"] == 1
    events = [json.loads(line)["event"] for line in result.stderr.splitlines()]
    assert "worker_started" in events and "worker_stopped" in events

    shown = run(aws, "jobs", "show", "w1", "--result", "--json")
    record = json.loads(shown.stdout)
    assert record["state"] == "succeeded" and record["token"] == 1 and record["owner"] == "cli-w"
    assert record["result"] == {"text": "ABC"}
    assert "payload" not in record


@pytest.mark.integration
def test_worker_without_table_or_app_is_one_line(aws: AwsTestEnv) -> None:
    # Exit codes of docs/operations.md: 3 the app cannot be imported, 2 a malformed setting.
    line = assert_one_line_error(run(aws, "worker", "no_such_module_xyz:app"), code=3)
    assert "no_such_module_xyz" in line
    assert "MODULE:OBJECT" in assert_one_line_error(run(aws, "worker", "justamodule"), code=2)


# --------------------------------------------------------------------------- local


def _line_reader(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """Lines of the child's stdout, read in a thread ("" at EOF), so reads can time out."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    return lines


@pytest.mark.integration
@pytest.mark.parametrize("stop_with", [signal.SIGINT, signal.SIGTERM])
def test_local_prints_endpoint_and_stops_on_signal(stop_with: signal.Signals) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AWS_ENDPOINT_URL", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sqs_lease.cli",
            "--prefix",
            "loc",
            "local",
            "--port",
            "0",
            "--init",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out = _line_reader(proc)
        lines: list[str] = []
        while not (lines and lines[-1].startswith("endpoint ")):
            # A hang guard: the child imports moto and starts a server (seen: over 20 s
            # with four test processes and other work on two cores).
            line = out.get(timeout=120)
            assert line, proc.stderr.read() if proc.stderr else ""
            lines.append(line)
        endpoint = lines[-1].split()[1]
        assert endpoint.startswith("http://127.0.0.1:")
        assert "table loc-jobs\n" in lines
        assert f"export AWS_ENDPOINT_URL={endpoint}" in out.get(timeout=60)
        # The emulator answers the CLI while it runs.
        listed = CliRunner().invoke(
            cli, ["--endpoint-url", endpoint, "--prefix", "loc", "jobs", "list"]
        )
        assert listed.exit_code == 0, listed.output
        proc.send_signal(stop_with)
        assert proc.wait(timeout=60) == 0
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_jobs_resume_requeues_a_parked_job_and_sends_its_message(aws: AwsTestEnv) -> None:
    import boto3

    from sqs_lease import Settings

    ready(aws)
    assert run(aws, "submit", "ocr", "--payload", '{"doc": "x"}', "--id", "p1").exit_code == 0
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    ddb = boto3.client("dynamodb", endpoint_url=aws.endpoint_url, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=aws.endpoint_url, region_name="us-east-1")
    url = sqs.get_queue_url(QueueName=settings.queue)["QueueUrl"]
    sqs.purge_queue(QueueUrl=url)  # the submit's message is gone; the job waits parked
    ddb.update_item(
        TableName=settings.jobs_table,
        Key={"job_id": {"S": "p1"}},
        UpdateExpression="SET #s = :p",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":p": {"S": "parked"}},
    )
    resumed = run(aws, "jobs", "resume", "p1")
    assert resumed.exit_code == 0, resumed.output
    item = ddb.get_item(TableName=settings.jobs_table, Key={"job_id": {"S": "p1"}})["Item"]
    assert (item["state"]["S"], item["message_sent"]["BOOL"]) == ("queued", True)
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2).get("Messages", [])
    assert [json.loads(m["Body"])["job_id"] for m in got] == ["p1"]
    again = run(aws, "jobs", "resume", "p1")  # queued, not parked: a clear refusal
    assert again.exit_code != 0 and "not parked" in again.output


ASYNC_APP_SOURCE = """
import asyncio
from pydantic import BaseModel
from sqs_lease import App, AsyncJobContext

app = App()


class Doc(BaseModel):
    doc: str


@app.job("lower", payload=Doc, lease_seconds=10, heartbeat_seconds=2, jitter_seconds=1)
async def lower(ctx: AsyncJobContext[Doc], payload: Doc) -> dict[str, str]:
    await ctx.check()
    await asyncio.sleep(0.1)
    return {"text": payload.doc.lower(), "ctx": type(ctx).__name__}
"""


@pytest.mark.integration
def test_worker_picks_the_async_shell_for_async_handlers_and_refuses_threads_for_them(
    aws: AwsTestEnv,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    restore_journal: None,
) -> None:
    module = f"cli_async_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(ASYNC_APP_SOURCE))
    plain = f"cli_plain_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{plain}.py").write_text(textwrap.dedent(APP_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    ready(aws)
    line = assert_one_line_error(run(aws, "worker", f"{module}:app", "--threads"))
    assert "lower" in line and "AsyncWorker" in line

    sub = run(aws, "submit", "lower", "--payload", '{"doc": "ABC"}', "--id", "a1")
    assert sub.exit_code == 0, sub.output
    args = ("--idle-exit", "2", "--receive-wait", "1")
    result = run(aws, "worker", f"{module}:app", *args)
    assert result.exit_code == 0, (result.output, result.exception)
    events = [json.loads(line) for line in result.stderr.splitlines()]
    started = [e for e in events if e["event"] == "worker_started"]
    assert [(e["shell"], e["concurrency"]) for e in started] == [("async", 1000)]
    record = json.loads(run(aws, "jobs", "show", "a1", "--result", "--json").stdout)
    assert record["result"] == {"text": "abc", "ctx": "AsyncJobContext"}

    # --async runs plain handlers under the async shell too (in its thread pool).
    sub = run(aws, "submit", "upper", "--payload", '{"doc": "abc"}', "--id", "p1")
    assert sub.exit_code == 0, sub.output
    result = run(aws, "worker", f"{plain}:app", "--async", "--concurrency", "7", *args)
    assert result.exit_code == 0, (result.output, result.exception)
    events = [json.loads(line) for line in result.stderr.splitlines()]
    started = [e for e in events if e["event"] == "worker_started"]
    assert [(e["shell"], e["concurrency"]) for e in started] == [("async", 7)]
    record = json.loads(run(aws, "jobs", "show", "p1", "--result", "--json").stdout)
    assert record["result"] == {"text": "ABC"}


STAGED_APP_SOURCE = """
from pydantic import BaseModel
from sqs_lease import App, NextStage

app = App()


class Doc(BaseModel):
    doc: str


report = app.staged("report", payload=Doc, lease_seconds=10, heartbeat_seconds=2, jitter_seconds=1)


@report.stage("fetch")
def fetch(ctx, p):
    return NextStage("render", {"doc": p.doc})


@report.stage("render")
def render(ctx, p):
    return {"done": True}
"""


@pytest.mark.integration
def test_submit_of_a_staged_job_to_a_fifo_session_needs_interleave_stages(
    aws: AwsTestEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"cli_staged_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(STAGED_APP_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = f"{module}:app"
    assert run(aws, "tables", "create").exit_code == 0
    assert run(aws, "--fifo", "queue", "create").exit_code == 0
    args = ("submit", "report", "--payload", '{"doc": "a"}', "--app", spec, "--group", "s")
    refused = run(aws, "--fifo", *args, "--id", "r1")
    assert "--interleave-stages" in assert_one_line_error(refused)
    ok = run(aws, "--fifo", *args, "--id", "r2", "--interleave-stages")
    assert ok.exit_code == 0, ok.output
