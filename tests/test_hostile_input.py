"""Issue 32 item 1: no input from outside raises out of a worker's loop, a Lambda batch
or an operator command.

A message body, an event record, a stored record, a DLQ message or a journal line
is somebody else's text. Each reader is total: it returns a value or refuses that
one input with a typed error (poison, ``RecordUnreadable``, a skipped line), and
the loop goes on. Property tests (hypothesis) draw the hostile shapes: deep nesting,
huge numbers, lone surrogates, NUL and escapes, giant strings; the moto tests run
the real shells, the Lambda adapter and the DLQ commands on such a message.
"""

from __future__ import annotations

import contextlib
import json
import string
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner
from conftest import AwsTestEnv
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from worker_helpers import FAST, SHELLS, collect_journal, drain, prepare, queue_depth, read_record

from sqs_lease import App, ConfigError, JobContext, LimitExceeded, Producer, RecordUnreadable
from sqs_lease._core import inputs
from sqs_lease._core.eventsource import parse_event_record
from sqs_lease._core.liveness import liveness_of
from sqs_lease._core.messages import Delivery, Poison, message_body, parse_message
from sqs_lease._core.records import JobState, JobView
from sqs_lease._core.stages import stage_log
from sqs_lease._core.timeline import decode
from sqs_lease._journal import read_journal
from sqs_lease._schema.views import view_of
from sqs_lease.aws_lambda import handler
from sqs_lease.cli import cli

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

DEEP = "[" * 2000
"""The 2 KB body of the review: ``json.loads`` raised RecursionError on it."""

HOSTILE_BODIES = {
    "deep array": DEEP,
    "deep object": '{"job_id": ' + "[" * 5000,
    "deep but closed": "[" * 900 + "]" * 900,
    "deep valid job": json.dumps(
        {"v": 1, "job_id": "j", "job_class": "work", "x": json.loads("[" * 80 + "]" * 80)}
    ),
    "huge number": '{"v": 1, "job_id": "j", "job_class": "work", "stage": ' + "9" * 5000 + "}",
    "lone surrogate id": '{"v": 1, "job_id": "a\\ud800b", "job_class": "work"}',
    "NUL in id": json.dumps({"v": 1, "job_id": "a\u0000b", "job_class": "work"}),
    "ESC in id": json.dumps({"v": 1, "job_id": "a\u001b]0;owned\u0007", "job_class": "work"}),
    "bidi in id": json.dumps({"v": 1, "job_id": "a\u202eb", "job_class": "work"}),
    "giant id": json.dumps({"v": 1, "job_id": "x" * 200_000, "job_class": "work"}),
    "reserved id": json.dumps({"v": 1, "job_id": "worker#w1", "job_class": "work"}),
    "escape in class": json.dumps({"v": 1, "job_id": "j", "job_class": "w\u001b[2J"}),
    "giant class": json.dumps({"v": 1, "job_id": "j", "job_class": "w" * 100_000}),
    "bad stage": json.dumps({"v": 1, "job_id": "j", "job_class": "work", "stage": "a b"}),
    "bad send id": json.dumps({"v": 1, "job_id": "j", "job_class": "work", "send_id": "s\n1"}),
    "NaN": '{"v": NaN, "job_id": "j", "job_class": "work", "stage": Infinity}',
    "not JSON": "\udcff\x00",
}


def _msg(body: Any, attrs: Any = None) -> dict[str, Any]:
    m: dict[str, Any] = {"MessageId": "m-1", "ReceiptHandle": "rh-1", "Body": body}
    if attrs is not None:
        m["Attributes"] = attrs
    return m


# --------------------------------------------------------------------------- the rules


def test_loads_refuses_deep_nesting_with_a_value_error_not_recursion() -> None:
    for text in (DEEP, '{"a":' * 3000, "[" * 100_000):
        with pytest.raises(inputs.UnreadableJson, match="nested deeper"):
            inputs.loads(text)
    with pytest.raises(inputs.UnreadableJson, match="nested deeper"):
        inputs.loads("[" * (inputs.JSON_DEPTH_LIMIT + 1) + "]" * (inputs.JSON_DEPTH_LIMIT + 1))
    n = inputs.JSON_DEPTH_LIMIT
    assert inputs.loads("[" * n + "]" * n) is not None  # the limit itself is allowed
    with pytest.raises(inputs.UnreadableJson, match="not valid JSON"):
        inputs.loads("9" * 10_000)  # past Python's digit limit
    with pytest.raises(inputs.UnreadableJson, match="not valid JSON"):
        inputs.loads(b"\xff\xfe{")  # not UTF-8
    with pytest.raises(inputs.UnreadableJson):
        inputs.loads(None)  # type: ignore[arg-type]


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.text(),
        st.binary(),
        st.builds(lambda n, c: c * n, st.integers(0, 20_000), st.sampled_from(["[", "{", '{"a":'])),
        st.builds(lambda n: "9" * n, st.integers(4000, 20_000)),
        JSONISH.map(json.dumps),
    )
)
@example(DEEP)
def test_loads_raises_nothing_but_unreadable_json(text: str | bytes) -> None:
    with contextlib.suppress(inputs.UnreadableJson):
        inputs.loads(text)


def test_the_id_rules_name_what_is_wrong_and_never_quote_the_id() -> None:
    assert inputs.job_id_problem("invoice-2026-0042/line:7") is None
    assert inputs.job_id_problem("ünïcødé-✓") is None
    secret = "\u001b]52;c;Y2xpcGJvYXJk\u0007"
    for bad, words in [
        ("", "non-empty"),
        (7, "non-empty"),
        ("a\ud800", "surrogate"),
        ("x" * 2049, "2048 bytes"),
        ("é" * 1025, "2048 bytes"),
        (secret, "control"),
        ("a\u202eb", "control"),
        ("worker#w1", "'worker#'"),
    ]:
        why = inputs.job_id_problem(bad)
        assert why is not None and words in why, (bad, why)
        assert "]52" not in why
    assert inputs.name_problem("stage", "draft-2") is None
    assert inputs.name_problem("job class", "a b") == (
        "a job class name is 1 to 100 characters of A-Z a-z 0-9 _ . : -"
    )
    assert inputs.send_id_problem("ab12.3") is None
    assert inputs.send_id_problem("s" * 201) is not None
    assert inputs.send_id_problem("s\r\n") is not None


# --------------------------------------------------------------------------- parsers


@pytest.mark.parametrize("name", sorted(HOSTILE_BODIES))
def test_a_hostile_body_is_poison_with_a_reason_never_a_raise(name: str) -> None:
    body = HOSTILE_BODIES[name]
    got = parse_message(_msg(body), 0.0, 30)
    if name in ("deep valid job",):
        assert isinstance(got, Poison) and got.reason == "message body is not JSON"
        return
    assert isinstance(got, Poison), got
    assert got.reason and got.body == body  # the DLQ copy keeps the bytes
    # A job id that is not one never reaches a request, a journal line or the DLQ group.
    if got.job_id is not None:
        assert inputs.job_id_problem(got.job_id) is None


ATTRS = st.one_of(
    st.none(),
    st.text(),
    st.dictionaries(
        st.sampled_from(
            ["ApproximateReceiveCount", "SentTimestamp", "ApproximateFirstReceiveTimestamp", "x"]
        ),
        st.one_of(st.text(), st.integers(), st.floats(), st.none(), st.lists(st.integers())),
    ),
)
FIELD = st.one_of(
    st.text(),
    st.text(alphabet=string.ascii_letters + string.digits + "_.:-", min_size=1, max_size=12),
    st.integers(),
    st.none(),
    st.lists(st.text(), max_size=2),
    st.builds(lambda n: "[" * n, st.integers(0, 3000)),
)


@st.composite
def bodies(draw: st.DrawFn) -> Any:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.text())
    if kind == 1:
        return draw(st.sampled_from(sorted(HOSTILE_BODIES.values())))
    if kind == 2:  # not even text: a Lambda event record is somebody's JSON
        return draw(st.one_of(st.none(), st.integers(), st.lists(st.integers())))
    fields = draw(
        st.dictionaries(st.sampled_from(["v", "job_id", "job_class", "stage", "send_id"]), FIELD)
    )
    return json.dumps(fields)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies(), ATTRS, st.one_of(st.text(), st.none(), st.integers()))
def test_parse_message_is_total_and_lets_through_only_what_the_rules_allow(
    body: Any, attrs: Any, mid: Any
) -> None:
    message = _msg(body, attrs)
    message["MessageId"] = mid
    got = parse_message(message, 0.0, 30)
    assert isinstance(got, (Delivery, Poison))
    assert isinstance(got.message_id, str) and isinstance(got.receipt_handle, str)
    if isinstance(got, Delivery):
        assert inputs.job_id_problem(got.job_id) is None
        assert inputs.valid_name(got.job_class)
        assert got.stage is None or inputs.valid_name(got.stage)
        assert got.send_id is None or inputs.send_id_problem(got.send_id) is None
        assert got.receive_count >= 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(["messageId", "receiptHandle", "body", "attributes", "eventSourceARN"]),
        st.one_of(bodies(), ATTRS),
    )
)
def test_parse_event_record_is_total(record: dict[str, Any]) -> None:
    got = parse_event_record(record, 0.0, 0)
    assert isinstance(got, (Delivery, Poison))


def test_a_valid_message_still_parses() -> None:
    body = message_body("job-1", "work", stage="draft", send_id="a1b2.3")
    got = parse_message(_msg(body, {"ApproximateReceiveCount": "3"}), 1.0, 30)
    assert isinstance(got, Delivery)
    assert (got.job_id, got.job_class, got.stage, got.send_id, got.receive_count) == (
        "job-1",
        "work",
        "draft",
        "a1b2.3",
        3,
    )


STORED = st.one_of(
    st.text(),
    st.builds(lambda n: "[" * n, st.integers(0, 5000)),
    JSONISH.map(json.dumps),
    st.just('[{"stage": "a", "token": "9' + "9" * 5000 + '"}]'),
    st.just('[{"stage": "a", "duration": 1e999}]'),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STORED)
def test_record_fields_are_read_or_refused_as_unreadable(text: str) -> None:
    # What a producer with write access, a hand edit or another version may leave.
    assert decode(text) is None or decode(text) is not None  # total: returns
    item = {
        "job_id": {"S": "worker#w1"},
        "kind": {"S": "liveness"},
        "owner": {"S": "w1"},
        "beat_at": {"N": "1"},
        "part": {"N": text[:30]},
        "parts": {"N": "inf"},
        "held": {"S": text},
    }
    liveness_of(item)  # returns a reading or None, never raises
    job = JobView("j", "c", JobState.RUNNING, 1, 1, "w", "h", stage_log=text)
    try:
        stage_log(job)
    except RecordUnreadable as exc:
        assert "stage log" in str(exc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(["job_id", "job_class", "state", "token", "attempt", "message_sent"]),
        st.one_of(
            st.dictionaries(st.sampled_from(["S", "N", "BOOL", "NULL", "L"]), FIELD),
            st.text(),
            st.none(),
        ),
    )
)
def test_view_of_reads_a_record_or_raises_record_unreadable(item: dict[str, Any]) -> None:
    with contextlib.suppress(RecordUnreadable):
        view_of(item)


def test_the_journal_reader_skips_hostile_lines(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    good = json.dumps({"event": "job_claimed", "job_id": "j"})
    path.write_bytes(
        b"\n".join([DEEP.encode(), b"9" * 10_000, b"\xff\xfe\x00", b'{"event": 1}', good.encode()])
    )
    events = read_journal(path)
    assert events[-1] == {"event": "job_claimed", "job_id": "j"}


def test_no_module_reads_outside_json_around_the_one_reader() -> None:
    # One rule, one place: every JSON text the package reads goes through
    # inputs.loads (the simulator's checker reads its own world's texts).
    root = Path(__file__).resolve().parent.parent / "sqs_lease"
    simulator = root / "testing" / "_sim"
    assert (simulator / "world.py").is_file(), "the simulator moved: update this test"
    raw = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "json.loads(" in p.read_text() and p.name != "inputs.py" and p.parent != simulator
    ]
    assert raw == []


# --------------------------------------------------------------------------- submit


class Work(BaseModel):
    n: int


@pytest.mark.integration
def test_submit_refuses_an_id_no_worker_would_read(aws: AwsTestEnv) -> None:
    settings_, _, _ = prepare(aws.endpoint_url, aws.prefix)
    producer = Producer(settings_)
    for bad in ("worker#w1", "a\u0000b", "a\u001b]0;x\u0007", "a\ud800"):
        with pytest.raises(ConfigError, match="job_id="):
            producer.submit("work", {"n": 1}, job_id=bad)
    with pytest.raises(LimitExceeded, match="2048"):
        producer.submit("work", {"n": 1}, job_id="x" * 3000)


# --------------------------------------------------------------------------- real shells


def _app() -> App:
    app = App()

    @app.job("work", payload=Work, **FAST)
    def work(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        return {"n": p.n}

    return app


SENT = ["deep array", "deep object", "huge number", "giant id", "escape in class", "NUL in id"]


@pytest.mark.integration
@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_hostile_messages_never_stop_a_worker_and_the_job_beside_them_runs(
    shell: str, aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    settings_, url, dlq = prepare(aws.endpoint_url, aws.prefix)
    app = _app()
    for name in SENT:
        sqs_client.send_message(QueueUrl=url, MessageBody=HOSTILE_BODIES[name])
    good = Producer(settings_, app).submit("work", Work(n=3), job_id=f"{aws.prefix}-g").job_id
    worker = SHELLS[shell](app, settings_, worker_id="w", receive_wait=1, concurrency=4)
    with collect_journal() as journal:
        # run() itself: it must return (not raise) once the queue stays empty.
        stats = worker.run(idle_exit=3)
    assert stats.poisoned == len(SENT)
    assert read_record(ddb_client, settings_, good).state == "succeeded"
    poisoned = journal.events("message_poisoned")
    assert len(poisoned) == len(SENT) and all(e["moved_to_dlq"] for e in poisoned)
    # No journal line carries a giant id or a raw escape.
    assert all(len(json.dumps(e)) < 2000 for e in poisoned)
    assert queue_depth(sqs_client, url) == 0
    dead = drain(sqs_client, dlq, timeout=10, want=len(SENT))
    assert sorted(m["Body"] for m in dead) == sorted(HOSTILE_BODIES[n] for n in SENT)


@pytest.mark.integration
def test_a_lambda_batch_with_a_hostile_record_runs_the_others(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    from test_aws_lambda import BUDGET, RunningDown, event_of

    settings_, url, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("work", payload=Work, **BUDGET)
    def work(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        return {"n": p.n}

    sqs_client.send_message(QueueUrl=url, MessageBody=DEEP)
    good = Producer(settings_, app).submit("work", Work(n=1), job_id=f"{aws.prefix}-g").job_id
    event = event_of(sqs_client, url, 2)
    event["Records"].append("not a record")  # not even a mapping: skipped, journaled
    event["Records"][0]["attributes"]["ApproximateReceiveCount"] = "1e999"
    assert handler(app, settings_)(event, RunningDown(60)) == {"batchItemFailures": []}
    assert read_record(ddb_client, settings_, good).state == "succeeded"


@pytest.mark.integration
def test_dlq_commands_show_and_move_a_hostile_message(
    aws: AwsTestEnv, sqs_client: SQSClient
) -> None:
    _, _, dlq = prepare(aws.endpoint_url, aws.prefix)
    mid = sqs_client.send_message(QueueUrl=dlq, MessageBody=DEEP)["MessageId"]
    sqs_client.send_message(QueueUrl=dlq, MessageBody=HOSTILE_BODIES["huge number"])

    def run(*args: str) -> Any:
        result = CliRunner().invoke(
            cli, ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix, *args]
        )
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            result.output,
            result.exception,
        )
        return result

    listed = run("dlq", "list", "--json")
    assert listed.exit_code == 0
    rows = [json.loads(line) for line in listed.output.splitlines() if line.strip()]
    assert {r["message_id"] for r in rows} >= {mid}
    shown = run("dlq", "show", mid)
    assert shown.exit_code == 0 and "[[[" in shown.output
    run("dlq", "list", "--reconcile")
    moved = run("dlq", "redrive", "--json")
    assert moved.exit_code in (0, 1), moved.output  # nothing to move back is not a crash


@pytest.mark.integration
def test_a_liveness_write_never_replaces_a_job_record(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    # A record under the liveness key, written past submit's rule (by hand, or by an
    # older version that allowed it): the worker's liveness write leaves it alone.
    settings_, _, _ = prepare(aws.endpoint_url, aws.prefix)
    key = "worker#w"
    ddb_client.put_item(
        TableName=settings_.jobs_table,
        Item={"job_id": {"S": key}, "state": {"S": "queued"}, "job_class": {"S": "work"}},
    )
    app = App()

    @app.job("work", payload=Work, **FAST)
    def work(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        ctx.wait(3 * FAST["heartbeat_seconds"])  # held across heartbeat rounds
        return {"n": p.n}

    good = Producer(settings_, app).submit("work", Work(n=1), job_id=f"{aws.prefix}-g").job_id
    worker = SHELLS["thread"](app, settings_, worker_id="w", receive_wait=1)
    with collect_journal() as journal:
        worker.run(idle_exit=3)
    item = ddb_client.get_item(
        TableName=settings_.jobs_table, Key={"job_id": {"S": key}}, ConsistentRead=True
    )["Item"]
    assert item["state"] == {"S": "queued"} and "kind" not in item
    assert read_record(ddb_client, settings_, good).state == "succeeded"
    assert journal.events("liveness_failed")
