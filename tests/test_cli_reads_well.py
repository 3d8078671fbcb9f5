"""The CLI as a new user meets it (issue 13.5): whole reasons, a note when --limit
cut a list, --json on every command, --version, a plain no-op (exit 3) for a cancel
or resume with nothing to do, submit saying when it did not validate, and shell
completion. CliRunner against a real moto server."""

from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import AwsTestEnv

from sqs_lease import Producer, Settings
from sqs_lease._cli_out import table
from sqs_lease._resources import create_queue, create_tables
from sqs_lease._schema.models import IntentRecord
from sqs_lease.cli import cli

ROOT = Path(__file__).resolve().parent.parent
LONG_REASON = (
    "the customer's session ended before the export finished; the partial files were "
    "removed and the request must be submitted again by the account owner"
)


def run(aws: AwsTestEnv, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner(env=env).invoke(
        cli, ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix, *args]
    )


def ready(aws: AwsTestEnv) -> Settings:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    create_queue(settings)
    return settings


# --------------------------------------------------------------------------- no AWS


def test_version_prints_the_package_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith("sqs-lease ")
    assert CliRunner().invoke(cli, ["-V"]).stdout == result.stdout


def test_a_table_wraps_its_last_column_within_the_width_and_keeps_every_word() -> None:
    rows = [["JOB ID", "STATE", "REASON"], ["j1", "failed", LONG_REASON], ["j22", "queued", "-"]]
    text = table(rows, width=60)
    lines = text.splitlines()
    assert all(len(line) <= 60 for line in lines)
    assert len(lines) > 3
    indent = lines[0].index("REASON")
    continued = [line for line in lines[2:] if not line.startswith("j22")]
    assert all(line[:indent].strip() == "" for line in continued)
    assert " ".join(line[indent:].strip() for line in lines[1:-1]) == LONG_REASON
    # No width (a pipe): one line per row, the reason whole.
    assert table(rows).splitlines()[1].endswith(LONG_REASON)


def test_shell_completion_script_is_printed_by_clicks_variable() -> None:
    result = CliRunner().invoke(
        cli, [], prog_name="sqs-lease", env={"_SQS_LEASE_COMPLETE": "bash_source"}
    )
    assert result.exit_code == 0
    assert "_sqs_lease_completion" in result.stdout and "complete " in result.stdout


def test_shell_completion_completes_command_names() -> None:
    result = CliRunner().invoke(
        cli,
        [],
        prog_name="sqs-lease",
        env={
            "_SQS_LEASE_COMPLETE": "bash_complete",
            "COMP_WORDS": "sqs-lease dl",
            "COMP_CWORD": "1",
        },
    )
    assert result.exit_code == 0
    assert "dlq" in result.stdout


# --------------------------------------------------------------------------- moto server

pytestmark_integration = pytest.mark.integration


@pytestmark_integration
def test_jobs_list_shows_the_whole_reason_and_wraps_it_to_the_terminal(aws: AwsTestEnv) -> None:
    settings = ready(aws)
    Producer(settings).submit("ocr", {"doc": "a"}, "r1")
    Producer(settings).cancel("r1", LONG_REASON)
    piped = run(aws, "jobs", "list")
    assert piped.exit_code == 0, piped.output
    (row,) = piped.stdout.splitlines()[1:]
    assert row.endswith(f"cancelled: {LONG_REASON}")  # whole, not cut at 40 characters

    narrow = run(aws, "jobs", "list", env={"COLUMNS": "100"})
    lines = narrow.stdout.splitlines()
    assert all(len(line) <= 100 for line in lines) and len(lines) > 2
    start = lines[0].index("REASON")
    assert " ".join(line[start:].strip() for line in lines[1:]) == f"cancelled: {LONG_REASON}"


@pytestmark_integration
def test_jobs_list_notes_on_stderr_when_limit_cut_the_list(aws: AwsTestEnv) -> None:
    settings = ready(aws)
    for i in range(3):
        Producer(settings).submit("ocr", {"doc": str(i)}, f"l{i}")
    cut = run(aws, "jobs", "list", "--limit", "2")
    assert cut.exit_code == 0, cut.output
    assert len(cut.stdout.splitlines()) == 3
    assert "note: --limit 2 reached: more jobs exist" in cut.stderr
    assert "raise --limit" in cut.stderr
    cut_json = run(aws, "jobs", "list", "--limit", "2", "--json")
    assert len([json.loads(x) for x in cut_json.stdout.splitlines()]) == 2
    assert "--limit 2 reached" in cut_json.stderr  # stdout stays JSON lines
    whole = run(aws, "jobs", "list", "--limit", "3")
    assert whole.stderr == "" and len(whole.stdout.splitlines()) == 4


@pytestmark_integration
def test_intents_list_notes_when_limit_cut_the_list(aws: AwsTestEnv, ddb_client: Any) -> None:
    settings = ready(aws)
    now = time.time()
    for i in range(2):
        record = IntentRecord(
            intent_key=f"k{i}",
            job_id=f"j{i}",
            stage="main",
            action="capture",
            target="payments",
            state="ambiguous",
            payload="{}",
            payload_hash="h",
            attempts=1,
            last_token=1,
            created_at=now,
            updated_at=now,
            reason=LONG_REASON,
        )
        ddb_client.put_item(TableName=settings.intents_table, Item=record.serialize())
    cut = run(aws, "intents", "list", "--limit", "1")
    assert cut.exit_code == 0, cut.output
    assert "--limit 1 reached: more intents exist" in cut.stderr
    whole = run(aws, "intents", "list")
    assert whole.stderr == ""
    assert all(row.endswith(LONG_REASON) for row in whole.stdout.splitlines()[1:])


@pytestmark_integration
def test_cancelling_a_job_already_final_says_nothing_to_do_and_exits_3(aws: AwsTestEnv) -> None:
    settings = ready(aws)
    Producer(settings).submit("ocr", {"doc": "a"}, "c1")
    first = run(aws, "jobs", "cancel", "c1", "--json")
    assert first.exit_code == 0, first.output
    data = json.loads(first.stdout)
    assert list(data) == ["job_id", "verdict", "state", "token", "error_code", "reason"]
    assert (data["verdict"], data["state"], data["token"]) == ("cancelled", "cancelled", 1)
    # without --reason the record says who cancelled it, from where, and when
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    assert data["reason"].startswith(f"cancelled: cancelled by {who} at 20"), data["reason"]
    assert data["reason"].endswith("with sqs-lease jobs cancel")

    again = run(aws, "jobs", "cancel", "c1")
    assert again.exit_code == 3, (again.output, again.exception)
    assert again.stdout.startswith("nothing to do: job 'c1' is already cancelled")
    assert "not cancelled" in again.stdout and again.stderr == ""
    again_json = run(aws, "jobs", "cancel", "c1", "--json")
    assert again_json.exit_code == 3
    assert json.loads(again_json.stdout)["verdict"] == "already_final"
    assert json.loads(again_json.stdout)["token"] == 1  # nothing moved


@pytestmark_integration
def test_resuming_a_job_that_is_not_parked_says_nothing_to_do_and_exits_3(
    aws: AwsTestEnv,
) -> None:
    settings = ready(aws)
    Producer(settings).submit("ocr", {"doc": "a"}, "q1")
    result = run(aws, "jobs", "resume", "q1")
    assert result.exit_code == 3, result.output
    assert result.stdout.startswith("nothing to do: job 'q1' is queued, not parked")
    as_json = run(aws, "jobs", "resume", "q1", "--json")
    assert as_json.exit_code == 3
    assert json.loads(as_json.stdout)["verdict"] == "not_parked"


@pytestmark_integration
def test_submit_without_app_says_it_did_not_validate(aws: AwsTestEnv) -> None:
    ready(aws)
    result = run(aws, "submit", "ocr", "--payload", '{"doc": 1}', "--id", "s1")
    assert result.exit_code == 0, result.output
    assert result.stdout.split("\t")[:2] == ["s1", "created"]
    assert "note: payload not validated (no --app)" in result.stderr
    as_json = run(aws, "submit", "ocr", "--payload", '{"doc": 1}', "--id", "s1", "--json")
    data = json.loads(as_json.stdout)
    assert list(data) == [
        "job_id",
        "created",
        "note",
        "message_id",
        "send_id",
        "validated",
        "app",
    ]
    assert (data["created"], data["validated"], data["app"]) == (False, False, None)


APP = """
from pydantic import BaseModel
from sqs_lease import App, JobContext

app = App()


class Doc(BaseModel):
    doc: str


@app.job("ocr", payload=Doc)
def ocr(ctx: JobContext[Doc], payload: Doc) -> None:
    return None
"""


@pytestmark_integration
def test_submit_with_app_validates_and_says_so(
    aws: AwsTestEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "reads_well_app.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    ready(aws)
    bad = run(aws, "submit", "ocr", "--payload", '{"doc": 1}', "--app", "reads_well_app:app")
    assert bad.exit_code == 2 and "doc" in bad.stderr
    good = run(
        aws, "submit", "ocr", "--payload", '{"doc": "x"}', "--json",
        env={"SQS_LEASE_APP": "reads_well_app:app"},
    )  # fmt: skip
    assert good.exit_code == 0, good.output
    assert json.loads(good.stdout)["validated"] is True and good.stderr == ""


@pytestmark_integration
def test_every_command_that_changes_or_creates_something_answers_json(
    aws: AwsTestEnv, tmp_path: Path
) -> None:
    tables = run(aws, "tables", "create", "--json")
    made = json.loads(tables.stdout)
    assert list(made) == ["tables"]
    assert made["tables"][:3] == [f"{aws.prefix}-{t}" for t in ("jobs", "intents", "attempts")]
    queue = json.loads(run(aws, "queue", "create", "--json").stdout)
    assert list(queue) == ["queue", "dlq"] and queue["dlq"].endswith("-jobs-dlq")
    repair = run(aws, "jobs", "repair", "--dry-run", "--json")
    assert repair.exit_code == 0, repair.output
    assert json.loads(repair.stdout) == {"dry_run": True, "more": False, "jobs": []}


def test_every_command_takes_json() -> None:
    missing = []
    stack: list[tuple[str, Any]] = [("", cli)]
    while stack:
        path, command = stack.pop()
        sub = getattr(command, "commands", None)
        if sub:
            stack.extend((f"{path} {name}".strip(), c) for name, c in sub.items())
            continue
        if not any("--json" in p.opts for p in command.params):
            missing.append(path)
    assert missing == []


@pytestmark_integration
def test_local_json_prints_one_object_once_ready_and_stops_on_ctrl_c() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AWS_ENDPOINT_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sqs_lease.cli", "--prefix", "locj", "local", "--init", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        ready_line = proc.stdout.readline()  # blocks until ready (hang guard: the timeout)
        data = json.loads(ready_line)
        assert list(data) == ["endpoint", "tables", "queue", "dlq"]
        assert data["endpoint"].startswith("http://127.0.0.1:")
        assert data["tables"][0] == "locj-jobs" and data["dlq"].endswith("/locj-jobs-dlq")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0 and stdout == "" and "Traceback" not in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_aws_failure_names_the_api_operation_not_the_boto_method() -> None:
    # AWS's docs, IAM policies and CloudTrail say GetQueueUrl / DescribeTable: an
    # operator searches for those, not for boto3's get_queue_url.
    from botocore.stub import Stubber

    from sqs_lease import Settings
    from sqs_lease._aws import make_client
    from sqs_lease._errors import AwsCallFailed
    from sqs_lease._resources import _call

    # The client every command makes (its config, its local credentials), stubbed.
    sqs = make_client(Settings(endpoint_url="http://127.0.0.1:9", prefix="x"), "sqs")
    with Stubber(sqs) as stub:
        stub.add_client_error("get_queue_url", "AccessDenied", "no")
        with pytest.raises(AwsCallFailed) as caught:
            _call(sqs, "get_queue_url", missing=("queue 'q'", "make it"), QueueName="q")
    assert str(caught.value).startswith(
        "GetQueueUrl on SQS at http://127.0.0.1:9 (region us-east-1): AccessDenied"
    )
