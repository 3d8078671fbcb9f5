"""Example CDK app: one leased queue, the tables, both consumers, monitoring.

Synthesise with ``python app.py`` (no CDK CLI needed) or deploy with ``cdk deploy``
(see README.md). Context values: ``prefix`` (resource names, as the library's
``--prefix``), ``lambda_asset`` (a directory that already holds sqs-lease and the
job module; by default the asset is built at synth, with pip and no Docker:
sqs-lease and its dependencies for the function's runtime, pinned by
``../constraints.txt``, and ``handlers/`` beside them), ``lambda_runtime``
(``python3.X``: the function's runtime, default the construct's), ``worker_image``
(the ECS worker image), ``fifo`` (``true``: FIFO queues), ``encrypted`` (``true``:
a KMS key of the stack's own for the queues), ``interactive`` (``true``: the
interactive jobs' queue too, for priorities), ``alarm_topic_arn`` (an SNS topic
every alarm publishes to).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from constructs import Construct

from sqs_lease import App

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from sqs_lease_cdk import (  # noqa: E402
    FargateConsumer,
    LambdaConsumer,
    LeasedQueue,
    LeaseMonitoring,
    LeaseTables,
)

HANDLERS = HERE / "handlers"
# The project's pins: the asset gets the versions the tests ran with.
CONSTRAINTS = HERE.parent / "constraints.txt"
APP_REF = "example_jobs:app"
LAMBDA_TIMEOUT = cdk.Duration.minutes(5)


def load_jobs() -> App:
    """The example's ``App`` (from ``handlers/example_jobs.py``, the Lambda asset)."""
    spec = importlib.util.spec_from_file_location("example_jobs", HANDLERS / "example_jobs.py")
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app: App = module.app
    return app


class ExampleStack(cdk.Stack):
    """Everything a deployment of the example needs, in one stack."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        prefix: str = "sqs-lease",
        lambda_asset: Path | None = None,
        lambda_runtime: str | None = None,
        worker_image: str = "sqs-lease-worker:latest",
        fifo: bool = False,
        encrypted: bool = False,
        interactive: bool = False,
        alarm_topic_arn: str | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        jobs = load_jobs()
        # A customer-managed key for both queues (else SQS-managed encryption); the
        # constructs grant it to the consumers and the producer with their queue grants.
        self.queue_key = (
            kms.Key(
                self,
                "QueueKey",
                enable_key_rotation=True,
                description="sqs-lease example: the job queue and its DLQ",
            )
            if encrypted
            else None
        )
        self.queue = LeasedQueue(
            self,
            "Queue",
            job_classes=jobs,
            prefix=prefix,
            lambda_timeout=LAMBDA_TIMEOUT,
            fifo=fifo,
            interactive=interactive,
            encryption_key=self.queue_key,
        )
        self.tables = LeaseTables(self, "Tables", prefix=prefix)
        # Whoever submits jobs (an API, another service) assumes a role like this one.
        self.producer_role = iam.Role(
            self,
            "ProducerRole",
            assumed_by=iam.AccountRootPrincipal(),
            description="sqs-lease producer: submit jobs to this stack's queue",
        )
        self.queue.grant_producer(self.producer_role)
        self.tables.grant_producer(self.producer_role)
        self.lambda_consumer = LambdaConsumer(
            self,
            "LambdaConsumer",
            queue=self.queue,
            tables=self.tables,
            app_ref=APP_REF,
            runtime=lambda_.Runtime(lambda_runtime, lambda_.RuntimeFamily.PYTHON)
            if lambda_runtime
            else None,
            **(
                {
                    "handlers": HANDLERS,
                    "constraints": CONSTRAINTS if CONSTRAINTS.is_file() else None,
                }
                if lambda_asset is None
                else {"code": lambda_.Code.from_asset(str(lambda_asset))}
            ),
        )
        flow_logs = logs.LogGroup(
            self,
            "VpcFlowLogs",
            retention=logs.RetentionDays.THREE_MONTHS,
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
        vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=1,
            flow_logs={
                "all": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs)
                )
            },
        )
        cluster = ecs.Cluster(
            self,
            "Cluster",
            vpc=vpc,
            container_insights_v2=ecs.ContainerInsights.ENABLED,
        )
        self.fargate_consumer = FargateConsumer(
            self,
            "FargateConsumer",
            queue=self.queue,
            tables=self.tables,
            cluster=cluster,
            image=ecs.ContainerImage.from_registry(worker_image),
            app_ref=APP_REF,
        )
        # Every alarm, the function's too, publishes to the operator's topic when the
        # context names one (`-c alarm_topic_arn=arn:aws:sns:...`).
        self.monitoring = LeaseMonitoring(
            self,
            "Monitoring",
            queue=self.queue,
            lambda_consumer=self.lambda_consumer,
            alarm_topic=(
                sns.Topic.from_topic_arn(self, "AlarmTopic", alarm_topic_arn)
                if alarm_topic_arn
                else None
            ),
        )


def build(app: cdk.App) -> ExampleStack:
    """The example stack, its settings read from the app's context."""
    prefix = app.node.try_get_context("prefix") or "sqs-lease"
    asset = app.node.try_get_context("lambda_asset")
    image = app.node.try_get_context("worker_image") or "sqs-lease-worker:latest"
    return ExampleStack(
        app,
        "SqsLeaseExample",
        prefix=prefix,
        lambda_asset=Path(asset) if asset else None,
        lambda_runtime=app.node.try_get_context("lambda_runtime") or None,
        worker_image=image,
        fifo=_flag(app.node.try_get_context("fifo")),
        encrypted=_flag(app.node.try_get_context("encrypted")),
        interactive=_flag(app.node.try_get_context("interactive")),
        alarm_topic_arn=app.node.try_get_context("alarm_topic_arn"),
    )


def _flag(value: object) -> bool:
    # `cdk -c fifo=true` gives a string; cdk.json may give a boolean.
    return value is True or str(value).lower() == "true"


def main() -> None:
    """Synthesise the example (with cdk-nag's AwsSolutions checks when installed)."""
    # The CDK CLI names the output directory in CDK_OUTDIR; run alone, cdk.out/ here.
    app = cdk.App(outdir=os.environ.get("CDK_OUTDIR") or str(HERE / "cdk.out"))
    build(app)
    try:
        from cdk_nag import AwsSolutionsChecks
    except ImportError:
        pass
    else:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    app.synth()


if __name__ == "__main__":
    main()
