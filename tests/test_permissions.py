"""One list of permissions (``sqs_lease.deploy.PERMISSIONS``), checked against the
calls the code makes: a producer, a thread worker and the Lambda adapter (its
consumer and its scheduled sweep) run through every path against moto while a
botocore event hook records each call as the IAM action (and resource) it needs.
Every call must be in its role's list, and every entry of the list must have been
used: a list longer than the code is as wrong as one shorter (a README role
written from a short list got AccessDenied; issue 27)."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import botocore.client
import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel
from test_aws_lambda import BUDGET, RunningDown, event_of
from worker_helpers import collect_journal, drain, prepare, running

from sqs_lease import App, CheckAnswer, JobContext, NextStage, Producer, Settings, Verdict, Worker
from sqs_lease._core.liveness import LIVENESS_PREFIX
from sqs_lease._errors import ToolOutcomeUnknown
from sqs_lease._jobs import EffectCall
from sqs_lease._schema.job_requests import JobTable
from sqs_lease.aws_lambda import handler, sweeper
from sqs_lease.deploy import PERMISSIONS, permissions_table, table_names

if TYPE_CHECKING:
    from types_boto3_sqs import SQSClient

pytestmark = [pytest.mark.integration]
ROOT = Path(__file__).resolve().parent.parent

_BATCH = {
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
    "DeleteMessageBatch": "DeleteMessage",
    "SendMessageBatch": "SendMessage",
}
_TRANSACT = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "ConditionCheck": "ConditionCheckItem",
    "Delete": "DeleteItem",
}


def iam_actions(
    service: str, operation: str, params: Mapping[str, Any], settings: Settings
) -> set[tuple[str, str]]:
    """(resource, IAM action) pairs one API call needs, in the list's own terms."""
    if service == "sqs":
        name = str(params.get("QueueName") or str(params.get("QueueUrl", "")).rsplit("/", 1)[-1])
        resource = "dlq" if name == settings.dlq else "queue"
        assert name in (settings.dlq, settings.queue, settings.interactive_queue), name
        return {(resource, f"sqs:{_BATCH.get(operation, operation)}")}
    roles = {name: role for role, name in table_names(settings).items()}

    def item(op: str, p: Mapping[str, Any]) -> tuple[str, str]:
        role = roles[p["TableName"]]
        key = p.get("Item") or {}
        if op == "PutItem" and str(key.get("job_id", {}).get("S", "")).startswith(LIVENESS_PREFIX):
            return ("jobs:worker#", "dynamodb:PutItem")
        if op == "Query" and p.get("IndexName"):
            return (f"{role}/index/{p['IndexName']}", "dynamodb:Query")
        return (role, f"dynamodb:{op}")

    if operation == "TransactWriteItems":
        out = set()
        for entry in params["TransactItems"]:
            ((kind, p),) = entry.items()
            out.add(item(_TRANSACT[kind], p))
        return out
    if operation == "BatchGetItem":
        return {(roles[t], "dynamodb:BatchGetItem") for t in params["RequestItems"]}
    return {item(operation, params)}


class Recorder:
    """Every API call any botocore client makes, as (role, resource, action), under
    the role the test says is calling (``as_role``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.role = "none"
        self.seen: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    @contextmanager
    def as_role(self, role: str) -> Iterator[None]:
        self.role = role
        try:
            yield
        finally:
            self.role = "none"

    def hook(self, params: Mapping[str, Any], model: Any, **_: Any) -> None:
        service = model.service_model.service_name
        for resource, action in iam_actions(service, model.name, params, self.settings):
            with self._lock:
                self.seen.add((self.role, resource, action))


@pytest.fixture
def recorder(aws: AwsTestEnv, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    rec = Recorder(settings)
    create = botocore.client.ClientCreator.create_client

    def create_client(self: Any, *args: Any, **kwargs: Any) -> Any:
        client = create(self, *args, **kwargs)
        # The API's own parameters, before they are serialised: every call, every client.
        client.meta.events.register("before-parameter-build", rec.hook)
        return client

    monkeypatch.setattr(botocore.client.ClientCreator, "create_client", create_client)
    yield rec


class P(BaseModel):
    n: int = 0


def _app(calls: dict[str, int]) -> App:
    app = App(tenant_limit=2)
    lock = threading.Lock()

    def count(name: str) -> int:
        with lock:
            calls[name] = calls.get(name, 0) + 1
            return calls[name]

    @app.job("ok", payload=P, **BUDGET)
    def ok(ctx: JobContext[P], p: P) -> dict[str, int]:
        ctx.progress({"step": 1})
        time.sleep(2.5)  # past a heartbeat: the lease is extended, ownership confirmed
        return {"n": p.n}

    @app.job("flaky", payload=P, **{**BUDGET, "backoff_base_seconds": 0.1})
    def flaky(ctx: JobContext[P], p: P) -> dict[str, int]:
        if count("flaky") == 1:
            raise RuntimeError("once")  # a retry with backoff
        return {"n": p.n}

    @app.job("bad", payload=P, **{**BUDGET, "max_attempts": 1})
    def bad(ctx: JobContext[P], p: P) -> None:
        raise RuntimeError("for good")

    @app.job("unknown", payload=P, **BUDGET)
    def unknown(ctx: JobContext[P], p: P) -> None:
        raise ToolOutcomeUnknown("timed out")  # parks the job

    app.target("svc", check=lambda view: CheckAnswer(Verdict.NOT_APPLIED, detail="no row"))

    def tool(call: EffectCall) -> dict[str, str]:
        return {"charged": call.key}

    @app.job("effect", payload=P, **BUDGET)
    def effect(ctx: JobContext[P], p: P) -> Any:
        return ctx.effect("charge", "svc", {"n": p.n}, tool).response

    @app.job("limited", payload=P, concurrency_limit=1, **BUDGET)
    def limited(ctx: JobContext[P], p: P) -> dict[str, int]:
        return {"n": p.n}

    report = app.staged("report", payload=P, **BUDGET)

    @report.stage("fetch")
    def fetch(ctx: JobContext[Any], p: P) -> NextStage:
        return NextStage("publish", {"n": p.n + 1})

    @report.stage("publish")
    def publish(ctx: JobContext[Any], p: dict[str, Any]) -> dict[str, Any]:
        return p

    return app


# Every class once, one of them grouped and one for a tenant (its slot pool).
_JOBS: list[tuple[str, dict[str, Any]]] = [
    ("ok", {}),
    ("flaky", {}),
    ("bad", {}),
    ("unknown", {}),
    ("effect", {}),
    ("limited", {"tenant": "acme"}),
    ("report", {"group": "session-1"}),
]


def _submit_all(producer: Producer, tag: str) -> list[str]:
    return [
        producer.submit(cls, P(n=i), job_id=f"{tag}-{cls}", **kw).job_id
        for i, (cls, kw) in enumerate(_JOBS)
    ]


def _strand_and_dead_letter(rec: Recorder, sqs: SQSClient, tag: str) -> None:
    """A record whose producer died before sending, and a job whose message SQS moved
    to the DLQ: the sweep's two kinds of work."""
    import boto3

    settings = rec.settings
    ddb = boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name="us-east-1")
    put = JobTable(settings.jobs_table).put_new(
        job_id=f"{tag}-stranded",
        job_class="ok",
        payload_json='{"n":1}',
        payload_hash="h" * 64,
        wall_now=time.time() - 600,
        send_id="died-before-sending",
    )
    ddb.put_item(**put.params)
    url = sqs.get_queue_url(QueueName=settings.queue)["QueueUrl"]
    dlq = sqs.get_queue_url(QueueName=settings.dlq)["QueueUrl"]
    Producer(settings, _app({})).submit("ok", P(n=2), job_id=f"{tag}-dead")
    (moved,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    sqs.send_message(QueueUrl=dlq, MessageBody=moved["Body"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=moved["ReceiptHandle"])
    # A message no job wrote: poison, copied to the DLQ with its reason.
    sqs.send_message(QueueUrl=url, MessageBody="not a job")


def test_every_call_of_every_path_is_in_the_list_and_the_list_has_nothing_unused(
    recorder: Recorder, sqs_client: SQSClient
) -> None:
    settings = recorder.settings
    calls: dict[str, int] = {}
    app = _app(calls)
    tag = uuid.uuid4().hex[:6]

    with recorder.as_role("setup"):
        _strand_and_dead_letter(recorder, sqs_client, tag)
    with recorder.as_role("producer"):
        producer = Producer(settings, app)
        ids = _submit_all(producer, f"{tag}-w")
    with recorder.as_role("worker"):
        worker = Worker(
            app,
            settings,
            concurrency=4,
            receive_wait=1,
            sweep_interval=1.0,
            sweep_grace=1.0,
        )
        with collect_journal() as journal, running(worker):
            for job_id in ids:
                _wait_ended(journal, job_id)
            journal.wait_for("stranded_swept", timeout=60)
            journal.wait_for("job_dead_lettered", timeout=60)
            journal.wait_for("message_poisoned", timeout=60)
            journal.wait_for("heartbeat_ok", timeout=60)

    # The Lambda consumer: the same role, records from the event source's receive,
    # some of them not started (their budget does not fit the time left).
    url = sqs_client.get_queue_url(QueueName=settings.queue)["QueueUrl"]
    with recorder.as_role("setup"):
        for m in drain(sqs_client, url, timeout=3, want=100):  # what the worker left
            sqs_client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    with recorder.as_role("producer"):
        lambda_ids = _submit_all(producer, f"{tag}-l")
    with recorder.as_role("worker"):
        answer = handler(app, settings)(event_of(sqs_client, url, len(lambda_ids)), _Short())
        assert answer["batchItemFailures"]  # the records it could not start
    with recorder.as_role("setup"):
        _strand_and_dead_letter(recorder, sqs_client, f"{tag}-s")
    with recorder.as_role("sweeper"):
        done = sweeper(app, settings, older_than=1.0)({"source": "aws.events"}, RunningDown(60))
        assert done["resent"] >= 1 and done["dlq_parked"] >= 1, done

    listed = {
        (role, res, a) for role, by in PERMISSIONS.items() for res, acts in by.items() for a in acts
    }
    made = {c for c in recorder.seen if c[0] in PERMISSIONS} | RACES_ONLY
    assert sorted(made - listed) == [], "calls the list does not grant"
    assert sorted(listed - made) == [], f"listed actions no path used: {sorted(listed - made)}"


RACES_ONLY = {("worker", "intents", "dynamodb:GetItem")}
"""Listed, and reached only in a race this run does not draw: an intent's start or
confirm refused while the job is still ours (another job's start on a shared key, a
retried write whose first try applied): ``_core/intents.py`` ``read_intent`` tells
its own write from another's (test_intents_core drives those flows)."""


class _Short:
    """Time for the first records only (the cold start reads it once too): the rest
    are released, not started."""

    def __init__(self) -> None:
        self.reads = 0

    def get_remaining_time_in_millis(self) -> int:
        self.reads += 1
        return 60_000 if self.reads <= 5 else 2_000


def _wait_ended(journal: Any, job_id: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        names = set(journal.names(job_id=job_id))
        if names & {"result_committed", "job_failed", "job_parked"}:
            return
        time.sleep(0.1)
    raise AssertionError(f"{job_id} did not end: {journal.names(job_id=job_id)}")


def test_the_readme_permissions_table_is_the_list() -> None:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- permissions: generated -->\n(.*?)<!-- /permissions -->", text, re.S)
    assert found, "README.md lacks the generated permissions table"
    assert found.group(1).strip() == permissions_table().strip()
    for action in ("dynamodb:Query", "dynamodb:ConditionCheckItem"):
        assert action in found.group(1)


def test_the_producer_grants_request_builders_name_exactly_the_listed_actions() -> None:
    from sqs_lease.deploy import submit_requests

    settings = Settings.from_env({}, prefix="p")
    built = {(r.role, r.action) for r in submit_requests(settings)}
    listed = {
        (res, a)
        for res, acts in PERMISSIONS["producer"].items()
        if res not in ("queue", "dlq")
        for a in acts
    }
    assert built == listed
