"""FIFO queues end to end, on a real moto server: the settings' names, the queues
``create_queue`` makes, the group and deduplication ids every send carries, jobs run
by both worker shells, the stranded sweep's re-send, the DLQ both ways, and the
Lambda adapter with a FIFO event."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import (
    FAST,
    collect_journal,
    drain,
    read_view,
    running,
    use_shell,
    wait_until,
)

from sqs_lease import (
    App,
    ConfigError,
    JobContext,
    NextStage,
    Producer,
    Settings,
    Worker,
    create_queue,
    create_tables,
)
from sqs_lease._aws import SyncDriver
from sqs_lease._core.calls import Call
from sqs_lease._core.fifo import (
    deduplication_id,
    fifo_params,
    message_group_id,
    session_order_problem,
    sqs_id,
)
from sqs_lease._core.records import JobState
from sqs_lease._core.sending import send_job_message, submit_flow
from sqs_lease._dlq import redrive_dlq
from sqs_lease._schema.job_requests import JobTable
from sqs_lease.aws_lambda import handler

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

pytestmark = pytest.mark.integration

HANG = 60.0  # hang guard only

Shell: Any = Worker  # each worker shell in turn (use_shell)
shell = use_shell(__name__)


class Work(BaseModel):
    n: int


def _fifo(aws: AwsTestEnv) -> tuple[Settings, str, str]:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix, fifo=True)
    create_tables(settings)
    url, dlq = create_queue(settings)
    return settings, url, dlq


def _app(ran: list[int] | None = None) -> App:
    app = App()

    @app.job("work", payload=Work, **FAST)
    def _work(ctx: JobContext[Work], p: Work) -> dict[str, int]:
        if ran is not None:
            ran.append(p.n)
        return {"n": p.n}

    return app


def _attrs(sqs: SQSClient, url: str) -> dict[str, str]:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return {str(k): v for k, v in attrs.items()}


# =========================================================================== settings


def test_fifo_settings_name_the_queue_and_its_dlq_with_the_fifo_suffix() -> None:
    s = Settings(prefix="p", fifo=True)
    assert (s.queue, s.dlq) == ("p-jobs.fifo", "p-jobs-dlq.fifo")
    named = Settings(prefix="p", queue_name="work.fifo", fifo=True)
    assert (named.queue, named.dlq) == ("work.fifo", "work-dlq.fifo")
    assert Settings(prefix="p").dlq == "p-jobs-dlq"
    env = Settings.from_env({"SQS_LEASE_FIFO": "true", "SQS_LEASE_PREFIX": "e"})
    assert (env.fifo, env.queue) == (True, "e-jobs.fifo")


@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        ({"queue_name": "work", "fifo": True}, "queue_name='work'", "fifo=False"),
        ({"queue_name": "work.fifo"}, "queue_name='work.fifo'", "SQS_LEASE_FIFO=true"),
        ({"prefix": "my.app"}, "prefix='my.app'", "set queue_name"),
        ({"queue_name": "w" * 77 + ".fifo", "fifo": True}, "queue_name=", "shorten"),
        ({"queue_name": "w" * 78}, "dead-letter queue name", "shorten"),
    ],
)
def test_a_queue_name_sqs_would_refuse_is_a_config_error_naming_the_field(
    kwargs: dict[str, Any], field: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as err:
        Settings(**kwargs)
    assert field in str(err.value) and fix in str(err.value)


def test_an_id_sqs_would_refuse_as_a_group_id_becomes_a_stable_digest() -> None:
    assert message_group_id("job-1", None) == "job-1"
    assert message_group_id("job-1", "session-9") == "session-9"
    long = "j" * 129
    assert sqs_id(long) == sqs_id(long) != long and len(sqs_id(long)) <= 128
    assert sqs_id("naïve job").startswith("sha256:")
    assert fifo_params("https://q/1/jobs", group_id="g", dedup_id="d") == {}


# =========================================================================== queues


def test_create_queue_makes_a_fifo_queue_and_a_fifo_dlq_without_content_deduplication(
    aws: AwsTestEnv, sqs_client: SQSClient
) -> None:
    settings, url, dlq = _fifo(aws)
    assert url.endswith("-jobs.fifo") and dlq.endswith("-jobs-dlq.fifo")
    main, dead = _attrs(sqs_client, url), _attrs(sqs_client, dlq)
    assert main["FifoQueue"] == dead["FifoQueue"] == "true"
    assert main.get("ContentBasedDeduplication", "false") == "false"
    assert json.loads(main["RedrivePolicy"])["deadLetterTargetArn"] == dead["QueueArn"]
    assert create_queue(settings) == (url, dlq)  # again: idempotent


# =========================================================================== sends


def test_each_send_carries_the_jobs_group_or_id_and_is_deduplicated_per_job_and_send(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    settings, url, _ = _fifo(aws)
    producer = Producer(settings, _app())
    producer.submit("work", Work(n=1), job_id="alone")
    producer.submit("work", Work(n=2), job_id="in-session", group="session-1")
    got = drain(sqs_client, url, timeout=20, want=2)
    by_job = {json.loads(m["Body"])["job_id"]: m["Attributes"] for m in got}
    assert by_job["alone"]["MessageGroupId"] == "alone"
    assert by_job["in-session"]["MessageGroupId"] == "session-1"
    for job_id, attrs in by_job.items():
        send_id = read_view(ddb_client, settings, job_id).send_id
        assert send_id is not None
        assert attrs["MessageDeduplicationId"] == deduplication_id(job_id, send_id)


def test_a_delayed_submit_to_a_fifo_queue_is_refused_before_anything_is_written(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = _fifo(aws)
    with pytest.raises(ConfigError, match="delay_seconds=5"):
        Producer(settings, _app()).submit("work", Work(n=1), job_id="later", delay_seconds=5)
    got = ddb_client.get_item(TableName=settings.jobs_table, Key={"job_id": {"S": "later"}})
    assert "Item" not in got


def test_fifo_jobs_submitted_alone_and_in_a_session_all_run_on_the_worker(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = _fifo(aws)
    ran: list[int] = []
    app = _app(ran)
    producer = Producer(settings, app)
    ids = [producer.submit("work", Work(n=i), job_id=f"solo-{i}").job_id for i in range(3)]
    ids += [
        producer.submit("work", Work(n=10 + i), job_id=f"s-{i}", group="session").job_id
        for i in range(3)
    ]
    with running(Shell(app, settings, receive_wait=1)):
        wait_until(
            lambda: all(
                read_view(ddb_client, settings, j).state is JobState.SUCCEEDED for j in ids
            ),
            HANG,
            "every FIFO job to succeed",
        )
    # One session is one message group: its jobs ran one at a time, in submit order.
    assert [n for n in ran if n >= 10] == [10, 11, 12]


def test_the_sweeps_resend_of_a_fifo_job_is_not_dropped_as_a_duplicate_and_the_job_runs(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    # A producer sent its message (the library's own send) and died before recording
    # it sent; the sweep re-sends within SQS's 5-minute deduplication window, and that
    # message must not be dropped as a duplicate of the first (a stray by then).
    settings, url, _ = _fifo(aws)
    table = JobTable(settings.jobs_table)
    put = table.put_new(
        job_id="stranded",
        job_class="work",
        payload_json='{"n":7}',
        payload_hash="h" * 64,
        wall_now=time.time() - 120,
        send_id="first-send",
    )
    ddb_client.put_item(**put.params)

    class _DiesBeforeMarking(JobTable):
        def mark_sent(self, job_id: str, send_id: str, wall_now: float) -> Call:
            return super().mark_sent(job_id, "someone-else", wall_now)  # refused

    first = SyncDriver(settings).run(
        send_job_message(
            _DiesBeforeMarking(settings.jobs_table),
            queue_url=url,
            job_id="stranded",
            job_class="work",
            send_id="first-send",
            wall_now=time.time(),
        )
    )
    assert first.verdict == "superseded"  # out, and the record still says unsent
    report = Producer(settings, _app()).repair(older_than=60)
    assert [s.verdict for s in report.jobs] == ["resent"]
    resent = read_view(ddb_client, settings, "stranded").send_id
    got = drain(sqs_client, url, timeout=20, want=2)
    sends = [json.loads(m["Body"])["send_id"] for m in got]
    assert sends == ["first-send", resent]  # both delivered, in send order
    for m in got:
        sqs_client.change_message_visibility(
            QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
    with running(Shell(_app(), settings, receive_wait=1)):
        wait_until(
            lambda: read_view(ddb_client, settings, "stranded").state is JobState.SUCCEEDED,
            HANG,
            "the re-sent job to succeed",
        )


# =========================================================================== stages


class Rows(BaseModel):
    rows_key: str


def _staged_app(ran: list[tuple[str, str]] | None = None) -> App:
    app = App()
    report = app.staged("report", payload=Work, **FAST)

    @report.stage("fetch")
    def fetch(ctx: JobContext[Any], p: Work) -> NextStage:
        if ran is not None:
            ran.append((ctx.job_id, "fetch"))
        return NextStage("render", Rows(rows_key=f"rows/{p.n}"))

    @report.stage("render", payload=Rows)
    def render(ctx: JobContext[Any], p: Rows) -> dict[str, str]:
        if ran is not None:
            ran.append((ctx.job_id, "render"))
        return {"file": p.rows_key}

    return app


def test_two_fifo_jobs_ending_the_same_stage_at_the_same_token_both_reach_their_next_stage(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    # Issue 26 defect 1: both continuations were sent under `stage.1.render`, the
    # deduplication id of both; SQS dropped the second within its 5-minute window
    # (and answered with a MessageId), so that job waited, marked sent, forever.
    settings, _, _ = _fifo(aws)
    ran: list[tuple[str, str]] = []
    app = _staged_app(ran)
    producer = Producer(settings, app)
    ids = [producer.submit("report", Work(n=i), job_id=f"staged-{i}").job_id for i in (1, 2)]
    with running(Shell(app, settings, receive_wait=1)):
        wait_until(
            lambda: all(
                read_view(ddb_client, settings, j).state is JobState.SUCCEEDED for j in ids
            ),
            HANG,
            "both staged FIFO jobs to succeed",
        )
    for job_id in ids:
        assert [s for j, s in ran if j == job_id] == ["fetch", "render"]
        view = read_view(ddb_client, settings, job_id)
        assert (view.stage, view.token) == ("render", 2)


def test_a_resubmit_taking_over_an_unsent_continuation_sends_the_records_current_stage(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    # Issue 26 defect 6: the job ended its first stage and its worker died before the
    # next stage's send; the producer's resubmit (past the grace) took the send over
    # and sent the first stage's name, so the worker validated the second stage's
    # input with the first stage's model and failed the job.
    settings, url, _ = _fifo(aws)
    ran: list[tuple[str, str]] = []
    app = _staged_app(ran)
    producer = Producer(settings, app, unsent_grace=0)
    producer.submit("report", Work(n=5), job_id="taken")
    (first,) = drain(sqs_client, url, timeout=20, want=1)
    table = JobTable(settings.jobs_table)
    body = json.loads(first["Body"])
    claim = table.claim(
        "taken", "dead-worker", time.time(), 60, job_class="report", send_id=body["send_id"]
    )
    ddb_client.update_item(**claim.params)
    advance = table.advance_stage(
        "taken",
        1,
        "dead-worker",
        stage="fetch",
        next_stage="render",
        stage_input='{"rows_key":"rows/5"}',
        stage_log='[{"stage":"fetch","result":null,"token":1,"attempt":1}]',
        send_id="stage.1.render",
        wall_now=time.time() - 60,
        write_id="dead-worker-nonce:checkpoint",
    )
    ddb_client.update_item(**advance.params)
    sqs_client.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    again = producer.submit("report", Work(n=5), job_id="taken")
    assert again.message_id is not None, again.note  # it took the send over
    (sent,) = drain(sqs_client, url, timeout=20, want=1)
    assert json.loads(sent["Body"])["stage"] == "render"
    sqs_client.change_message_visibility(
        QueueUrl=url, ReceiptHandle=sent["ReceiptHandle"], VisibilityTimeout=0
    )
    with running(Shell(app, settings, receive_wait=1)):
        wait_until(
            lambda: (
                read_view(ddb_client, settings, "taken").state
                in (JobState.SUCCEEDED, JobState.FAILED)
            ),
            HANG,
            "the taken-over job to end",
        )
    view = read_view(ddb_client, settings, "taken")
    assert (view.state, view.stage, view.error_code) == (JobState.SUCCEEDED, "render", None)
    assert ran == [("taken", "render")]


# =========================================================================== the DLQ


def test_a_poison_message_on_a_fifo_queue_is_copied_to_the_fifo_dlq_and_redriven_back(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    settings, url, dlq = _fifo(aws)
    sqs_client.send_message(
        QueueUrl=url, MessageBody="not json", MessageGroupId="g", MessageDeduplicationId="p1"
    )
    with collect_journal() as journal, running(Shell(_app(), settings, receive_wait=1)):
        (poisoned,) = journal.wait_for("message_poisoned", timeout=HANG)
    assert poisoned["moved_to_dlq"] is True
    # A job's message moved by SQS's redrive goes back to the FIFO queue and runs.
    producer = Producer(settings, _app())
    producer.submit("work", Work(n=3), job_id="back", group="session")
    (m,) = drain(sqs_client, url, timeout=20, want=1)
    sqs_client.send_message(
        QueueUrl=dlq, MessageBody=m["Body"], MessageGroupId="session", MessageDeduplicationId="x"
    )
    sqs_client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    report = redrive_dlq(settings, job_ids=["back"])
    assert [r.verdict for r in report.messages] == ["moved"], report
    with running(Shell(_app(), settings, receive_wait=1)):
        wait_until(
            lambda: read_view(ddb_client, settings, "back").state is JobState.SUCCEEDED,
            HANG,
            "the redriven job to succeed",
        )


# =========================================================================== Lambda


class _Context:
    def get_remaining_time_in_millis(self) -> int:
        return 600_000


def test_the_lambda_adapter_runs_a_fifo_event_and_stops_only_the_failed_records_group(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient, shell: str
) -> None:
    if shell != "thread":
        pytest.skip("the Lambda adapter is one shell: run once")
    settings, url, _ = _fifo(aws)
    ran: list[int] = []
    app = App()

    @app.job(
        "work", payload=Work, **FAST | {"stage_budget_seconds": 6.0, "effect_timeout_seconds": 1.0}
    )
    def _work(ctx: JobContext[Work], p: Work) -> dict[str, int]:
        ran.append(p.n)
        if p.n == 1:
            raise RuntimeError("the session's first job fails")
        return {"n": p.n}

    producer = Producer(settings, app)
    producer.submit("work", Work(n=1), job_id="s-1", group="session")
    producer.submit("work", Work(n=2), job_id="s-2", group="session")
    producer.submit("work", Work(n=3), job_id="solo")
    got = drain(sqs_client, url, timeout=20, want=3)
    arn = _attrs(sqs_client, url)["QueueArn"]
    records = [
        {
            "messageId": m["MessageId"],
            "receiptHandle": m["ReceiptHandle"],
            "body": m["Body"],
            "attributes": dict(m["Attributes"]),
            "messageAttributes": {},
            "md5OfBody": m["MD5OfBody"],
            "eventSource": "aws:sqs",
            "eventSourceARN": arn,
            "awsRegion": "us-east-1",
        }
        for m in got
    ]
    assert [json.loads(r["body"])["job_id"] for r in records] == ["s-1", "s-2", "solo"]
    answer = handler(app, settings)({"Records": records}, _Context())
    failed = {f["itemIdentifier"] for f in answer["batchItemFailures"]}
    assert failed == {records[0]["messageId"], records[1]["messageId"]}
    assert sorted(ran) == [1, 3]  # s-2 waits behind s-1; solo is its own group
    assert read_view(ddb_client, settings, "s-2").attempt == 0
    assert read_view(ddb_client, settings, "solo").state is JobState.SUCCEEDED


def test_a_fifo_queue_s_interactive_queue_is_fifo_and_named_so(
    aws: AwsTestEnv, sqs_client: SQSClient
) -> None:
    settings, _, _ = _fifo(aws)
    assert settings.interactive_queue == f"{aws.prefix}-jobs-interactive.fifo"
    create_queue(settings, interactive=True)
    url = sqs_client.get_queue_url(QueueName=settings.interactive_queue)["QueueUrl"]
    assert _attrs(sqs_client, url)["FifoQueue"] == "true"


# ----------------------------------------------------------------------------- session order
#
# Issue 26 defect 9: FIFO order is per message. A staged job's continuation joins the
# back of its group, so a later job of the same session runs between its stages. The
# rule (sqs_lease/_core/fifo.py, session_order_problem): such a submit is refused
# unless the producer accepts that order (interleave_stages=True).


def test_the_session_order_rule_refuses_only_a_job_of_several_stages_in_a_fifo_group() -> None:
    fifo, std = "https://sqs/1/q-jobs.fifo", "https://sqs/1/q-jobs"
    assert session_order_problem(fifo, group="s", stages=2, interleave=False) is not None
    assert session_order_problem(fifo, group="s", stages=2, interleave=True) is None
    assert session_order_problem(fifo, group=None, stages=3, interleave=False) is None
    assert session_order_problem(fifo, group="s", stages=1, interleave=False) is None
    assert session_order_problem(std, group="s", stages=3, interleave=False) is None
    app = _staged_app()
    assert app.stage_count("report", "{}") == 2
    assert _app().stage_count("work", "{}") == 1
    # The core's submit refuses it before it writes or sends anything.
    flow = submit_flow(
        JobTable("jobs"),
        queue_url=fifo,
        job_id="j",
        job_class="report",
        payload_json="{}",
        payload_hash="h",
        wall_now=0.0,
        send_id="s-1",
        group="s",
        stages=2,
    )
    with pytest.raises(ConfigError, match="interleave_stages=True"):
        next(flow)


def test_a_staged_job_submitted_to_a_fifo_session_is_refused_unless_it_accepts_interleaving(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = _fifo(aws)
    app = _staged_app()
    producer = Producer(settings, app)
    with pytest.raises(ConfigError, match=r"group='s'.*interleave_stages=True"):
        producer.submit("report", Work(n=1), job_id="st-1", group="s")
    got = ddb_client.get_item(TableName=settings.jobs_table, Key={"job_id": {"S": "st-1"}})
    assert "Item" not in got  # refused before anything was written
    # Alone in its own group its stages keep their order; a one-message class in a
    # session keeps the session's order; a producer that accepts the order may.
    assert producer.submit("report", Work(n=2), job_id="st-2").created
    assert Producer(settings, _app()).submit("work", Work(n=3), job_id="w-3", group="s").created
    assert producer.submit(
        "report", Work(n=4), job_id="st-4", group="s", interleave_stages=True
    ).created


def test_a_fifo_sessions_later_job_runs_between_the_stages_of_an_earlier_one_as_documented(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = _fifo(aws)
    ran: list[tuple[str, str]] = []
    app = _staged_app(ran)

    @app.job("work", payload=Work, **FAST)
    def work(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        ran.append((ctx.job_id, "work"))
        return {"n": p.n}

    producer = Producer(settings, app)
    first = producer.submit("report", Work(n=1), job_id="a", group="s", interleave_stages=True)
    later = producer.submit("work", Work(n=2), job_id="b", group="s")
    ids = [first.job_id, later.job_id]
    with running(Shell(app, settings, receive_wait=1, concurrency=2)):
        wait_until(
            lambda: all(
                read_view(ddb_client, settings, j).state is JobState.SUCCEEDED for j in ids
            ),
            HANG,
            "both session jobs to succeed",
        )
    # One at a time (the group holds its next message while one is in flight), in the
    # order of the messages: the continuation went to the back, behind job b.
    assert ran == [("a", "fetch"), ("b", "work"), ("a", "render")]
