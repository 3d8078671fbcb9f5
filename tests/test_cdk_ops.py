"""Operating the deployed stack (issue 27): alarms an operator hears, tracing, the
event source's concurrency, the queue's retention; on synthesised templates, with
cdk-nag's AwsSolutions pack."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk.assertions import Template
from pydantic import BaseModel
from test_cdk import EXAMPLE

from sqs_lease import ConfigError, JobClass
from sqs_lease._core.eventsource import END_MARGIN_SECONDS
from sqs_lease.deploy import (
    DLQ_RETENTION_SECONDS,
    LAMBDA_MAX_CONCURRENCY,
    QUEUE_RETENTION_SECONDS,
    duration_alarm_seconds,
)
from sqs_lease_cdk import LambdaConsumer, LeasedQueue, LeaseMonitoring, LeaseTables

pytestmark = pytest.mark.xdist_group("cdk")
Json = dict[str, Any]
HANDLERS = Path(__file__).resolve().parent.parent / "cdk" / "handlers"
TOPIC = "arn:aws:sns:us-east-1:123456789012:ops-pager"
OTHER = "arn:aws:sns:us-east-1:123456789012:ops-chat"


class Work(BaseModel):
    n: int = 0


def _of_type(tpl: Json, kind: str) -> dict[str, Json]:
    return {k: v for k, v in tpl["Resources"].items() if v["Type"] == kind}


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Any:
    app = cdk.App(outdir=str(tmp_path_factory.mktemp("cdk.out")))
    return EXAMPLE.ExampleStack(
        app, "OpsExample", prefix=f"o{uuid.uuid4().hex[:10]}", alarm_topic_arn=TOPIC
    )


@pytest.fixture(scope="module")
def example_tpl(example: Any) -> Json:
    out: Json = Template.from_stack(example).to_json()
    return out


def _small(
    *, tracing: bool = False, reserved: int | None = None, max_concurrency: int | None = 20
) -> cdk.Stack:
    """A queue, tables, a Lambda consumer and its monitoring: no VPC, a quick synth."""
    stack = cdk.Stack(cdk.App(), f"S{uuid.uuid4().hex[:8]}")
    c = JobClass(
        name="work",
        payload_model=Work,
        lease_seconds=30,
        max_attempts=3,
        stage_budget_seconds=60.0,
        effect_timeout_seconds=30.0,
    )
    queue = LeasedQueue(
        stack, "Queue", job_classes=[c], prefix="small", lambda_timeout=cdk.Duration.seconds(120)
    )
    tables = LeaseTables(stack, "Tables", prefix="small")
    consumer = LambdaConsumer(
        stack,
        "Consumer",
        queue=queue,
        tables=tables,
        code=lambda_.Code.from_asset(str(HANDLERS)),
        app_ref="example_jobs:app",
        tracing=tracing,
        reserved_concurrency=reserved,
        max_concurrency=max_concurrency,
    )
    LeaseMonitoring(
        stack,
        "Monitoring",
        queue=queue,
        lambda_consumer=consumer,
        alarm_topic=sns.Topic.from_topic_arn(stack, "Pager", TOPIC),
        alarm_actions=[cw_actions.SnsAction(sns.Topic.from_topic_arn(stack, "Chat", OTHER))],
    )
    return stack


def _function_alarms(tpl: Json) -> dict[str, Json]:
    """The alarms on AWS/Lambda metrics, by '<function logical id>:<metric>'."""
    out = {}
    for alarm in _of_type(tpl, "AWS::CloudWatch::Alarm").values():
        props = alarm["Properties"]
        # A labelled metric is written as a one-metric query: read both forms.
        if "Metrics" in props:
            if len(props["Metrics"]) != 1:
                continue  # a sum over the job classes' EMF metrics
            (query,) = props["Metrics"]
            metric, stat = query["MetricStat"]["Metric"], query["MetricStat"]["Stat"]
        else:
            metric, stat = props, props["Statistic"]
        if metric["Namespace"] == "AWS/Lambda":
            (dim,) = metric["Dimensions"]
            out[f"{dim['Value']['Ref']}:{metric['MetricName']}"] = {**props, "Statistic": stat}
    return out


def test_the_example_alarms_on_the_functions_errors_throttles_and_duration_near_timeout(
    example_tpl: Json, example: Any
) -> None:
    fn = example.get_logical_id(example.lambda_consumer.function.node.default_child)
    sweep = example.get_logical_id(example.lambda_consumer.sweep_function.node.default_child)
    alarms = _function_alarms(example_tpl)
    assert set(alarms) == {f"{fn}:Errors", f"{fn}:Throttles", f"{fn}:Duration", f"{sweep}:Errors"}
    timeout = example.lambda_consumer.function_timeout_seconds
    near = alarms[f"{fn}:Duration"]
    assert near["Statistic"] == "Maximum"
    assert near["Threshold"] == 1000 * (timeout - END_MARGIN_SECONDS)
    assert near["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    for name in ("Errors", "Throttles"):
        assert alarms[f"{fn}:{name}"]["Threshold"] == 1
        assert alarms[f"{fn}:{name}"]["Statistic"] == "Sum"


def test_every_alarm_of_the_example_publishes_to_the_operators_topic(example_tpl: Json) -> None:
    alarms = {
        name: alarm
        for name, alarm in _of_type(example_tpl, "AWS::CloudWatch::Alarm").items()
        # The Fargate service's step scaling keeps its own alarms and actions.
        if not name.startswith("FargateConsumer")
    }
    assert len(alarms) == 11  # 5 EMF, DLQ, oldest message, 3 on the function, 1 on the sweep
    for name, alarm in alarms.items():
        assert alarm["Properties"].get("AlarmActions") == [TOPIC], name


def test_the_event_source_has_a_maximum_concurrency_and_the_queue_an_explicit_retention(
    example_tpl: Json,
) -> None:
    (esm,) = _of_type(example_tpl, "AWS::Lambda::EventSourceMapping").values()
    assert esm["Properties"]["ScalingConfig"] == {"MaximumConcurrency": LAMBDA_MAX_CONCURRENCY}
    queues = {
        q["Properties"]["QueueName"]: q["Properties"]
        for q in _of_type(example_tpl, "AWS::SQS::Queue").values()
    }
    (job_queue,) = [p for n, p in queues.items() if not n.endswith("-dlq")]
    (dlq,) = [p for n, p in queues.items() if n.endswith("-dlq")]
    assert job_queue["MessageRetentionPeriod"] == QUEUE_RETENTION_SECONDS
    assert dlq["MessageRetentionPeriod"] == DLQ_RETENTION_SECONDS > QUEUE_RETENTION_SECONDS


def test_tracing_an_sns_topic_and_any_alarm_action_stay_clean_under_cdk_nag() -> None:
    from cdk_nag import AwsSolutionsChecks

    stack = _small(tracing=True, reserved=20)
    tpl: Json = Template.from_stack(stack).to_json()
    functions = _of_type(tpl, "AWS::Lambda::Function")
    assert len(functions) == 2  # the consumer and its sweep, both traced
    assert all(f["Properties"]["TracingConfig"] == {"Mode": "Active"} for f in functions.values())
    consumer = next(f for f in functions.values() if f["Properties"]["Handler"].endswith(".entry"))
    assert consumer["Properties"]["ReservedConcurrentExecutions"] == 20
    for name, alarm in _of_type(tpl, "AWS::CloudWatch::Alarm").items():
        assert sorted(alarm["Properties"]["AlarmActions"]) == sorted([TOPIC, OTHER]), name
    report = AwsSolutionsChecks(stack.node.root).validate_scope(stack)
    assert [
        (v.rule_name, [r.construct_path for r in v.violating_resources]) for v in report.violations
    ] == []


def test_untraced_functions_have_no_tracing_and_no_wildcard_grant() -> None:
    tpl: Json = Template.from_stack(_small()).to_json()
    for f in _of_type(tpl, "AWS::Lambda::Function").values():
        assert "TracingConfig" not in f["Properties"]
    for policy in _of_type(tpl, "AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            assert statement["Resource"] != "*", statement


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_concurrency": 1}, "max_concurrency=1: an SQS event source takes 2..1000"),
        ({"max_concurrency": 1001}, "max_concurrency=1001"),
        ({"reserved": 5, "max_concurrency": 10}, "reserved_concurrency=5 is below"),
        ({"reserved": 0, "max_concurrency": None}, "reserved_concurrency=0: give 1 or more"),
    ],
)
def test_a_concurrency_the_event_source_or_lambda_would_refuse_or_throttle_is_refused(
    kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        _small(**kwargs)


def test_the_duration_alarm_sits_in_the_end_margin_of_the_budget_rule() -> None:
    from sqs_lease._core.eventsource import can_start

    timeout = 300
    near = duration_alarm_seconds(timeout, END_MARGIN_SECONDS)
    # The last record a healthy invocation starts has its whole budget and the
    # margin left; kept to its budget, the invocation ends by `near`.
    budget = 120.0
    started_at = timeout - (budget + END_MARGIN_SECONDS)
    assert can_start(int((timeout - started_at) * 1000), budget)
    assert started_at + budget <= near < timeout
