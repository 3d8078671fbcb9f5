"""The CDK constructs (cdk/): one synthesised example stack, checked as a template,
by cdk-nag's AwsSolutions pack and cfn-lint, and deployed in shape on the emulator.

One synthesis (module-scoped fixtures) serves every test: jsii makes each one slow.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_lambda as lambda_
from aws_cdk.assertions import Template
from cdk_example import load_example

from sqs_lease import App, ConfigError, JobClass, JobClassError, Settings, WarmThroughput
from sqs_lease.deploy import (
    GC_TTL_ATTRIBUTE,
    TABLE_MODELS,
    ecs_stop_timeout,
    max_receive_count_for,
    model_attributes,
    redrive_too_tight,
    submit_requests,
    table_params,
)
from sqs_lease.metrics import METRICS, EmfMetrics
from sqs_lease_cdk import (
    ALARM_METRICS,
    LAMBDA_HANDLER,
    SWEEP_HANDLER,
    FargateConsumer,
    LambdaConsumer,
    LeasedQueue,
    LeaseMonitoring,
    LeaseTables,
    metrics_namespace,
)

ROOT = Path(__file__).resolve().parent.parent
CDK_DIR = ROOT / "cdk"

# One xdist worker runs this file (`make test` uses --dist loadgroup): its module
# fixtures synthesize each stack once (jsii and node: CPU-seconds each).
pytestmark = pytest.mark.xdist_group("cdk")
PREFIX = f"t{uuid.uuid4().hex[:10]}"
"""Unique per run: the deploy-shaped test creates these names on the shared emulator."""

Json = dict[str, Any]


EXAMPLE = load_example("cdk_example_app")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    app = cdk.App(outdir=str(tmp_path_factory.mktemp("cdk.out")))
    # A prebuilt asset (the job module only): the bundled asset is tests/test_lambda_asset.py's.
    return EXAMPLE.ExampleStack(app, "Example", prefix=PREFIX, lambda_asset=EXAMPLE.HANDLERS)


@pytest.fixture(scope="module")
def template(stack: Any) -> Template:
    return Template.from_stack(stack)


@pytest.fixture(scope="module")
def tpl(template: Template) -> Json:
    out: Json = template.to_json()
    return out


@pytest.fixture(scope="module")
def jobs() -> App:
    app: App = EXAMPLE.load_jobs()
    return app


def _of_type(tpl: Json, kind: str) -> dict[str, Json]:
    return {k: v for k, v in tpl["Resources"].items() if v["Type"] == kind}


def _queues(tpl: Json) -> tuple[Json, Json]:
    """(job queue, DLQ) properties: the job queue is the one with a redrive policy
    (and not the interactive queue, which has one too)."""
    queues = _of_type(tpl, "AWS::SQS::Queue")
    main = next(
        v
        for v in queues.values()
        if "RedrivePolicy" in v["Properties"] and "-interactive" not in v["Properties"]["QueueName"]
    )
    dlq_id = main["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
    return main["Properties"], queues[dlq_id]["Properties"]


def _tables(tpl: Json) -> dict[str, Json]:
    return {
        v["Properties"]["TableName"]: v["Properties"]
        for v in _of_type(tpl, "AWS::DynamoDB::Table").values()
    }


def _role_statements(tpl: Json, role_fragment: str) -> list[Json]:
    """Every statement of the policies attached to roles whose id contains the fragment."""
    out: list[Json] = []
    for policy in _of_type(tpl, "AWS::IAM::Policy").values():
        roles = [r["Ref"] for r in policy["Properties"]["Roles"]]
        if any(role_fragment in r for r in roles):
            out += policy["Properties"]["PolicyDocument"]["Statement"]
    return out


def _consumer_fn(tpl: Json) -> Json:
    """The consumer function (the one behind the event source, not the sweep)."""
    (fn,) = [
        f
        for f in _of_type(tpl, "AWS::Lambda::Function").values()
        if f["Properties"]["Handler"] == LAMBDA_HANDLER
    ]
    return fn


def _actions(statement: Json) -> list[str]:
    a = statement["Action"]
    return [a] if isinstance(a, str) else list(a)


def _resources(statement: Json) -> list[Any]:
    r = statement["Resource"]
    return r if isinstance(r, list) else [r]


# ------------------------------------------------------------------ the template


def test_the_example_stack_has_the_expected_resources(template: Template) -> None:
    template.resource_count_is("AWS::SQS::Queue", 2)
    template.resource_count_is("AWS::SQS::QueuePolicy", 2)
    template.resource_count_is("AWS::DynamoDB::Table", 5)  # jobs, intents, attempts, groups, slots
    template.resource_count_is("AWS::Lambda::Function", 2)  # the consumer, its scheduled sweep
    template.resource_count_is("AWS::Events::Rule", 1)
    template.resource_count_is("AWS::Lambda::EventSourceMapping", 1)
    template.resource_count_is("AWS::ECS::Service", 1)
    template.resource_count_is("AWS::CloudWatch::Dashboard", 1)
    # One alarm per library metric, the DLQ depth, the oldest message, two scaling steps,
    # the function's errors, throttles and duration near its timeout, the sweep's errors.
    template.resource_count_is("AWS::CloudWatch::Alarm", len(ALARM_METRICS) + 2 + 2 + 4)
    # The alarms read the EMF metrics the consumers write: no log metric filter.
    template.resource_count_is("AWS::Logs::MetricFilter", 0)


def test_the_queue_visibility_and_redrive_follow_from_the_job_classes(tpl: Json, jobs: App) -> None:
    queue, dlq = _queues(tpl)
    classes = [r.job_class for r in jobs.classes.values()]
    # The example sizes the queue for its Lambda consumer: 6 x 300 s (no window).
    assert queue["VisibilityTimeout"] == max(6 * 300, *(c.lease_seconds for c in classes))
    count = queue["RedrivePolicy"]["maxReceiveCount"]
    assert count == max_receive_count_for(c.max_attempts for c in classes)
    assert not redrive_too_tight(count, max(c.max_attempts for c in classes))
    assert queue["QueueName"] == f"{PREFIX}-jobs"
    assert dlq["QueueName"] == f"{PREFIX}-jobs-dlq"
    assert dlq["MessageRetentionPeriod"] == 14 * 24 * 3600
    assert queue["SqsManagedSseEnabled"] is True and dlq["SqsManagedSseEnabled"] is True


def test_both_queues_deny_access_without_tls(tpl: Json) -> None:
    policies = _of_type(tpl, "AWS::SQS::QueuePolicy").values()
    for policy in policies:
        (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
        assert statement["Effect"] == "Deny"
        assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        assert statement["Action"] == "sqs:*"


def test_the_tables_take_keys_and_indexes_from_the_library_models(tpl: Json) -> None:
    tables = _tables(tpl)
    expected = table_params(Settings(prefix=PREFIX))
    assert set(tables) == {p["TableName"] for p in expected.values()}
    for role, params in expected.items():
        got = tables[params["TableName"]]
        assert got["KeySchema"] == params["KeySchema"]
        assert sorted(got["AttributeDefinitions"], key=str) == sorted(
            params["AttributeDefinitions"], key=str
        )
        assert got.get("GlobalSecondaryIndexes", []) == params.get("GlobalSecondaryIndexes", [])
        # Checked against the models directly too, not only through table_params.
        model = TABLE_MODELS[role]
        hash_keys = [n for n, a in model.get_attributes().items() if a.is_hash_key]
        assert [k["AttributeName"] for k in got["KeySchema"] if k["KeyType"] == "HASH"] == (
            hash_keys
        )
    indexes = {i["IndexName"]: i for i in tables[f"{PREFIX}-jobs"]["GlobalSecondaryIndexes"]}
    assert set(indexes) == {"unsent", "group", "attention", "workers"}
    assert indexes["unsent"]["Projection"]["ProjectionType"] == "INCLUDE"


def test_the_tables_are_on_demand_recoverable_protected_and_ttl_is_only_garbage_collection(
    tpl: Json,
) -> None:
    for name, table in _tables(tpl).items():
        assert table["BillingMode"] == "PAY_PER_REQUEST", name
        assert table["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}, (
            name
        )
        assert table["DeletionProtectionEnabled"] is True, name
        assert table["TimeToLiveSpecification"] == {
            "AttributeName": GC_TTL_ATTRIBUTE,
            "Enabled": True,
        }, name
    for resource in _of_type(tpl, "AWS::DynamoDB::Table").values():
        assert resource["DeletionPolicy"] == "Retain"
    # No model has the TTL attribute: no decision can read it.
    for role in TABLE_MODELS:
        assert GC_TTL_ATTRIBUTE not in model_attributes(role)


def test_the_lambda_consumer_reports_partial_batch_failures_within_aws_timing(
    template: Template, tpl: Json
) -> None:
    template.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        # One record a batch: the example's budgets (240 s, 280 s) fit once in 300 s
        # (batch_size_for), so no record is received only to be released.
        {"FunctionResponseTypes": ["ReportBatchItemFailures"], "BatchSize": 1},
    )
    props = _consumer_fn(tpl)["Properties"]
    assert props["Handler"] == LAMBDA_HANDLER
    assert props["Timeout"] == 300
    queue, _ = _queues(tpl)
    assert queue["VisibilityTimeout"] >= 6 * props["Timeout"]
    env = props["Environment"]["Variables"]
    assert env == {
        "SQS_LEASE_PREFIX": PREFIX,
        "SQS_LEASE_QUEUE": f"{PREFIX}-jobs",
        "SQS_LEASE_APP": "example_jobs:app",
        "SQS_LEASE_METRICS": "true",
        "SQS_LEASE_METRICS_NAMESPACE": f"SqsLease/{PREFIX}",
    }


def _sweep_fn(tpl: Json) -> tuple[str, Json]:
    (found,) = [
        (k, f)
        for k, f in _of_type(tpl, "AWS::Lambda::Function").items()
        if f["Properties"]["Handler"] == SWEEP_HANDLER
    ]
    return found


def test_the_lambda_consumer_has_a_scheduled_sweep_on_its_code_and_environment(
    tpl: Json,
) -> None:
    # Regression (issue 33 item 1): a Lambda-only deployment had no sweep, so a job
    # without a message (or whose message SQS moved to the DLQ) waited forever.
    consumer = _consumer_fn(tpl)["Properties"]
    sweep_id, sweep = _sweep_fn(tpl)
    props = sweep["Properties"]
    for same in ("Code", "Runtime", "MemorySize", "Environment"):
        assert props[same] == consumer[same], same
    assert props["Timeout"] == 120
    (invoke,) = _of_type(tpl, "AWS::Lambda::EventInvokeConfig").values()
    assert invoke["Properties"]["FunctionName"] == {"Ref": sweep_id}
    assert invoke["Properties"]["MaximumRetryAttempts"] == 0
    (rule,) = _of_type(tpl, "AWS::Events::Rule").values()
    assert rule["Properties"]["ScheduleExpression"] == "rate(5 minutes)"
    assert rule["Properties"]["State"] == "ENABLED"
    (target,) = rule["Properties"]["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [sweep_id, "Arn"]}
    assert target["RetryPolicy"]["MaximumRetryAttempts"] == 0
    (permission,) = [
        p["Properties"]
        for p in _of_type(tpl, "AWS::Lambda::Permission").values()
        if p["Properties"]["Principal"] == "events.amazonaws.com"
    ]
    assert permission["FunctionName"] == {"Fn::GetAtt": [sweep_id, "Arn"]}
    # The sweep is not behind the event source: only the consumer is.
    (mapping,) = _of_type(tpl, "AWS::Lambda::EventSourceMapping").values()
    assert mapping["Properties"]["FunctionName"] != {"Ref": sweep_id}


def test_the_sweep_role_may_send_look_at_the_dlq_and_take_or_park_records_only(
    tpl: Json,
) -> None:
    statements = _role_statements(tpl, "LambdaConsumerSweepRole")
    granted: dict[str, set[str]] = {}
    for st in statements:
        assert st["Effect"] == "Allow"
        for action in _actions(st):
            for resource in _resources(st):
                granted.setdefault(action, set()).add(json.dumps(resource, sort_keys=True))
    sqs = {a for a in granted if a.startswith("sqs:")}
    ddb = {a for a in granted if a.startswith("dynamodb:")}
    assert sqs == {
        "sqs:SendMessage",
        "sqs:GetQueueUrl",
        "sqs:GetQueueAttributes",
        "sqs:ReceiveMessage",
        "sqs:ChangeMessageVisibility",
    }
    assert ddb == {
        "dynamodb:DescribeTable",
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
        "dynamodb:Query",
    }
    queue, _ = _queues(tpl)
    job_queue = _queue_id(tpl, queue["QueueName"])
    dlq_id = queue["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
    arn = {
        id_: json.dumps({"Fn::GetAtt": [id_, "Arn"]}, sort_keys=True) for id_ in (job_queue, dlq_id)
    }
    # It receives from the DLQ only (and gives back); it sends to the job queue only.
    assert granted["sqs:ReceiveMessage"] == {arn[dlq_id]}
    assert granted["sqs:ChangeMessageVisibility"] == {arn[dlq_id]}
    assert granted["sqs:SendMessage"] == {arn[job_queue]}
    # Query on the unsent index only; reads and writes on the jobs table only.
    (query_on,) = granted["dynamodb:Query"]
    assert "/index/unsent" in query_on
    for action in ("dynamodb:GetItem", "dynamodb:UpdateItem"):
        (on,) = granted[action]
        assert "Jobs" in on and "index" not in on, (action, on)
    # The shell checks the tables it uses exist (not groups: PERMISSIONS["sweeper"]).
    assert len(granted["dynamodb:DescribeTable"]) == 4
    assert any("Logs" in json.dumps(st["Resource"]) for st in statements)  # its own log group


def test_a_sweep_schedule_that_cannot_hold_one_sweep_at_a_time_is_refused() -> None:
    def consumer(**kw: Any) -> cdk.Stack:
        scope = _scratch()
        queue = LeasedQueue(  # a class that starts in a 60 s function (50 s + the margin)
            scope,
            "Q",
            job_classes=[_class(stage_budget_seconds=50.0, effect_timeout_seconds=30.0)],
            lambda_timeout=cdk.Duration.seconds(60),
        )
        tables = LeaseTables(scope, "T")
        code = lambda_.Code.from_asset(str(CDK_DIR / "handlers"))
        LambdaConsumer(scope, "L", queue=queue, tables=tables, code=code, app_ref="m:app", **kw)
        return scope

    with pytest.raises(ConfigError, match="sweep_every=90 s: an EventBridge schedule"):
        consumer(sweep_every=cdk.Duration.seconds(90))
    with pytest.raises(ConfigError, match=r"sweep_timeout=300 s: .* below sweep_every"):
        consumer(sweep_every=cdk.Duration.minutes(5), sweep_timeout=cdk.Duration.minutes(5))
    with pytest.raises(ConfigError, match="sweep_timeout=10 s: give 30 s or more"):
        consumer(sweep_timeout=cdk.Duration.seconds(10))
    # Without the schedule: one function, no rule (a deployment that sweeps otherwise).
    bare: Json = Template.from_stack(consumer(sweep_every=None)).to_json()
    assert len(_of_type(bare, "AWS::Lambda::Function")) == 1
    assert _of_type(bare, "AWS::Events::Rule") == {}


def test_the_fargate_stop_timeout_matches_the_worker_shutdown_deadline(tpl: Json) -> None:
    (task,) = _of_type(tpl, "AWS::ECS::TaskDefinition").values()
    (container,) = task["Properties"]["ContainerDefinitions"]
    assert container["StopTimeout"] == ecs_stop_timeout(20.0) == 30
    command = container["Command"]
    assert command[:3] == ["sqs-lease", "worker", "example_jobs:app"]
    assert command[command.index("--shutdown-grace") + 1] == "20"
    assert {e["Name"]: e["Value"] for e in container["Environment"]} == {
        "SQS_LEASE_PREFIX": PREFIX,
        "SQS_LEASE_QUEUE": f"{PREFIX}-jobs",
        "SQS_LEASE_APP": "example_jobs:app",
        "SQS_LEASE_METRICS": "true",
        "SQS_LEASE_METRICS_NAMESPACE": f"SqsLease/{PREFIX}",
    }


def test_the_fargate_service_scales_on_backlog_per_task(tpl: Json) -> None:
    policies = _of_type(tpl, "AWS::ApplicationAutoScaling::ScalingPolicy")
    assert len(policies) == 2  # scale out and scale in
    alarms = _of_type(tpl, "AWS::CloudWatch::Alarm").values()
    scaling = [
        a
        for a in alarms
        if any("visible" in m.get("Expression", "") for m in a["Properties"].get("Metrics", []))
    ]
    assert len(scaling) == 2
    for alarm in scaling:
        expressions = [m for m in alarm["Properties"]["Metrics"] if "Expression" in m]
        assert expressions[0]["Expression"] == "(visible + inflight) / IF(tasks < 1, 1, tasks)"
        names = {
            m["MetricStat"]["Metric"]["MetricName"]
            for m in alarm["Properties"]["Metrics"]
            if "MetricStat" in m
        }
        assert names == {
            "ApproximateNumberOfMessagesVisible",
            "ApproximateNumberOfMessagesNotVisible",
            "RunningTaskCount",
        }


def _alarm_metrics(tpl: Json) -> dict[tuple[str, str], Json]:
    """Alarms on one metric, by (namespace, metric name)."""
    out: dict[tuple[str, str], Json] = {}
    for alarm in _of_type(tpl, "AWS::CloudWatch::Alarm").values():
        props = alarm["Properties"]
        stats = [m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m]
        if "MetricName" in props:
            stats = [props]
        if len(stats) == 1:
            out[(stats[0]["Namespace"], stats[0]["MetricName"])] = props
    return out


def _emf_alarms(tpl: Json) -> dict[str, Json]:
    """Alarms on a math expression over metrics, by the one metric name they sum."""
    out: dict[str, Json] = {}
    for alarm in _of_type(tpl, "AWS::CloudWatch::Alarm").values():
        props = alarm["Properties"]
        stats = [m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m]
        sums = [m for m in props.get("Metrics", []) if m.get("Expression", "").startswith("SUM(")]
        if sums:
            (name,) = {m["MetricName"] for m in stats}
            out[name] = props
    return out


def test_alarms_watch_the_library_metrics_the_dlq_and_the_oldest_message(tpl: Json) -> None:
    alarms = _alarm_metrics(tpl)
    assert alarms[("AWS/SQS", "ApproximateNumberOfMessagesVisible")]["Threshold"] == 1
    assert alarms[("AWS/SQS", "ApproximateAgeOfOldestMessage")]["Threshold"] == 2 * 1800
    emf = _emf_alarms(tpl)
    assert set(emf) == {m.metric_name for m in ALARM_METRICS}
    for m in ALARM_METRICS:
        assert emf[m.metric_name]["Threshold"] == m.threshold


def test_the_alarms_name_exactly_the_metrics_namespace_and_dimensions_the_library_writes(
    tpl: Json, jobs: App
) -> None:
    # One source of truth: what EmfMetrics writes for the example's classes, in the
    # namespace both consumers are told, is what every alarm sums.
    namespace = metrics_namespace(PREFIX)
    for fn in _of_type(tpl, "AWS::Lambda::Function").values():
        env = fn["Properties"]["Environment"]["Variables"]
        assert (env["SQS_LEASE_METRICS"], env["SQS_LEASE_METRICS_NAMESPACE"]) == (
            "true",
            namespace,
        )
    (task,) = _of_type(tpl, "AWS::ECS::TaskDefinition").values()
    (container,) = task["Properties"]["ContainerDefinitions"]
    ecs_env = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert ecs_env["SQS_LEASE_METRICS_NAMESPACE"] == namespace
    assert ecs_env["SQS_LEASE_METRICS"] == "true"
    written: set[tuple[str, str, tuple[tuple[str, str], ...]]] = set()
    for doc in EmfMetrics(jobs, namespace=namespace).documents():
        (directive,) = doc["_aws"]["CloudWatchMetrics"]
        (dims,) = directive["Dimensions"]
        for metric in directive["Metrics"]:
            written.add((directive["Namespace"], metric["Name"], tuple((d, doc[d]) for d in dims)))
    alarmed = set()
    for props in _emf_alarms(tpl).values():
        for m in props["Metrics"]:
            if "MetricStat" in m:
                stat = m["MetricStat"]["Metric"]
                dims = tuple((d["Name"], d["Value"]) for d in stat["Dimensions"])
                alarmed.add((stat["Namespace"], stat["MetricName"], dims))
    assert alarmed and alarmed <= written, alarmed - written
    # Every class of the queue is summed in every alarm.
    assert len(alarmed) == len(ALARM_METRICS) * len(jobs.classes)
    assert {m.metric_name for m in ALARM_METRICS} <= {m.name for m in METRICS}


def test_an_alarm_on_a_metric_the_library_does_not_write_is_refused() -> None:
    from sqs_lease_cdk import AlarmMetric

    with pytest.raises(ConfigError, match="metric_name='LeasesExpired'"):
        AlarmMetric("LeasesExpired", "Expired leases", 5)


# ------------------------------------------------------------------ least privilege


def test_no_policy_grants_a_wildcard_resource(tpl: Json) -> None:
    for pid, policy in _of_type(tpl, "AWS::IAM::Policy").items():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            for resource in _resources(statement):
                assert "*" not in json.dumps(resource), (pid, statement)


def test_the_consumers_get_the_worker_actions_on_their_own_resources_only(tpl: Json) -> None:
    for fragment in ("LambdaConsumerRole", "FargateConsumerTaskTaskRole"):
        statements = _role_statements(tpl, fragment)
        granted: dict[str, set[str]] = {}
        for s in statements:
            assert s["Effect"] == "Allow"
            for action in _actions(s):
                for resource in _resources(s):
                    granted.setdefault(action, set()).add(json.dumps(resource, sort_keys=True))
        sqs = {a for a in granted if a.startswith("sqs:")}
        ddb = {a for a in granted if a.startswith("dynamodb:")}
        assert sqs == {
            "sqs:ReceiveMessage",
            "sqs:ChangeMessageVisibility",
            "sqs:DeleteMessage",
            "sqs:SendMessage",
            "sqs:GetQueueUrl",
            "sqs:GetQueueAttributes",
        }, fragment
        assert ddb == {
            "dynamodb:DescribeTable",
            "dynamodb:GetItem",
            "dynamodb:BatchGetItem",
            "dynamodb:UpdateItem",
            "dynamodb:PutItem",
            "dynamodb:ConditionCheckItem",
            "dynamodb:Query",
        }, fragment
        # Nothing that deletes records or scans: the worker never does.
        assert not {a for a in granted if "Delete" in a and a.startswith("dynamodb:")}
        # The only index granted is the one the worker queries, by name.
        (query_on,) = [granted["dynamodb:Query"]]
        assert any("/index/unsent" in r for r in query_on), query_on
        # Receive is granted on the job queue and the DLQ (the sweep's reconciliation
        # looks at a few DLQ messages and gives them back), delete on the job queue only.
        assert len(granted["sqs:ReceiveMessage"]) == 2
        assert len(granted["sqs:DeleteMessage"]) == 1
        # PutItem on the jobs table only for its liveness record (worker#<id> keys):
        # the worker never creates a job record.
        for stmt in statements:
            if "dynamodb:PutItem" in _actions(stmt) and "Jobs" in json.dumps(stmt["Resource"]):
                leading = stmt["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
                assert leading == ["worker#*"], stmt


def _table_logical_id(tpl: Json, role: str) -> str:
    name = getattr(Settings.from_env({}, prefix=PREFIX), f"{role}_table")
    (found,) = [
        k
        for k, v in _of_type(tpl, "AWS::DynamoDB::Table").items()
        if v["Properties"]["TableName"] == name
    ]
    return found


def _condition_holds(conditions: Json, context: dict[str, list[str]]) -> bool:
    """IAM's evaluation of the condition operators the producer grant uses, over a
    request's context (each key to its values; a key absent from the request is
    absent here). IAM cannot run locally: this is the part of it the grant relies on."""
    from fnmatch import fnmatchcase

    for operator, keys in conditions.items():
        for key, allowed in keys.items():
            allowed = [allowed] if isinstance(allowed, str) else allowed
            values = context.get(key)
            if operator == "ForAllValues:StringEquals":
                ok = all(v in allowed for v in values or [])
            elif operator == "ForAllValues:StringLike":
                ok = all(any(fnmatchcase(v, p) for p in allowed) for v in values or [])
            elif operator == "StringEquals":
                ok = values is not None and all(v in allowed for v in values)
            elif operator == "StringEqualsIfExists":
                ok = values is None or all(v in allowed for v in values)
            else:  # pragma: no cover - an operator this evaluator does not know
                raise AssertionError(f"unknown condition operator {operator}")
            if not ok:
                return False
    return True


def _allowed(tpl: Json, action: str, role: str, context: dict[str, list[str]]) -> bool:
    """Whether the producer role's policy allows ``action`` on table ``role`` for a
    request with this condition context (no Deny statements exist to consider)."""
    table = _table_logical_id(tpl, role)
    for stmt in _role_statements(tpl, "ProducerRole"):
        assert stmt["Effect"] == "Allow"
        if action not in _actions(stmt):
            continue
        if not any(json.dumps(r).count(f'"{table}"') for r in _resources(stmt)):
            continue
        if _condition_holds(stmt.get("Condition", {}), context):
            return True
    return False


def _context(
    attributes: Any, returns: str | None = "NONE", job_id: str = "job-1"
) -> dict[str, list[str]]:
    ctx = {"dynamodb:Attributes": sorted(attributes), "dynamodb:LeadingKeys": [job_id]}
    if returns is not None:
        ctx["dynamodb:ReturnValues"] = [returns]
    return ctx


def test_the_producer_role_may_only_send_and_write_what_submit_writes(tpl: Json) -> None:
    actions = {a for s in _role_statements(tpl, "ProducerRole") for a in _actions(s)}
    # No read of any job record (GetItem would show other jobs' payloads and results).
    assert actions == {
        "sqs:SendMessage",
        "sqs:GetQueueUrl",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
    }
    # Every DynamoDB statement is limited to named attributes and no whole-record read.
    for stmt in _role_statements(tpl, "ProducerRole"):
        if any(a.startswith("dynamodb:") for a in _actions(stmt)):
            cond = stmt["Condition"]
            assert "dynamodb:Attributes" in cond["ForAllValues:StringEquals"], stmt
            returns = cond["StringEqualsIfExists"]["dynamodb:ReturnValues"]
            assert not {"ALL_OLD", "ALL_NEW"} & set(returns), stmt


def test_every_request_submit_makes_is_allowed_by_the_producer_policy(tpl: Json) -> None:
    requests = submit_requests(Settings.from_env({}, prefix=PREFIX))
    assert {(r.action, r.role) for r in requests} == {
        ("dynamodb:PutItem", "jobs"),
        ("dynamodb:UpdateItem", "jobs"),
        ("dynamodb:UpdateItem", "groups"),
    }
    for r in requests:
        # PutItem sends no ReturnValues at all; the others NONE.
        returns = r.params.get("ReturnValues")
        assert _allowed(tpl, r.action, r.role, _context(r.attributes, returns)), r


@pytest.mark.parametrize(
    ("what", "action", "attributes", "returns"),
    [
        # The forgery of issue 32: a running job set succeeded with a made-up result.
        ("forged result", "dynamodb:UpdateItem", {"job_id", "state", "result"}, "NONE"),
        ("forged owner", "dynamodb:UpdateItem", {"job_id", "state", "owner"}, "NONE"),
        ("forged token", "dynamodb:UpdateItem", {"job_id", "state", "token"}, "NONE"),
        ("forged write id", "dynamodb:UpdateItem", {"job_id", "state", "write_id"}, "NONE"),
        ("read via ALL_NEW", "dynamodb:UpdateItem", {"job_id", "updated_at"}, "ALL_NEW"),
        ("read via ALL_OLD", "dynamodb:UpdateItem", {"job_id", "updated_at"}, "ALL_OLD"),
        ("payload rewrite", "dynamodb:UpdateItem", {"job_id", "payload"}, "NONE"),
        ("put with a result", "dynamodb:PutItem", {"job_id", "state", "result"}, None),
        ("put with an owner", "dynamodb:PutItem", {"job_id", "state", "owner"}, None),
        ("put reading back", "dynamodb:PutItem", {"job_id", "state"}, "ALL_OLD"),
        ("read", "dynamodb:GetItem", {"job_id"}, None),
        ("read many", "dynamodb:BatchGetItem", {"job_id"}, None),
        ("delete", "dynamodb:DeleteItem", {"job_id"}, None),
    ],
)
def test_the_producer_policy_refuses_what_submit_never_does(
    tpl: Json, what: str, action: str, attributes: set[str], returns: str | None
) -> None:
    assert not _allowed(tpl, action, "jobs", _context(attributes, returns)), what


def test_what_iam_cannot_stop_is_what_the_worker_refuses_to_take_for_its_own(tpl: Json) -> None:
    # The send writes condition on ``state``, so a producer may name it: IAM cannot
    # tell a condition from an update, nor limit a value. A bare `state = succeeded`
    # (no result, owner, token or write id) is allowed, and cdk/README.md says so;
    # the worker takes it for its own commit no more (its write id is not there:
    # test_core_flows' forged-record tests).
    assert _allowed(tpl, "dynamodb:UpdateItem", "jobs", _context({"job_id", "state"}))


def test_a_producer_may_be_confined_to_its_own_job_ids() -> None:
    app = cdk.App()
    stack = cdk.Stack(app, "Confined")
    tables = LeaseTables(
        stack,
        "Tables",
        prefix=PREFIX,
        deletion_protection=False,
        removal_policy=cdk.RemovalPolicy.DESTROY,
    )
    from aws_cdk import aws_iam as iam

    role = iam.Role(stack, "ProducerRole", assumed_by=iam.AccountRootPrincipal())
    tables.grant_producer(role, job_ids="orders-*")
    tpl = Template.from_stack(stack).to_json()
    for r in submit_requests(Settings.from_env({}, prefix=PREFIX)):
        returns = r.params.get("ReturnValues")
        mine = _context(r.attributes, returns, job_id="orders-17")
        theirs = _context(r.attributes, returns, job_id="billing-17")
        assert _allowed(tpl, r.action, r.role, mine), r
        assert _allowed(tpl, r.action, r.role, theirs) is (r.role != "jobs"), r
    with pytest.raises(ConfigError, match="job_ids"):
        tables.grant_producer(role, job_ids="*")


# ------------------------------------------------------------------ nag and lint


def test_cdk_nag_aws_solutions_reports_no_unsuppressed_finding(stack: Any) -> None:
    from cdk_nag import AwsSolutionsChecks

    report = AwsSolutionsChecks(stack.node.root).validate_scope(stack)
    found = [
        (v.rule_name, [r.construct_path for r in v.violating_resources]) for v in report.violations
    ]
    assert found == []
    assert report.success


def test_every_nag_acknowledgement_gives_a_reason(stack: Any) -> None:
    acknowledged: dict[str, str] = {}
    for construct in stack.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == "aws:cdk:acknowledged-rules":
                # aws-cdk-lib acknowledges some of its own template checks too.
                ours = {k: v for k, v in entry.data.items() if "AwsSolutions-" in k}
                acknowledged.update(ours)
    # The one suppression of the stack (README.md lists it with its reason).
    assert list(acknowledged) == ["Annotation::AwsSolutions-ECS2"]
    assert all(len(reason) > 40 for reason in acknowledged.values()), acknowledged


def test_cfn_lint_finds_no_error_in_the_template(tpl: Json) -> None:
    from cfnlint.api import lint_all

    matches = lint_all(json.dumps(tpl))
    errors = [m for m in matches if m.rule.id.startswith("E")]
    assert errors == []
    # The one warning kept: CDK's Function adds DependsOn on its own role (W3005,
    # "already enforced by a GetAtt"); the explicit order is harmless.
    warnings = {m.rule.id for m in matches if m.rule.id.startswith("W")}
    assert warnings <= {"W3005"}, [str(m) for m in matches]


# ------------------------------------------------------------------ FIFO + KMS

FIFO_PREFIX = f"f{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def fifo_stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The example with every option on: FIFO queues, a KMS key of its own, and the
    interactive queue (priorities)."""
    app = cdk.App(outdir=str(tmp_path_factory.mktemp("cdk.fifo.out")))
    return EXAMPLE.ExampleStack(
        app,
        "FifoExample",
        prefix=FIFO_PREFIX,
        fifo=True,
        encrypted=True,
        interactive=True,
        lambda_asset=EXAMPLE.HANDLERS,
    )


@pytest.fixture(scope="module")
def fifo_tpl(fifo_stack: Any) -> Json:
    out: Json = Template.from_stack(fifo_stack).to_json()
    return out


def _key_id(tpl: Json) -> str:
    (key_id,) = _of_type(tpl, "AWS::KMS::Key")
    return key_id


def test_a_fifo_stack_makes_both_queues_fifo_without_content_deduplication(
    fifo_tpl: Json,
) -> None:
    queue, dlq = _queues(fifo_tpl)
    settings = Settings(prefix=FIFO_PREFIX, fifo=True)
    assert (queue["QueueName"], dlq["QueueName"]) == (settings.queue, settings.dlq)
    assert (queue["QueueName"], dlq["QueueName"]) == (
        f"{FIFO_PREFIX}-jobs.fifo",
        f"{FIFO_PREFIX}-jobs-dlq.fifo",
    )
    for props in (queue, dlq):
        assert props["FifoQueue"] is True
        assert props["ContentBasedDeduplication"] is False
    # Both consumers read the same names (and the FIFO flag) from their environment.
    env = _consumer_fn(fifo_tpl)["Properties"]["Environment"]["Variables"]
    read = Settings.from_env(env)
    assert (read.fifo, read.queue, read.dlq) == (True, settings.queue, settings.dlq)
    (task,) = _of_type(fifo_tpl, "AWS::ECS::TaskDefinition").values()
    (container,) = task["Properties"]["ContainerDefinitions"]
    ecs_env = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert ecs_env["SQS_LEASE_FIFO"] == "true" and ecs_env["SQS_LEASE_QUEUE"] == settings.queue


def test_a_kms_key_encrypts_both_queues_and_is_granted_to_consumers_and_producer(
    fifo_tpl: Json,
) -> None:
    key_id = _key_id(fifo_tpl)
    key = fifo_tpl["Resources"][key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    for props in _queues(fifo_tpl):
        assert props["KmsMasterKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
        assert "SqsManagedSseEnabled" not in props
    # The key policy: the account administers it (CDK's default), nobody else is named;
    # every use is granted on the roles, on this key only.
    statements = key["KeyPolicy"]["Statement"]
    assert len(statements) == 1 and statements[0]["Action"] == "kms:*"
    assert "AWS" in statements[0]["Principal"] and "*" not in json.dumps(statements[0]["Principal"])
    for fragment in (
        "LambdaConsumerRole",
        "LambdaConsumerSweepRole",
        "FargateConsumerTaskTaskRole",
        "ProducerRole",
    ):
        kms = [s for s in _role_statements(fifo_tpl, fragment) if "kms:" in json.dumps(s)]
        actions = {a for s in kms for a in _actions(s)}
        assert actions == {"kms:GenerateDataKey", "kms:Decrypt"}, fragment
        assert all(_resources(s) == [{"Fn::GetAtt": [key_id, "Arn"]}] for s in kms), fragment


def test_cdk_nag_finds_nothing_in_the_fifo_kms_stack_and_cfn_lint_no_error(
    fifo_stack: Any, fifo_tpl: Json
) -> None:
    from cdk_nag import AwsSolutionsChecks
    from cfnlint.api import lint_all

    report = AwsSolutionsChecks(fifo_stack.node.root).validate_scope(fifo_stack)
    assert [v.rule_name for v in report.violations] == [] and report.success
    matches = lint_all(json.dumps(fifo_tpl))
    assert [str(m) for m in matches if m.rule.id.startswith("E")] == []
    assert {m.rule.id for m in matches if m.rule.id.startswith("W")} <= {"W3005"}


def _interactive(tpl: Json) -> tuple[str, Json]:
    (found,) = [
        (k, v["Properties"])
        for k, v in _of_type(tpl, "AWS::SQS::Queue").items()
        if "-interactive" in v["Properties"]["QueueName"]
    ]
    return found


def _queue_id(tpl: Json, name: str) -> str:
    (qid,) = [
        k
        for k, v in _of_type(tpl, "AWS::SQS::Queue").items()
        if v["Properties"]["QueueName"] == name
    ]
    return qid


def test_the_interactive_queue_has_the_job_queues_lease_dlq_key_grants_and_alarm(
    fifo_stack: Any, fifo_tpl: Json
) -> None:
    settings = Settings(prefix=FIFO_PREFIX, fifo=True)
    queue, _ = _queues(fifo_tpl)
    fast_id, fast = _interactive(fifo_tpl)
    # The library's own name: the worker and `submit --priority interactive` find it.
    assert fast["QueueName"] == settings.interactive_queue == f"{FIFO_PREFIX}-jobs-interactive.fifo"
    assert fast["FifoQueue"] is True and fast["ContentBasedDeduplication"] is False
    # The same lease, the same redrive to the one DLQ, the same key.
    assert fast["VisibilityTimeout"] == queue["VisibilityTimeout"]
    assert fast["RedrivePolicy"] == queue["RedrivePolicy"]
    assert (
        fast["KmsMasterKeyId"]
        == queue["KmsMasterKeyId"]
        == {"Fn::GetAtt": [_key_id(fifo_tpl), "Arn"]}
    )
    assert stack_queue_count(fifo_tpl) == 3
    assert fifo_stack.queue.interactive_queue is not None
    # Deny without TLS, like the others.
    denied = [
        p["Properties"]["Queues"]
        for p in _of_type(fifo_tpl, "AWS::SQS::QueuePolicy").values()
        if {"Ref": fast_id} in p["Properties"]["Queues"]
    ]
    assert len(denied) == 1
    # Workers receive and delete there; the producer sends there.
    arn = {"Fn::GetAtt": [fast_id, "Arn"]}
    for fragment, action in (
        ("LambdaConsumerRole", "sqs:ReceiveMessage"),
        ("FargateConsumerTaskTaskRole", "sqs:DeleteMessage"),
        ("ProducerRole", "sqs:SendMessage"),
    ):
        on = [
            r
            for st in _role_statements(fifo_tpl, fragment)
            if action in _actions(st)
            for r in _resources(st)
        ]
        assert arn in on, (fragment, action)
    # The Fargate service scales on both queues' backlog.
    expressions = {
        m["Expression"]
        for a in _of_type(fifo_tpl, "AWS::CloudWatch::Alarm").values()
        for m in a["Properties"].get("Metrics", [])
        if "Expression" in m and "tasks" in m["Expression"]
    }
    assert expressions == {"(visible + inflight + ivisible + iinflight) / IF(tasks < 1, 1, tasks)"}
    # Its oldest message alarms as the job queue's does.
    ages: list[tuple[Json, Json]] = []
    for alarm in _of_type(fifo_tpl, "AWS::CloudWatch::Alarm").values():
        props = alarm["Properties"]
        stats = [m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m]
        metric = props if "MetricName" in props else (stats[0] if len(stats) == 1 else {})
        if metric.get("MetricName") == "ApproximateAgeOfOldestMessage":
            ages.append((props, metric))
    assert len(ages) == 2
    (fast_age,) = [
        props
        for props, metric in ages
        if metric["Dimensions"][0]["Value"] == {"Fn::GetAtt": [fast_id, "QueueName"]}
    ]
    assert fast_age["Threshold"] == 2 * queue["VisibilityTimeout"]


def stack_queue_count(tpl: Json) -> int:
    return len(_of_type(tpl, "AWS::SQS::Queue"))


def test_a_standard_interactive_queue_is_named_as_the_library_names_it() -> None:
    scope = _scratch()
    queue = LeasedQueue(scope, "Q", job_classes=[_class()], prefix="shop", interactive=True)
    LeaseMonitoring(scope, "M", queue=queue)
    tpl: Json = Template.from_stack(scope).to_json()
    assert stack_queue_count(tpl) == 3
    _, fast = _interactive(tpl)
    assert fast["QueueName"] == Settings(prefix="shop").interactive_queue == "shop-jobs-interactive"
    dlq_id = _queue_id(tpl, "shop-jobs-dlq")
    assert fast["RedrivePolicy"]["deadLetterTargetArn"] == {"Fn::GetAtt": [dlq_id, "Arn"]}
    assert "FifoQueue" not in fast
    # Without the option: no interactive queue, and no alarm for one.
    plain = _scratch()
    LeaseMonitoring(plain, "M", queue=LeasedQueue(plain, "Q", job_classes=[_class()]))
    plain_tpl: Json = Template.from_stack(plain).to_json()
    assert stack_queue_count(plain_tpl) == 2
    assert (
        len(_of_type(plain_tpl, "AWS::CloudWatch::Alarm"))
        == len(_of_type(tpl, "AWS::CloudWatch::Alarm")) - 1
    )


def test_a_batching_window_on_a_fifo_queue_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_batching_window=5 s: an event source on a FIFO"):
        LeasedQueue(
            _scratch(),
            "Q",
            job_classes=[_class()],
            fifo=True,
            lambda_timeout=cdk.Duration.seconds(60),
            max_batching_window=cdk.Duration.seconds(5),
        )


def test_a_fifo_queues_event_source_takes_one_record_a_batch_and_refuses_more(
    fifo_tpl: Json,
) -> None:
    # Soak seed 1117530: a batch of five from a FIFO queue; the records behind a head
    # that kept failing were received and handed back 20 times, and dead-lettered
    # without ever starting. The construct's default is one record; more is refused.
    (mapping,) = _of_type(fifo_tpl, "AWS::Lambda::EventSourceMapping").values()
    assert mapping["Properties"]["BatchSize"] == 1
    scope = _scratch()
    queue = LeasedQueue(
        scope,
        "Q",
        job_classes=[_class(stage_budget_seconds=50.0, effect_timeout_seconds=30.0)],
        fifo=True,
        lambda_timeout=cdk.Duration.seconds(900),
    )
    tables = LeaseTables(scope, "T")
    code = lambda_.Code.from_asset(str(CDK_DIR / "handlers"))
    with pytest.raises(ConfigError, match="batch_size=2: a FIFO queue's event source"):
        LambdaConsumer(
            scope, "L", queue=queue, tables=tables, code=code, app_ref="m:app", batch_size=2
        )


# ------------------------------------------------------------------ props


def _scratch() -> cdk.Stack:
    return cdk.Stack(cdk.App(), "Scratch")


def _class(**policy: Any) -> JobClass:
    from pydantic import BaseModel

    class P(BaseModel):
        x: int = 0

    return JobClass(name="c", payload_model=P, **policy)


def test_a_queue_without_job_classes_is_refused_before_anything_is_built() -> None:
    scope = _scratch()
    with pytest.raises(ConfigError, match="job_classes: none given"):
        LeasedQueue(scope, "Q", job_classes=[])
    assert scope.node.try_find_child("Q") is None


def test_warm_throughput_reaches_every_table_and_index() -> None:
    """``LeaseTables(warm=...)`` sets what ``tables create --warm-*`` sets (issue 33)."""
    scope = _scratch()
    LeaseTables(scope, "T", warm=WarmThroughput(reads=30_000, writes=9_000))
    tables = Template.from_stack(scope).find_resources("AWS::DynamoDB::Table")
    want = {"ReadUnitsPerSecond": 30_000, "WriteUnitsPerSecond": 9_000}
    assert len(tables) == 5
    indexes = 0
    for table in tables.values():
        props = table["Properties"]
        assert props["WarmThroughput"] == want
        for index in props.get("GlobalSecondaryIndexes", []):
            assert index["WarmThroughput"] == want
            indexes += 1
    assert indexes >= 5  # unsent, group, attention, workers; ambiguous
    plain = _scratch()
    LeaseTables(plain, "T")
    for table in Template.from_stack(plain).find_resources("AWS::DynamoDB::Table").values():
        assert "WarmThroughput" not in table["Properties"]


def test_a_bad_prefix_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="'prefix'"):
        LeaseTables(_scratch(), "T", prefix="no spaces allowed")


def test_a_fifo_flag_and_a_queue_name_that_disagree_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"ends in '\.fifo'"):
        LeasedQueue(_scratch(), "Q", job_classes=[_class()], queue_name="jobs", fifo=True)


def test_max_attempts_beyond_any_redrive_is_refused_as_a_job_class_error() -> None:
    with pytest.raises(JobClassError, match="maxReceiveCount"):
        LeasedQueue(_scratch(), "Q", job_classes=[_class(max_attempts=600)])


def test_a_lambda_consumer_on_a_queue_not_sized_for_it_is_refused(stack: Any) -> None:
    scope = _scratch()
    queue = LeasedQueue(scope, "Q", job_classes=[_class(lease_seconds=60)])
    tables = LeaseTables(scope, "T")
    code = lambda_.Code.from_asset(str(CDK_DIR / "handlers"))
    with pytest.raises(ConfigError, match="not sized for Lambda"):
        LambdaConsumer(scope, "L", queue=queue, tables=tables, code=code, app_ref="m:app")
    with pytest.raises(ConfigError, match=r"queue visibility 60 s is below 6 x"):
        LambdaConsumer(
            scope,
            "L",
            queue=queue,
            tables=tables,
            code=code,
            app_ref="m:app",
            function_timeout=cdk.Duration.seconds(11),
        )
    with pytest.raises(ConfigError, match="MODULE:OBJECT"):
        LambdaConsumer(
            scope, "L", queue=stack.queue, tables=stack.tables, code=code, app_ref="m.app"
        )
    with pytest.raises(ConfigError, match="batching window"):
        LambdaConsumer(
            scope,
            "L",
            queue=stack.queue,
            tables=stack.tables,
            code=code,
            app_ref="m:app",
            batch_size=100,
        )
    assert scope.node.try_find_child("L") is None


def test_consumers_refuse_a_queue_and_tables_of_different_prefixes(stack: Any) -> None:
    scope = _scratch()
    other = LeaseTables(scope, "T", prefix="other")
    with pytest.raises(ConfigError, match="same prefix"):
        LambdaConsumer(
            scope,
            "L",
            queue=stack.queue,
            tables=other,
            code=lambda_.Code.from_asset(str(CDK_DIR / "handlers")),
            app_ref="m:app",
        )


def test_a_fargate_shutdown_grace_past_the_stop_timeout_cap_is_refused(stack: Any) -> None:
    scope = _scratch()
    with pytest.raises(ConfigError, match="stopTimeout cap of 120"):
        FargateConsumer(
            scope,
            "F",
            queue=stack.queue,
            tables=stack.tables,
            cluster=ecs.Cluster.from_cluster_attributes(
                scope, "C", cluster_name="c", vpc=stack.fargate_consumer.service.cluster.vpc
            ),
            image=ecs.ContainerImage.from_registry("w"),
            app_ref="m:app",
            shutdown_grace=115,
        )
    assert scope.node.try_find_child("F") is None


def test_monitoring_refuses_an_oldest_message_age_under_a_minute(stack: Any) -> None:
    with pytest.raises(ConfigError, match="oldest_message_age=30 s"):
        LeaseMonitoring(
            _scratch(), "M", queue=stack.queue, oldest_message_age=cdk.Duration.seconds(30)
        )


def test_ttl_on_an_attribute_a_model_has_is_refused() -> None:
    with pytest.raises(ConfigError, match="would delete live records"):
        LeaseTables(_scratch(), "T", ttl_attribute="finished_at")


def test_construct_properties_are_read_only(stack: Any) -> None:
    with pytest.raises(AttributeError):
        stack.queue.max_receive_count = 1
    with pytest.raises(AttributeError):
        stack.tables.jobs = None
    assert stack.fargate_consumer.stop_timeout_seconds == 30
    assert stack.lambda_consumer.function_timeout_seconds == 300


# ------------------------------------------------------------------ deploy-shaped


@pytest.fixture(scope="module")
def deployed(tpl: Json, moto_endpoint: str) -> Iterator[Settings]:
    """The template's names, keys and queue attributes created on the emulator, and
    the library's Settings read from the consumer's own environment variables (once
    for the module: the names are the template's)."""
    import boto3

    env = _consumer_fn(tpl)["Properties"]["Environment"]["Variables"]
    settings = Settings.from_env(
        {"SQS_LEASE_PREFIX": env["SQS_LEASE_PREFIX"], "SQS_LEASE_QUEUE": env["SQS_LEASE_QUEUE"]},
        endpoint_url=moto_endpoint,
    )
    ddb = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    tables = _tables(tpl)
    assert set(tables) == {
        settings.jobs_table,
        settings.intents_table,
        settings.attempts_table,
        settings.groups_table,
        settings.slots_table,
    }
    for name, props in tables.items():
        params: Json = {
            "TableName": name,
            "KeySchema": props["KeySchema"],
            "AttributeDefinitions": props["AttributeDefinitions"],
            "BillingMode": props["BillingMode"],
        }
        if "GlobalSecondaryIndexes" in props:
            params["GlobalSecondaryIndexes"] = props["GlobalSecondaryIndexes"]
        ddb.create_table(**params)
    queue, dlq = _queues(tpl)
    assert (queue["QueueName"], dlq["QueueName"]) == (settings.queue, settings.dlq)
    dlq_url = sqs.create_queue(
        QueueName=dlq["QueueName"],
        Attributes={"MessageRetentionPeriod": str(dlq["MessageRetentionPeriod"])},
    )["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    redrive = {
        "deadLetterTargetArn": dlq_arn,
        "maxReceiveCount": str(queue["RedrivePolicy"]["maxReceiveCount"]),
    }
    sqs.create_queue(
        QueueName=queue["QueueName"],
        Attributes={
            "VisibilityTimeout": str(queue["VisibilityTimeout"]),
            "RedrivePolicy": json.dumps(redrive),
        },
    )
    yield settings


def test_a_worker_runs_a_job_on_resources_made_from_the_template(
    deployed: Settings, jobs: App, tpl: Json, monkeypatch: pytest.MonkeyPatch
) -> None:
    from botocore.client import BaseClient
    from worker_helpers import collect_journal

    from sqs_lease import Producer, Worker

    calls: set[tuple[str, str]] = set()
    real = BaseClient._make_api_call  # type: ignore[attr-defined]  # botocore-stubs omit it

    def spy(self: BaseClient, operation: str, params: Any) -> Any:
        calls.add((self.meta.service_model.service_name, operation))
        return real(self, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", spy)
    with collect_journal() as journal:
        Producer(deployed, jobs).submit("ocr", {"document": "d-1", "pages": 2}, job_id="job-1")
        producer_calls = set(calls)
        calls.clear()
        worker = Worker(jobs, deployed, concurrency=1, receive_wait=1, sweep_interval=None)
        stats = worker.run(max_messages=1, idle_exit=5.0)
    assert stats.committed == 1
    assert journal.events("result_committed", job_id="job-1")
    # The stack's redrive is not the kind the worker warns about.
    assert journal.events("redrive_too_tight") == []
    # Every call the worker made is one its consumer role is granted.
    granted = {a for s in _role_statements(tpl, "LambdaConsumerRole") for a in _actions(s)}
    for service, operation in calls:
        action = operation.removesuffix("Batch")
        if operation == "TransactWriteItems":
            continue  # authorised per item action (UpdateItem, ConditionCheckItem, PutItem)
        prefix = "sqs" if service == "sqs" else "dynamodb"
        assert f"{prefix}:{action}" in granted, (service, operation)
    assert ("sqs", "ReceiveMessage") in calls and ("dynamodb", "UpdateItem") in calls
    # So is every call the producer made, by the producer role.
    submit = {a for s in _role_statements(tpl, "ProducerRole") for a in _actions(s)}
    for service, operation in producer_calls:
        assert f"{'sqs' if service == 'sqs' else 'dynamodb'}:{operation}" in submit, operation
    assert ("dynamodb", "PutItem") in producer_calls


class _Minutes:
    """A Lambda context with a minute left."""

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def test_the_sweep_runs_on_resources_made_from_the_template_within_its_roles_grants(
    deployed: Settings, jobs: App, tpl: Json, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    import boto3
    from botocore.client import BaseClient

    from sqs_lease import Producer
    from sqs_lease._schema.job_requests import JobTable
    from sqs_lease.aws_lambda import sweeper

    ddb = boto3.client("dynamodb", endpoint_url=deployed.endpoint_url, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=deployed.endpoint_url, region_name="us-east-1")
    # A job whose producer died after its write, and one whose message is in the DLQ.
    put = JobTable(deployed.jobs_table).put_new(
        job_id="stranded",
        job_class="ocr",
        payload_json='{"document":"d-2","pages":1}',
        payload_hash="h" * 64,
        wall_now=time.time() - 300,
        send_id="died-before-sending",
    )
    ddb.put_item(**put.params)
    Producer(deployed, jobs).submit("ocr", {"document": "d-3", "pages": 1}, job_id="dead")
    url = sqs.get_queue_url(QueueName=deployed.queue)["QueueUrl"]
    dlq = sqs.get_queue_url(QueueName=deployed.dlq)["QueueUrl"]
    (moved,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    sqs.send_message(QueueUrl=dlq, MessageBody=moved["Body"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=moved["ReceiptHandle"])

    calls: set[tuple[str, str]] = set()
    real = BaseClient._make_api_call  # type: ignore[attr-defined]  # botocore-stubs omit it

    def spy(self: BaseClient, operation: str, params: Any) -> Any:
        calls.add((self.meta.service_model.service_name, operation))
        return real(self, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", spy)
    done = sweeper(jobs, deployed)({"source": "aws.events"}, _Minutes())
    assert (done["resent"], done["dlq_parked"], done["failed"]) == (1, 1, [])
    granted = {a for s in _role_statements(tpl, "LambdaConsumerSweepRole") for a in _actions(s)}
    for service, operation in calls:
        action = operation.removesuffix("Batch")
        assert f"{service}:{action}" in granted, (service, operation)
    assert {("dynamodb", "Query"), ("sqs", "SendMessage"), ("sqs", "ReceiveMessage")} <= calls
