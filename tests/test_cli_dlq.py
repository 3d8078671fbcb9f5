"""``sqs-lease dlq list|show|redrive`` against a real moto server (CliRunner)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import AwsTestEnv

from sqs_lease import _dlq, _resources
from sqs_lease._config import Settings
from sqs_lease._core.messages import message_body
from sqs_lease._errors import AwsCallFailed, AwsUnavailable
from sqs_lease._resources import create_queue, create_tables
from sqs_lease.cli import cli

pytestmark = pytest.mark.integration


def run(aws: AwsTestEnv, *args: str, answer: str | None = None) -> Result:
    return CliRunner().invoke(
        cli, ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix, *args], input=answer
    )


class Dlq:
    """A job queue whose DLQ holds three messages: a job message the worker moved
    there with its reason, one SQS's redrive moved (no reason), and a non-JSON body."""

    def __init__(self, aws: AwsTestEnv, sqs: Any) -> None:
        self.aws = aws
        self.sqs = sqs
        settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
        create_tables(settings)
        self.queue, self.dlq = create_queue(settings)
        self.poisoned = sqs.send_message(
            QueueUrl=self.dlq,
            MessageBody=message_body("j1", "ocr", send_id="s1"),
            MessageAttributes={
                "sqs_lease_reason": {
                    "DataType": "String",
                    "StringValue": "job record unreadable: state 'weird' is not one this "
                    "version knows; fix the record or run the version that wrote it",
                }
            },
        )["MessageId"]
        self.redriven = sqs.send_message(
            QueueUrl=self.dlq, MessageBody=message_body("j2", "ocr", send_id="s2")
        )["MessageId"]
        self.garbage = sqs.send_message(QueueUrl=self.dlq, MessageBody="not json at all")[
            "MessageId"
        ]

    def bodies(self, url: str) -> list[tuple[str, dict[str, Any]]]:
        """Every message on ``url`` (received, then made visible again)."""
        got: dict[str, Any] = {}
        for _ in range(5):
            batch = self.sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=1,
                VisibilityTimeout=30,
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            if not batch:
                break
            for m in batch:
                got[m["MessageId"]] = m
        for m in got.values():
            self.sqs.change_message_visibility(
                QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
            )
        return sorted((m["Body"], m.get("MessageAttributes", {})) for m in got.values())


@pytest.fixture
def dlq(aws: AwsTestEnv, sqs_client: Any) -> Dlq:
    return Dlq(aws, sqs_client)


def test_dlq_list_shows_each_message_with_its_whole_reason_and_gives_them_back(dlq: Dlq) -> None:
    listed = run(dlq.aws, "dlq", "list")
    assert listed.exit_code == 0, (listed.output, listed.exception)
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:3] == ["MESSAGE", "ID", "JOB"]
    assert len(rows) == 3
    text = listed.stdout
    assert "run the version that wrote it" in text  # the whole reason, not cut
    assert "redrive policy" in text and "not JSON" in text
    # Looking took nothing away: all three are visible again at once.
    assert len(dlq.bodies(dlq.dlq)) == 3

    as_json = run(dlq.aws, "dlq", "list", "--json")
    records = {r["message_id"]: r for r in map(json.loads, as_json.stdout.splitlines())}
    assert set(records) == {dlq.poisoned, dlq.redriven, dlq.garbage}
    first = records[dlq.poisoned]
    assert list(first) == [
        "message_id",
        "source_message_id",
        "job_id",
        "job_class",
        "send_id",
        "reason",
        "receive_count",
        "sent_at",
        "is_job_message",
    ]
    assert (first["job_id"], first["job_class"], first["send_id"]) == ("j1", "ocr", "s1")
    assert records[dlq.garbage]["is_job_message"] is False


def test_dlq_list_says_what_receives_counts(dlq: Dlq) -> None:
    first = run(dlq.aws, "dlq", "list", "--json")
    counts = {
        r["message_id"]: r["receive_count"] for r in map(json.loads, first.stdout.splitlines())
    }
    # each look is a receive: the count names it, and the human view says so
    helped = run(dlq.aws, "dlq", "list", "--help")
    assert "each look at the DLQ, this one included" in " ".join(helped.stdout.split())
    run(dlq.aws, "dlq", "list")
    second = run(dlq.aws, "dlq", "list", "--json")
    again = {
        r["message_id"]: r["receive_count"] for r in map(json.loads, second.stdout.splitlines())
    }
    assert all(again[m] == counts[m] + 2 for m in counts), (counts, again)


def test_dlq_delete_asks_then_deletes_only_what_it_names(dlq: Dlq) -> None:
    declined = run(dlq.aws, "dlq", "delete", dlq.garbage, answer="n\n")
    assert declined.exit_code == 1 and "nothing deleted" in declined.stderr
    assert dlq.garbage in declined.stderr  # shown before the question
    assert len(dlq.bodies(dlq.dlq)) == 3  # given back, all of them

    agreed = run(dlq.aws, "dlq", "delete", dlq.garbage, answer="y\n")
    assert agreed.exit_code == 0, (agreed.output, agreed.exception)
    left = dlq.bodies(dlq.dlq)
    assert [json.loads(b)["job_id"] for b, _ in left] == ["j1", "j2"]

    by_job = run(dlq.aws, "dlq", "delete", "j2", "--yes", "--json")
    assert by_job.exit_code == 0, by_job.output
    assert json.loads(by_job.stdout) == {"deleted": [dlq.redriven], "failed": []}
    ((body, _),) = dlq.bodies(dlq.dlq)
    assert json.loads(body)["job_id"] == "j1"

    missing = run(dlq.aws, "dlq", "delete", "nope", "--yes", "--json")
    assert missing.exit_code == 1
    assert json.loads(missing.stdout)["code"] == "message_not_found"


def test_dlq_list_says_when_limit_left_messages_out(dlq: Dlq) -> None:
    cut = run(dlq.aws, "dlq", "list", "--limit", "2")
    assert cut.exit_code == 0, cut.output
    assert len(cut.stdout.splitlines()) == 3  # header and two rows
    assert "--limit 2 reached" in cut.stderr and "about 3" in cut.stderr
    whole = run(dlq.aws, "dlq", "list", "--limit", "3")
    assert whole.stderr == ""


def test_dlq_show_finds_a_message_by_job_id_or_message_id_with_its_body(dlq: Dlq) -> None:
    by_job = run(dlq.aws, "dlq", "show", "j1")
    assert by_job.exit_code == 0, by_job.output
    fields = dict(line.split(": ", 1) for line in by_job.stdout.splitlines())
    assert fields["message_id"] == dlq.poisoned
    assert json.loads(fields["body"])["send_id"] == "s1"
    by_id = run(dlq.aws, "dlq", "show", dlq.garbage, "--json")
    (msg,) = json.loads(by_id.stdout)["messages"]
    assert msg["body"] == "not json at all"
    missing = run(dlq.aws, "dlq", "show", "nope")
    assert missing.exit_code == 1 and "no DLQ message" in missing.stderr


def test_dlq_redrive_moves_chosen_job_messages_back_and_leaves_the_rest(dlq: Dlq) -> None:
    dry = run(dlq.aws, "dlq", "redrive", "--dry-run")
    assert dry.exit_code == 0, dry.output
    # the dry run counts what the real run moves: two job messages, the junk skipped
    summary = dry.stdout.splitlines()[-1]
    assert summary.startswith("2 would move, 1 skipped"), summary
    assert dlq.bodies(dlq.queue) == [] and len(dlq.bodies(dlq.dlq)) == 3

    one = run(dlq.aws, "dlq", "redrive", "--job", "j1")
    assert one.exit_code == 0, (one.output, one.exception)
    assert "1 moved back" in one.stdout
    ((body, attrs),) = dlq.bodies(dlq.queue)
    assert json.loads(body) == json.loads(message_body("j1", "ocr", send_id="s1"))
    assert "sqs_lease_reason" not in attrs  # the copy starts afresh
    assert len(dlq.bodies(dlq.dlq)) == 2

    rest = run(dlq.aws, "dlq", "redrive", "--json")
    assert rest.exit_code == 0, rest.output
    report = json.loads(rest.stdout)
    verdicts = {m["job_id"]: m["verdict"] for m in report["messages"]}
    assert verdicts == {"j2": "moved", None: "skipped"}
    again = run(dlq.aws, "dlq", "redrive", "--dry-run")
    assert again.stdout.splitlines()[-1].startswith("0 would move, 1 skipped"), again.stdout
    assert report["more"] is False
    assert [json.loads(b)["job_id"] for b, _ in dlq.bodies(dlq.queue)] == ["j1", "j2"]
    ((left, _),) = dlq.bodies(dlq.dlq)
    assert left == "not json at all"


def test_dlq_redrive_deletes_a_message_only_after_its_copy_was_sent(
    dlq: Dlq, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = _resources._call

    def failing_send(client: Any, op: str, **params: Any) -> Any:
        calls.append(op)
        if op == "send_message":
            raise AwsCallFailed("SendMessage: InternalError: injected", "InternalError")
        return real(client, op, **params)

    monkeypatch.setattr(_dlq, "_call", failing_send)
    failed = run(dlq.aws, "dlq", "redrive", "--job", "j1")
    assert failed.exit_code == 1, failed.output
    assert "failed: send to the job queue failed, left in the DLQ" in failed.stdout
    assert "delete_message" not in calls
    monkeypatch.setattr(_dlq, "_call", real)
    assert len(dlq.bodies(dlq.dlq)) == 3 and dlq.bodies(dlq.queue) == []


def test_dlq_redrive_keeps_the_dlq_copy_when_its_delete_fails(
    dlq: Dlq, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _resources._call
    order: list[str] = []

    def failing_delete(client: Any, op: str, **params: Any) -> Any:
        order.append(op)
        if op == "delete_message":
            raise AwsUnavailable("DeleteMessage: injected: did not answer")
        return real(client, op, **params)

    monkeypatch.setattr(_dlq, "_call", failing_delete)
    kept = run(dlq.aws, "dlq", "redrive", "--job", "j2", "--json")
    assert kept.exit_code == 0, kept.output
    (msg,) = json.loads(kept.stdout)["messages"]
    assert msg["verdict"] == "copied_not_deleted" and msg["new_message_id"]
    assert order.index("send_message") < order.index("delete_message")
    monkeypatch.setattr(_dlq, "_call", real)
    assert [json.loads(b)["job_id"] for b, _ in dlq.bodies(dlq.queue)] == ["j2"]


def test_a_queue_without_a_dlq_says_how_to_make_one(aws: AwsTestEnv, sqs_client: Any) -> None:
    sqs_client.create_queue(QueueName=f"{aws.prefix}-jobs")
    result = run(aws, "dlq", "list")
    assert result.exit_code == 2
    assert "no dead-letter queue" in result.stderr and "sqs-lease queue create" in result.stderr
