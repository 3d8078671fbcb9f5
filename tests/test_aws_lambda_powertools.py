"""The Lambda adapter beside Powertools for AWS Lambda (Logger, Metrics, Tracer):
their decorators around our handler, both sets of logs and metrics intact, and the
adapter needing none of it."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from test_aws_lambda import BUDGET, RunningDown, Work, event_of
from worker_helpers import collect_journal, prepare, read_view

from sqs_lease import App, JobContext, Producer
from sqs_lease._core.records import JobState
from sqs_lease.aws_lambda import handler
from sqs_lease.metrics import EmfMetrics

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient


class PowertoolsContext(RunningDown):
    """Lambda's context as Powertools' Logger reads it, time running down as ours reads it."""

    function_name = "agent-tools"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:agent-tools"
    memory_limit_in_mb = 512
    aws_request_id = "c6af9ac6-7b61-11e6-9a41-93e812345678"
    log_group_name = "/aws/lambda/agent-tools"
    log_stream_name = "2026/12/03/[$LATEST]0123456789abcdef"


def _documents(text: str) -> list[dict[str, Any]]:
    """Every stdout line as JSON: a line that does not parse fails the test."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_powertools_logger_metrics_and_tracer_wrap_our_handler_and_both_keep_their_output(
    aws: AwsTestEnv,
    sqs_client: SQSClient,
    ddb_client: DynamoDBClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from aws_lambda_powertools import Logger, Metrics, Tracer
    from aws_lambda_powertools.metrics import MetricUnit

    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("work", payload=Work, **BUDGET)
    def work(ctx: JobContext[Work], p: Work) -> dict[str, int]:
        return {"n": p.n}

    producer = Producer(settings, app)
    job_ids = [producer.submit("work", Work(n=i)).job_id for i in range(2)]
    event = event_of(sqs_client, producer.queue_url, 2)
    # Ours: EMF from our journal, flushed by our handler at the end of each invocation.
    ours = handler(app, settings, metrics=EmfMetrics(app))

    logger = Logger(service="agent-tools")
    metrics = Metrics(namespace="AgentTools", service="agent-tools")
    tracer = Tracer(service="agent-tools")  # outside Lambda it records nothing

    @tracer.capture_lambda_handler
    @logger.inject_lambda_context(log_event=False)
    @metrics.log_metrics(capture_cold_start_metric=True)
    def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        metrics.add_metric(name="Batches", unit=MetricUnit.Count, value=1)
        logger.info("batch received", extra={"records": len(event["Records"])})
        answer = ours(event, context)
        logger.info("batch done", extra={"failures": len(answer["batchItemFailures"])})
        return answer

    capsys.readouterr()
    with collect_journal() as seen:
        answer = lambda_handler(event, PowertoolsContext(60))
    stdout = capsys.readouterr().out

    assert answer == {"batchItemFailures": []}
    for job_id in job_ids:
        assert read_view(ddb_client, settings, job_id).state is JobState.SUCCEEDED
    docs = _documents(stdout)
    # Their Logger: structured lines with the Lambda context it injected.
    logs = [d for d in docs if d.get("service") == "agent-tools" and "message" in d]
    assert [d["message"] for d in logs] == ["batch received", "batch done"]
    assert all(d["function_name"] == "agent-tools" and d["cold_start"] is True for d in logs)
    assert logs[0]["records"] == 2 and logs[1]["failures"] == 0
    # Their Metrics: EMF in their namespace, with their metric and cold start.
    theirs = [d for d in docs if _namespace(d) == "AgentTools"]
    assert any(d.get("Batches") == [1.0] or d.get("Batches") == 1.0 for d in theirs), theirs
    assert any("ColdStart" in d for d in theirs)
    # Ours: EMF in our namespace, per job class, never in theirs.
    mine = [d for d in docs if _namespace(d) == "SqsLease"]
    assert mine and all(d.get("JobClass") == "work" for d in mine)
    assert sum(_value(d, "JobsSucceeded") for d in mine) == 2
    assert not any("JobsSucceeded" in d for d in theirs)
    # Our journal still went to its own logger, not into theirs.
    assert {"job_claimed", "result_committed"} <= {e["event"] for e in seen.events()}
    assert not any(d.get("event") for d in docs)


def test_the_lambda_adapter_and_its_sinks_import_and_build_without_powertools() -> None:
    code = """
import sys
sys.modules["aws_lambda_powertools"] = None  # importing it now raises ImportError
import sqs_lease.aws_lambda, sqs_lease.metrics, sqs_lease.tracing, sqs_lease.service
from sqs_lease import App
from sqs_lease.aws_lambda import handler
app = App()
app.job("noop", payload=__import__("pydantic").BaseModel)(lambda ctx, p: None)
handler(app)  # built without AWS: the shell is made at the first invocation
print(sorted(m for m in sys.modules if m.startswith("aws_lambda_powertools")))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['aws_lambda_powertools']"  # only the block itself


def _namespace(doc: dict[str, Any]) -> str | None:
    directives = doc.get("_aws", {}).get("CloudWatchMetrics", [])
    return str(directives[0]["Namespace"]) if directives else None


def _value(doc: dict[str, Any], name: str) -> float:
    v = doc.get(name, 0)
    return float(sum(v)) if isinstance(v, list) else float(v)
