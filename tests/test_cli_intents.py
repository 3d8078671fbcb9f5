"""``sqs-lease intents list/show/resolve`` against a real moto server (CliRunner)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from click.testing import CliRunner, Result
from conftest import AwsTestEnv

from sqs_lease._config import Settings
from sqs_lease._journal import LOGGER_NAME
from sqs_lease._schema.models import AttemptRecord, IntentRecord, JobRecord
from sqs_lease.cli import cli

pytestmark = pytest.mark.integration


def run(aws: AwsTestEnv, *args: str) -> Result:
    return CliRunner().invoke(
        cli, ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix, *args]
    )


def one_line_error(result: Result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def usage_error(result: Result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    assert "Error:" in result.stderr
    return result.stderr


@pytest.fixture(autouse=True)
def restore_journal() -> Iterator[None]:
    """``intents resolve`` binds a stderr handler to the runner's stream: undo it after."""
    logger = logging.getLogger(LOGGER_NAME)
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    try:
        yield
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


@dataclass
class Parked:
    """A job parked on an ambiguous intent, written straight into the tables."""

    aws: AwsTestEnv
    settings: Settings
    ddb: Any
    sqs: Any
    job_id: str
    job_class: str
    key: str
    secret: str

    def job(self) -> JobRecord:
        item = self.ddb.get_item(
            TableName=self.settings.jobs_table,
            Key={"job_id": {"S": self.job_id}},
            ConsistentRead=True,
        )["Item"]
        rec: JobRecord = JobRecord.from_raw_data(item)
        return rec

    def intent(self, key: str | None = None) -> IntentRecord:
        item = self.ddb.get_item(
            TableName=self.settings.intents_table,
            Key={"intent_key": {"S": key or self.key}},
            ConsistentRead=True,
        )["Item"]
        rec: IntentRecord = IntentRecord.from_raw_data(item)
        return rec

    def queue_url(self) -> str:
        return str(self.sqs.get_queue_url(QueueName=self.settings.queue)["QueueUrl"])

    def add_ambiguous(
        self, key: str, job_id: str | None = None, key_retention: float | None = 86_400
    ) -> None:
        now = time.time()
        intent = IntentRecord(
            intent_key=key,
            job_id=job_id or self.job_id,
            stage="main",
            action="capture",
            target="payments",
            state="ambiguous",
            payload=json.dumps({"invoice": "inv-7", "card": self.secret}),
            payload_hash="ab" * 32,
            attempts=2,
            last_token=3,
            key_retention=key_retention,
            reason="cannot tell whether capture at payments applied: check raised Timeout",
            created_at=now - 120,
            updated_at=now - 5,
            first_started_at=now - 110,
            success="accepted",
            attention="ambiguous",  # as the library's mark_ambiguous writes it
        )
        self.ddb.put_item(TableName=self.settings.intents_table, Item=intent.serialize())


@pytest.fixture
def parked(aws: AwsTestEnv) -> Parked:
    assert run(aws, "tables", "create").exit_code == 0
    assert run(aws, "queue", "create").exit_code == 0
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    ddb = boto3.client("dynamodb", endpoint_url=aws.endpoint_url, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=aws.endpoint_url, region_name="us-east-1")
    p = Parked(
        aws=aws,
        settings=settings,
        ddb=ddb,
        sqs=sqs,
        job_id=f"job-{uuid.uuid4().hex[:8]}",
        job_class="billing",
        key="",
        secret=f"SECRET-{uuid.uuid4().hex}",
    )
    p.key = f"{p.job_id}:main:capture:payments"
    now = time.time()
    job = JobRecord(
        job_id=p.job_id,
        job_class=p.job_class,
        state="parked",
        owner="w-1",
        token=3,
        attempt=3,
        payload=json.dumps({"invoice": "inv-7"}),
        payload_hash="cd" * 32,
        message_sent=True,
        reason="intent ambiguous",
        error_code="parked",
        created_at=now - 300,
        updated_at=now - 5,
        attention="parked",  # as the library's park writes it
    )
    ddb.put_item(TableName=settings.jobs_table, Item=job.serialize())
    p.add_ambiguous(p.key)
    for n, (token, worker, outcome, error, started, ended) in enumerate(
        [
            (2, "w-0", "unknown", "ToolOutcomeUnknown: read timeout", now - 110, now - 80),
            (3, "w-1", "unknown", "TimeoutError: no answer", now - 60, now - 30.5),
        ],
        start=1,
    ):
        attempt = AttemptRecord(
            intent_key=p.key,
            attempt=n,
            job_id=p.job_id,
            token=token,
            worker=worker,
            tool="payments",
            action="capture",
            payload_hash="ab" * 32,
            started_at=started,
            ended_at=ended,
            outcome=outcome,
            error=error,
            success="accepted",
        )
        ddb.put_item(TableName=settings.attempts_table, Item=attempt.serialize())
    return p


# --------------------------------------------------------------------------- list


def test_list_shows_the_ambiguous_intent_and_filters(parked: Parked) -> None:
    other = f"other-{uuid.uuid4().hex[:6]}:main:refund:payments"
    parked.add_ambiguous(other, job_id="another-job")

    result = run(parked.aws, "intents", "list")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:5] == ["KEY", "JOB", "ACTION", "TARGET", "STATE"]
    row = next(line for line in lines if line.startswith(parked.key))
    assert parked.job_id in row and "capture" in row and "payments" in row
    assert "ambiguous" in row and "cannot tell" in row
    assert any(line.startswith(other) for line in lines)
    assert parked.secret not in result.output

    result = run(parked.aws, "intents", "list", "--state", "ambiguous")
    assert result.exit_code == 0
    assert parked.key in result.stdout and other in result.stdout

    result = run(parked.aws, "intents", "list", "--state", "confirmed")
    assert result.exit_code == 2  # no index holds confirmed intents: a Scan, only if asked
    assert "--scan" in result.output and "--state ambiguous" in result.output
    result = run(parked.aws, "intents", "list", "--state", "confirmed", "--scan")
    assert result.exit_code == 0
    assert parked.key not in result.stdout and other not in result.stdout

    result = run(parked.aws, "intents", "list", "--job", parked.job_id, "--scan")
    assert result.exit_code == 0
    assert parked.key in result.stdout and other not in result.stdout

    result = run(
        parked.aws, "intents", "list", "--job", parked.job_id, "--state", "prepared", "--scan"
    )
    assert result.exit_code == 0
    assert parked.key not in result.stdout

    result = run(parked.aws, "intents", "list", "--json", "--state", "ambiguous", "--limit", "1")
    assert result.exit_code == 0
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 1
    assert rows[0]["state"] == "ambiguous" and rows[0]["attempts"] == 2
    assert "payload" not in rows[0] and parked.secret not in result.output


def test_the_indexed_ambiguous_listing_shows_every_field_the_table_listing_shows(
    parked: Parked,
) -> None:
    """The ``ambiguous`` index projects only some attributes: a listed field it lacked
    would come out empty from the Query although the record has it."""
    indexed = run(parked.aws, "intents", "list", "--json", "--state", "ambiguous")
    from_table = run(parked.aws, "intents", "list", "--json")
    assert indexed.exit_code == 0 and from_table.exit_code == 0, indexed.output
    by_key = {r["intent_key"]: r for r in _rows(from_table.stdout)}
    rows = _rows(indexed.stdout)
    assert rows and all(r["updated_at"] and r["created_at"] for r in rows)
    assert rows == [by_key[r["intent_key"]] for r in rows]


def _rows(out: str) -> list[dict[str, object]]:
    """JSON rows without the ages (computed from the moment of each listing)."""
    rows = [json.loads(line) for line in out.splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith("_age")} for r in rows]


def test_list_without_tables_says_how_to_create_them(aws: AwsTestEnv) -> None:
    line = one_line_error(run(aws, "intents", "list"), 2)
    assert "tables create" in line


# --------------------------------------------------------------------------- show


def test_show_prints_intent_and_every_attempt_but_not_the_payload(parked: Parked) -> None:
    result = run(parked.aws, "intents", "show", parked.key)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"intent_key: {parked.key}" in out
    assert "state: ambiguous" in out
    assert f"payload_hash: {'ab' * 32}" in out
    assert "cannot tell whether capture" in out
    assert "attempt log: 2" in out
    assert "- attempt: 1" in out and "- attempt: 2" in out
    assert out.index("- attempt: 1") < out.index("- attempt: 2")
    assert "worker: w-0" in out and "worker: w-1" in out
    assert "ToolOutcomeUnknown: read timeout" in out and "TimeoutError: no answer" in out
    assert "duration: 30.0s" in out and "duration: 29.5s" in out
    assert "outcome: unknown" in out
    assert out.count("success: accepted") == 3  # what success means: intent, each attempt
    assert "resolution" not in out  # not resolved yet
    assert parked.secret not in result.output and "payload:" not in out

    result = run(parked.aws, "intents", "show", parked.key, "--payload")
    assert result.exit_code == 0
    assert parked.secret in result.stdout

    result = run(parked.aws, "intents", "show", parked.key, "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["intent"]["state"] == "ambiguous"
    assert "payload" not in data["intent"] and parked.secret not in result.stdout
    assert [a["attempt"] for a in data["attempts"]] == [1, 2]
    assert [a["token"] for a in data["attempts"]] == [2, 3]


def test_show_keeps_the_targets_response_out_unless_asked(parked: Parked) -> None:
    # The response is kept on the intent for replays; like the payload, it is a body:
    # printed only on request (the attempt log has one only where the target logs bodies).
    parked.ddb.update_item(
        TableName=parked.settings.intents_table,
        Key={"intent_key": {"S": parked.key}},
        UpdateExpression="SET #r = :r",
        ExpressionAttributeNames={"#r": "response"},
        ExpressionAttributeValues={":r": {"S": json.dumps({"receipt": "rcpt-secret-77"})}},
    )
    for args in ((), ("--json",)):
        result = run(parked.aws, "intents", "show", parked.key, *args)
        assert result.exit_code == 0, result.output
        assert "rcpt-secret-77" not in result.stdout
    shown = run(parked.aws, "intents", "show", parked.key, "--response")
    assert '"receipt": "rcpt-secret-77"' in shown.stdout
    data = json.loads(run(parked.aws, "intents", "show", parked.key, "--response", "--json").stdout)
    assert data["intent"]["response"] == {"receipt": "rcpt-secret-77"}


def test_show_unknown_key_exits_1(parked: Parked) -> None:
    line = one_line_error(run(parked.aws, "intents", "show", "no-such-key"), 1)
    assert "no intent 'no-such-key'" in line


# --------------------------------------------------------------------------- resolve


def test_resolve_confirmed_requeues_the_job_and_journals(parked: Parked) -> None:
    result = run(
        parked.aws,
        "intents",
        "resolve",
        parked.key,
        "--confirmed",
        "ext_123",
        "--reason",
        "seen in the payments dashboard",
        "--who",
        "alice@ops",
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout.strip().split("\t") == [
        parked.key,
        "confirmed",
        f"job {parked.job_id} re-enqueued (one attempt granted)",
    ]
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    resolved = [e for e in events if e["event"] == "intent_resolved"]
    assert len(resolved) == 1
    assert resolved[0]["key"] == parked.key and resolved[0]["who"] == "alice@ops"
    assert resolved[0]["resolution"] == "confirmed" and resolved[0]["external_id"] == "ext_123"

    intent = parked.intent()
    assert intent.state == "confirmed" and intent.external_id == "ext_123"
    assert intent.resolution == "confirmed" and intent.resolved_by == "alice@ops"
    assert intent.resolution_reason == "seen in the payments dashboard"
    assert intent.resolved_at is not None

    job = parked.job()
    assert job.state == "queued"
    assert job.granted_attempts == 1  # the resume does not spend the job's own attempts

    msgs = parked.sqs.receive_message(
        QueueUrl=parked.queue_url(), MaxNumberOfMessages=10, WaitTimeSeconds=1
    ).get("Messages", [])
    assert len(msgs) == 1
    body = json.loads(msgs[0]["Body"])
    assert body["job_id"] == parked.job_id and body["job_class"] == parked.job_class
    assert body["send_id"] == job.send_id and job.message_sent is True

    shown = run(parked.aws, "intents", "show", parked.key)
    assert shown.exit_code == 0
    assert "resolution: confirmed" in shown.stdout
    assert "resolved_by: alice@ops" in shown.stdout
    assert "resolution_reason: seen in the payments dashboard" in shown.stdout
    assert "external_id: ext_123" in shown.stdout

    # Resolving it again changes nothing, says so plainly and exits 3 (not an error).
    again = run(parked.aws, "intents", "resolve", parked.key, "--confirmed", "ext_123")
    assert again.exit_code == 3, (again.output, again.exception)
    assert again.stdout.startswith("nothing to do: ") and parked.key in again.stdout
    assert "already confirmed" in again.stdout and "Traceback" not in again.output
    as_json = run(parked.aws, "intents", "resolve", parked.key, "--confirmed", "x", "--json")
    assert as_json.exit_code == 3
    assert json.loads(as_json.stdout) == {
        "key": parked.key,
        "verdict": "already_final",
        "state": "confirmed",
    }


def test_resolve_defaults_reason_and_who(parked: Parked) -> None:
    result = run(parked.aws, "intents", "resolve", parked.key, "--confirmed", "ext_9")
    assert result.exit_code == 0, (result.output, result.exception)
    intent = parked.intent()
    assert intent.resolution_reason == "resolved by operator"
    assert intent.resolved_by and "@" in intent.resolved_by


def test_resolve_retry_puts_the_intent_back_to_prepared(parked: Parked) -> None:
    result = run(parked.aws, "intents", "resolve", parked.key, "--retry", "--reason", "not there")
    assert result.exit_code == 0, (result.output, result.exception)
    assert "\tprepared\t" in result.stdout
    intent = parked.intent()
    assert intent.state == "prepared" and intent.resolution == "retry"
    assert parked.job().state == "queued"


def test_resolve_naming_another_attempt_than_the_intents_changes_nothing(parked: Parked) -> None:
    """A resolve run again names the attempt it decided on; once the intent is at
    another attempt (the job ran again and went ambiguous again) it is refused."""
    attempts = parked.intent().attempts
    stale = run(
        parked.aws, "intents", "resolve", parked.key, "--retry", "--attempt", str(attempts + 1)
    )
    assert stale.exit_code in (1, 2)
    line = one_line_error(stale, stale.exit_code)
    assert "changed meanwhile" in line and f"attempt {attempts}" in line
    assert parked.intent().state == "ambiguous" and parked.job().state == "parked"
    named = run(parked.aws, "intents", "resolve", parked.key, "--retry", "--attempt", str(attempts))
    assert named.exit_code == 0, (named.output, named.exception)
    assert parked.intent().state == "prepared" and parked.job().state == "queued"


@pytest.mark.parametrize(
    ("retention", "why"),
    [(None, "does not keep idempotency keys"), (60.0, "no longer protected")],
)
def test_resolve_retry_where_the_key_is_unprotected_needs_force(
    parked: Parked, retention: float | None, why: str
) -> None:
    key = f"{parked.job_id}:main:capture:legacy"
    parked.add_ambiguous(key, key_retention=retention)  # first attempt 110 s ago
    assert why in usage_error(run(parked.aws, "intents", "resolve", key, "--retry"))
    assert parked.intent(key).state == "ambiguous"  # nothing was decided
    forced = run(parked.aws, "intents", "resolve", key, "--retry", "--force")
    assert forced.exit_code == 0, (forced.output, forced.exception)
    assert parked.intent(key).state == "prepared"


def test_resolve_abandon_needs_a_reason(parked: Parked) -> None:
    assert "--reason" in usage_error(run(parked.aws, "intents", "resolve", parked.key, "--abandon"))
    assert parked.intent().state == "ambiguous"

    result = run(parked.aws, "intents", "resolve", parked.key, "--abandon", "--reason", "x")
    assert result.exit_code == 0, (result.output, result.exception)
    assert "\tabandoned\t" in result.stdout
    intent = parked.intent()
    assert intent.state == "abandoned" and intent.resolution_reason == "x"


def test_resolve_job_not_parked_is_not_requeued(parked: Parked) -> None:
    other = f"{parked.job_id}:main:notify:mail"
    parked.add_ambiguous(other)
    first = run(parked.aws, "intents", "resolve", parked.key, "--retry")
    assert first.exit_code == 0
    second = run(parked.aws, "intents", "resolve", other, "--retry")
    assert second.exit_code == 0, (second.output, second.exception)
    assert "not re-enqueued" in second.stdout
    assert parked.intent(other).state == "prepared"


def test_resolve_unknown_key_is_one_clear_line(parked: Parked) -> None:
    result = run(parked.aws, "intents", "resolve", "no-such-key", "--retry")
    assert result.exit_code in (1, 2)
    line = one_line_error(result, result.exit_code)
    assert "no intent 'no-such-key'" in line


@pytest.mark.parametrize(
    "options",
    [
        ["--confirmed", "ext_1", "--retry"],
        ["--retry", "--abandon", "--reason", "x"],
        ["--confirmed", "ext_1", "--abandon", "--reason", "x"],
        [],
    ],
)
def test_resolve_needs_exactly_one_decision(parked: Parked, options: list[str]) -> None:
    assert "exactly one" in usage_error(run(parked.aws, "intents", "resolve", parked.key, *options))
    assert parked.intent().state == "ambiguous"


def test_resolve_new_operation_records_the_successor_and_requeues_the_job(parked: Parked) -> None:
    missing = run(parked.aws, "intents", "resolve", parked.key, "--new-operation")
    assert missing.exit_code == 2 and "--reason" in missing.output
    result = run(
        parked.aws,
        "intents",
        "resolve",
        parked.key,
        "--new-operation",
        "--reason",
        "card re-authorised: capture again as a new charge",
        "--who",
        "ops@example",
    )
    assert result.exit_code == 0, result.output
    intent = parked.intent()
    assert intent.state == "superseded"
    assert intent.successor == f"{parked.key}~op2"
    assert intent.resolution == "new_operation" and intent.resolved_by == "ops@example"
    assert intent.reason == "card re-authorised: capture again as a new charge"
    assert parked.job().state == "queued"
    shown = run(parked.aws, "intents", "show", parked.key)
    assert f"successor: {parked.key}~op2" in shown.stdout
