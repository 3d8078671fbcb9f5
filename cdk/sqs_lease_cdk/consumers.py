"""The two consumers: a Lambda function behind an SQS event source, an ECS Fargate service."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from constructs import Construct

from sqs_lease import ConfigError
from sqs_lease._core.eventsource import batch_size_for, fifo_batch_problem
from sqs_lease._core.sweeps import SWEEP_PAGE_SECONDS
from sqs_lease.deploy import (
    LAMBDA_MAX_CONCURRENCY,
    SHUTDOWN_GRACE_SECONDS,
    check_lambda_concurrency,
    check_lambda_fit,
    check_lambda_timing,
    ecs_stop_timeout,
)

from .bundling import DEFAULT_EXTRAS, lambda_code
from .monitoring import metrics_namespace
from .queue import LeasedQueue
from .tables import LeaseTables

LAMBDA_HANDLER = "sqs_lease.aws_lambda.entry"
"""The Lambda adapter's entry point (issue 10); it loads the app named by ``SQS_LEASE_APP``."""

SWEEP_HANDLER = "sqs_lease.aws_lambda.sweep_entry"
"""The scheduled sweep's entry point (issue 33): stranded records sent again, jobs whose
message SQS moved to the DLQ parked; it loads the app as ``LAMBDA_HANDLER`` does."""

SWEEP_EVERY = Duration.minutes(5)
"""How often the Lambda consumer's scheduled sweep runs by default: a stranded job
waits at most this (plus the grace of a minute) for its message."""

SWEEP_TIMEOUT = Duration.minutes(2)
"""The sweep function's default timeout: its time budget for paging to the end."""

SWEEP_MIN_TIMEOUT_SECONDS = 3 * int(SWEEP_PAGE_SECONDS)
"""A sweep's first page, its first DLQ receive, and one page more."""

DEFAULT_RUNTIME = lambda_.Runtime.PYTHON_3_14
"""The newest Python runtime (cdk-nag's AwsSolutions-L1 asks for the latest); pip
fetches manylinux wheels of every pinned dependency for it (``constraints.txt``), so
``handlers=`` bundles it (``sqs_lease_cdk.bundling``)."""

_APP_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
LOG_RETENTION = logs.RetentionDays.THREE_MONTHS


def _check_app_ref(app_ref: str) -> None:
    if not _APP_REF.match(app_ref):
        raise ConfigError(
            f"app_ref={app_ref!r}: name the App as MODULE:OBJECT (as `sqs-lease worker` "
            "takes it), e.g. 'myjobs:app'"
        )


def _environment(queue: LeasedQueue, tables: LeaseTables, app_ref: str) -> dict[str, str]:
    if queue.settings.prefix != tables.settings.prefix:
        raise ConfigError(
            f"queue prefix {queue.settings.prefix!r} and tables prefix "
            f"{tables.settings.prefix!r} differ: the worker finds both by one prefix "
            "(SQS_LEASE_PREFIX); give both constructs the same prefix"
        )
    # The names the library's Settings.from_env reads; the region is the runtime's own.
    env = {
        "SQS_LEASE_PREFIX": tables.settings.prefix,
        "SQS_LEASE_QUEUE": queue.settings.queue,
        "SQS_LEASE_APP": app_ref,
    }
    if queue.fifo:
        env["SQS_LEASE_FIFO"] = "true"
    # EMF metrics to stdout (CloudWatch Logs extracts them): LeaseMonitoring's alarms
    # read this namespace. The image / asset needs `sqs-lease[metrics]`.
    env["SQS_LEASE_METRICS"] = "true"
    env["SQS_LEASE_METRICS_NAMESPACE"] = metrics_namespace(queue.settings.prefix)
    return env


class LambdaConsumer(Construct):
    """A Lambda function that runs the jobs of a ``LeasedQueue``.

    The SQS event source reports partial batch failures (``ReportBatchItemFailures``):
    the adapter returns the records that did not finish. The function timeout
    (default: the queue's ``lambda_timeout``) and batching window are checked
    against the queue's visibility (>= 6 x timeout + window, AWS's guidance)
    before anything is built. The handler is ``sqs_lease.aws_lambda.entry``
    (the adapter of issue 10), which loads the app named by ``app_ref``.

    Scaling: the event source hands at most ``max_concurrency`` invocations at once
    (default ``sqs_lease.deploy.LAMBDA_MAX_CONCURRENCY``; ``reserved_concurrency``,
    optional, must not be below it); ``batch_size`` defaults to the records that can
    start one after another at their whole stage budgets within the timeout
    (``batch_size_for``), and is 1 on a FIFO queue, where a larger one is refused
    (``fifo_batch_problem``: records behind a failed one of their group would be
    received until the DLQ). ``tracing=True``: X-Ray active tracing on both functions.

    The code: ``handlers=`` (a directory holding the job module) builds the asset at
    synth, no Docker: sqs-lease and its dependencies for the function's ``runtime``
    and ``architecture`` (manylinux wheels, ``--only-binary``, pinned by
    ``constraints``), the job module beside them (``sqs_lease_cdk.bundling``). Or
    ``code=``: an asset built otherwise, which must hold all of that itself.

    Every lease rule of the queue's jobs (each class, each stage) must be able to start
    in an invocation: its ``stage_budget_seconds`` plus the end margin within the
    function timeout (``sqs_lease.deploy.check_lambda_fit``, the rule the Lambda shell
    also refuses by). A class that cannot is refused at synth, by name and numbers:
    its records would be released unstarted until SQS dead-lettered them. Run such a
    class on a ``FargateConsumer`` reading a queue of its own, or split it into stages.

    It reads the job queue only: the Lambda adapter serves one queue, so a queue made
    with ``interactive=True`` needs a ``FargateConsumer`` (whose workers serve the
    interactive queue first) for its interactive jobs.

    The sweep: a consumer runs only when a message arrives, so a job left without
    one (its producer died after writing it, its send failed) or whose message SQS
    moved to the DLQ would wait forever. A second function, ``SWEEP_HANDLER`` on
    the same code and environment, runs every ``sweep_every`` (an EventBridge rule)
    for up to ``sweep_timeout``: it sends stranded jobs' messages again, to the end
    of the ``unsent`` index, and parks jobs whose message is in the DLQ. Its role may
    only do that (``grant_sweeper``). ``sweep_every=None`` leaves it out, for a
    deployment that sweeps otherwise (a ``FargateConsumer`` on the same queue).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        queue: LeasedQueue,
        tables: LeaseTables,
        app_ref: str,
        code: lambda_.Code | None = None,
        handlers: Path | None = None,
        constraints: Path | None = None,
        library: str | Path | None = None,
        extras: Sequence[str] = DEFAULT_EXTRAS,
        architecture: lambda_.Architecture | None = None,
        handler: str = LAMBDA_HANDLER,
        function_timeout: Duration | None = None,
        batch_size: int | None = None,
        max_batching_window: Duration | None = None,
        memory_size: int = 512,
        reserved_concurrency: int | None = None,
        runtime: lambda_.Runtime | None = None,
        environment: Mapping[str, str] | None = None,
        sweep_every: Duration | None = SWEEP_EVERY,
        sweep_timeout: Duration = SWEEP_TIMEOUT,
        max_concurrency: int | None = LAMBDA_MAX_CONCURRENCY,
        tracing: bool = False,
    ) -> None:
        _check_app_ref(app_ref)
        env = _environment(queue, tables, app_ref)
        sweep_seconds = int(sweep_timeout.to_seconds())
        if sweep_every is not None:
            every = sweep_every.to_seconds()
            if every < 60 or every % 60:
                raise ConfigError(
                    f"sweep_every={every:g} s: an EventBridge schedule takes whole minutes "
                    "(Duration.minutes(N), N >= 1)"
                )
            if not SWEEP_MIN_TIMEOUT_SECONDS <= sweep_seconds < min(every, 901):
                raise ConfigError(
                    f"sweep_timeout={sweep_seconds} s: give {SWEEP_MIN_TIMEOUT_SECONDS} s or "
                    f"more, below sweep_every ({every:g} s: one sweep at a time) and at most "
                    "900 s (Lambda's limit)"
                )
        if function_timeout is None:
            if queue.lambda_timeout_seconds is None:
                raise ConfigError(
                    "function_timeout: none given and the queue was not sized for Lambda; "
                    "create the LeasedQueue with lambda_timeout=Duration.seconds(N) (its "
                    "visibility then follows AWS's 6 x timeout rule)"
                )
            timeout = queue.lambda_timeout_seconds
        else:
            timeout = int(function_timeout.to_seconds())
        window = (
            queue.max_batching_window_seconds
            if max_batching_window is None
            else int(max_batching_window.to_seconds())
        )
        check_lambda_timing(queue.visibility_timeout_seconds, timeout, window)
        # A class (or stage) that can never start here is refused (issue 27 item 2).
        check_lambda_fit(queue.lease_budgets, timeout)
        runtime = runtime or DEFAULT_RUNTIME
        architecture = architecture or lambda_.Architecture.X86_64
        if (code is None) == (handlers is None):
            raise ConfigError(
                "code / handlers: give exactly one: handlers=Path(DIR) (the job module's "
                "directory; the asset is built with sqs-lease for the runtime) or code= "
                "(an asset that already holds sqs-lease and the job module)"
            )
        if code is None:
            assert handlers is not None
            code = lambda_code(
                handlers,
                runtime=runtime,
                architecture=architecture,
                library=library,
                extras=extras,
                constraints=constraints,
            )
        if queue.fifo and window:
            raise ConfigError(
                f"max_batching_window={window} s: an event source on a FIFO queue takes no "
                "batching window; leave it unset"
            )
        if batch_size is None:
            # As many records as start one after another at their whole budgets: a
            # larger batch's tail is received and released, each receive counted.
            batch_size = batch_size_for(
                timeout, (budget for budget, _ in queue.lease_budgets.values()), fifo=queue.fifo
            )
        problem = fifo_batch_problem(batch_size) if queue.fifo else None
        if problem is not None:
            raise ConfigError(f"batch_size={batch_size}: {problem}")
        limit = 10 if queue.fifo else 10_000
        if not 1 <= batch_size <= limit:
            raise ConfigError(
                f"batch_size={batch_size}: this queue's event source takes 1..{limit}"
            )
        if batch_size > 10 and window < 1:
            raise ConfigError(
                f"batch_size={batch_size}: above 10 the event source needs a batching window "
                "of at least 1 s (max_batching_window)"
            )
        if not 128 <= memory_size <= 10_240:
            raise ConfigError(f"memory_size={memory_size}: Lambda takes 128..10240 MB")
        check_lambda_concurrency(max_concurrency, reserved_concurrency)
        for key in env:
            if environment and key in environment:
                raise ConfigError(f"environment[{key!r}] is set by the construct; remove it")
        super().__init__(scope, construct_id)

        self._timeout = timeout
        self._log_group = logs.LogGroup(
            self, "Logs", retention=LOG_RETENTION, removal_policy=RemovalPolicy.RETAIN
        )
        # An own role: the default one carries a managed policy whose log grant is
        # account-wide; this one may write to its own log group only.
        self._role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="sqs-lease Lambda consumer: its queue, tables and log group only",
        )
        self._log_group.grant_write(self._role)
        self._function = lambda_.Function(
            self,
            "Function",
            runtime=runtime,
            architecture=architecture,
            handler=handler,
            code=code,
            timeout=Duration.seconds(timeout),
            memory_size=memory_size,
            role=self._role,
            log_group=self._log_group,
            reserved_concurrent_executions=reserved_concurrency,
            environment={**(environment or {}), **env},
            tracing=lambda_.Tracing.ACTIVE if tracing else None,
        )
        self._max_concurrency = max_concurrency
        self._tracing = tracing
        queue.grant_worker(self._role)
        tables.grant_worker(self._role)
        self._source = sources.SqsEventSource(
            queue.queue,
            batch_size=batch_size,
            max_batching_window=Duration.seconds(window) if window else None,
            report_batch_item_failures=True,
            max_concurrency=max_concurrency,
        )
        self._function.add_event_source(self._source)
        self._sweep: lambda_.Function | None = None
        self._sweep_rule: events.Rule | None = None
        self._sweep_role: iam.Role | None = None
        if sweep_every is not None:
            self._add_sweep(
                code=code,
                runtime=runtime,
                architecture=architecture,
                memory_size=memory_size,
                environment={**(environment or {}), **env},
                every=sweep_every,
                timeout=sweep_seconds,
                queue=queue,
                tables=tables,
            )
        if tracing:
            _acknowledge_xray(self._role)
            if self._sweep_role is not None:
                _acknowledge_xray(self._sweep_role)

    def _add_sweep(
        self,
        *,
        code: lambda_.Code,
        runtime: lambda_.Runtime,
        architecture: lambda_.Architecture,
        memory_size: int,
        environment: dict[str, str],
        every: Duration,
        timeout: int,
        queue: LeasedQueue,
        tables: LeaseTables,
    ) -> None:
        logs_ = logs.LogGroup(
            self, "SweepLogs", retention=LOG_RETENTION, removal_policy=RemovalPolicy.RETAIN
        )
        self._sweep_role = iam.Role(
            self,
            "SweepRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="sqs-lease scheduled sweep: re-send stranded jobs, park dead-lettered ones",
        )
        logs_.grant_write(self._sweep_role)
        self._sweep = lambda_.Function(
            self,
            "SweepFunction",
            runtime=runtime,
            architecture=architecture,
            handler=SWEEP_HANDLER,
            code=code,
            timeout=Duration.seconds(timeout),
            memory_size=memory_size,
            role=self._sweep_role,
            log_group=logs_,
            environment=environment,
            # A failed sweep is not retried: the next scheduled one starts over.
            retry_attempts=0,
            tracing=lambda_.Tracing.ACTIVE if self._tracing else None,
        )
        queue.grant_sweeper(self._sweep_role)
        tables.grant_sweeper(self._sweep_role)
        self._sweep_rule = events.Rule(
            self,
            "SweepSchedule",
            schedule=events.Schedule.rate(every),
            description="sqs-lease: the Lambda consumer's stranded-job and DLQ sweep",
            targets=[targets.LambdaFunction(self._sweep, retry_attempts=0)],
        )

    @property
    def function(self) -> lambda_.IFunction:
        """The consumer function."""
        return self._function

    @property
    def sweep_function(self) -> lambda_.IFunction | None:
        """The scheduled sweep (None when built with ``sweep_every=None``)."""
        return self._sweep

    @property
    def sweep_rule(self) -> events.IRule | None:
        """The EventBridge rule that runs the sweep."""
        return self._sweep_rule

    @property
    def sweep_role(self) -> iam.IRole | None:
        """The sweep's execution role (``grant_sweeper`` on the queue and tables only)."""
        return self._sweep_role

    @property
    def role(self) -> iam.IRole:
        """The function's execution role (worker grants on its own resources only)."""
        return self._role

    @property
    def log_group(self) -> logs.ILogGroup:
        """Where the function's journal goes (its EMF metrics too)."""
        return self._log_group

    @property
    def function_timeout_seconds(self) -> int:
        """The function timeout, checked against the queue's visibility."""
        return self._timeout

    @property
    def max_concurrency(self) -> int | None:
        """The event source's maximum concurrency (None: the account's limit only)."""
        return self._max_concurrency


def _acknowledge_xray(role: iam.Role) -> None:
    """X-Ray's write actions take no resource ARN: CDK grants them on ``*``."""
    policy = role.node.try_find_child("DefaultPolicy")
    assert policy is not None  # the grants above made it
    Validations.of(policy).acknowledge(
        Acknowledgment(
            id="AwsSolutions-IAM5[Resource::*]",
            reason="X-Ray tracing (tracing=True): xray:PutTraceSegments and "
            "xray:PutTelemetryRecords support no resource-level permission",
        )
    )


class FargateConsumer(Construct):
    """An ECS Fargate service of long-running workers (``sqs-lease worker APP``).

    The container's ``stopTimeout`` is the worker's shutdown grace plus the time
    it needs to hand back what it still holds (``sqs_lease.deploy.ecs_stop_timeout``),
    so SIGKILL never lands inside a shutdown. The service scales on backlog per
    task: (visible + in-flight messages) / running tasks, against ``concurrency``
    (what one task runs at once); the interactive queue's messages count too where
    the queue has one (the workers find it by name and serve it first).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        queue: LeasedQueue,
        tables: LeaseTables,
        cluster: ecs.ICluster,
        image: ecs.ContainerImage,
        app_ref: str,
        concurrency: int = 4,
        shutdown_grace: float = SHUTDOWN_GRACE_SECONDS,
        cpu: int = 512,
        memory_limit_mib: int = 1024,
        min_tasks: int = 1,
        max_tasks: int = 4,
        vpc_subnets: ec2.SubnetSelection | None = None,
    ) -> None:
        _check_app_ref(app_ref)
        env = _environment(queue, tables, app_ref)
        if not 1 <= concurrency <= 1000:
            raise ConfigError(f"concurrency={concurrency}: choose 1..1000 jobs per task")
        stop_timeout = ecs_stop_timeout(shutdown_grace)
        if not 1 <= min_tasks <= max_tasks:
            raise ConfigError(
                f"min_tasks={min_tasks}, max_tasks={max_tasks}: need 1 <= min_tasks <= max_tasks "
                "(backlog per task divides by the running tasks)"
            )
        super().__init__(scope, construct_id)

        self._stop_timeout = stop_timeout
        self._log_group = logs.LogGroup(
            self, "Logs", retention=LOG_RETENTION, removal_policy=RemovalPolicy.RETAIN
        )
        self._task_definition = ecs.FargateTaskDefinition(
            self, "Task", cpu=cpu, memory_limit_mib=memory_limit_mib
        )
        command = [
            "sqs-lease",
            "worker",
            app_ref,
            "--concurrency",
            str(concurrency),
            "--shutdown-grace",
            f"{shutdown_grace:g}",
        ]
        self._container = self._task_definition.add_container(
            "Worker",
            image=image,
            command=command,
            environment=env,
            stop_timeout=Duration.seconds(stop_timeout),
            logging=ecs.LogDriver.aws_logs(stream_prefix="worker", log_group=self._log_group),
        )
        # cdk-nag's rule is about secrets in plain environment variables; these are
        # resource names, the same as the stack's outputs would show.
        Validations.of(self._task_definition).acknowledge(
            Acknowledgment(
                id="AwsSolutions-ECS2",
                reason="The environment holds only resource names (prefix, queue, app "
                "module), no secret; secrets belong in ecs.Secret",
            )
        )
        queue.grant_worker(self._task_definition.task_role)
        tables.grant_worker(self._task_definition.task_role)
        self._service = ecs.FargateService(
            self,
            "Service",
            cluster=cluster,
            task_definition=self._task_definition,
            desired_count=min_tasks,
            vpc_subnets=vpc_subnets,
            min_healthy_percent=100,
        )
        scaling = self._service.auto_scale_task_count(
            min_capacity=min_tasks, max_capacity=max_tasks
        )
        self._backlog = backlog_per_task(queue, cluster.cluster_name, self._service.service_name)
        scaling.scale_on_metric(
            "BacklogPerTask",
            metric=self._backlog,
            adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            scaling_steps=[
                appscaling.ScalingInterval(upper=concurrency / 2, change=-1),
                appscaling.ScalingInterval(lower=concurrency, change=+1),
                appscaling.ScalingInterval(lower=3 * concurrency, change=+3),
            ],
            cooldown=Duration.seconds(120),
        )

    @property
    def service(self) -> ecs.FargateService:
        """The Fargate service."""
        return self._service

    @property
    def task_definition(self) -> ecs.FargateTaskDefinition:
        """The task definition (its task role holds the worker grants)."""
        return self._task_definition

    @property
    def log_group(self) -> logs.ILogGroup:
        """Where the workers' journal goes (its EMF metrics too)."""
        return self._log_group

    @property
    def stop_timeout_seconds(self) -> int:
        """The container's stopTimeout: shutdown grace + release margin."""
        return self._stop_timeout

    @property
    def backlog_per_task(self) -> cloudwatch.IMetric:
        """The scaling metric: (visible + in-flight) / running tasks."""
        return self._backlog


def backlog_per_task(
    queue: LeasedQueue, cluster_name: str, service_name: str
) -> cloudwatch.MathExpression:
    """(visible + in-flight messages) / running tasks, one-minute points."""
    period = Duration.minutes(1)
    tasks = cloudwatch.Metric(
        namespace="ECS/ContainerInsights",
        metric_name="RunningTaskCount",
        dimensions_map={"ClusterName": cluster_name, "ServiceName": service_name},
        statistic="Average",
        period=period,
    )
    using: dict[str, cloudwatch.IMetric] = {
        "visible": queue.queue.metric_approximate_number_of_messages_visible(
            period=period, statistic="Maximum"
        ),
        "inflight": queue.queue.metric_approximate_number_of_messages_not_visible(
            period=period, statistic="Maximum"
        ),
        "tasks": tasks,
    }
    backlog = "visible + inflight"
    fast = queue.interactive_queue
    if fast is not None:
        using["ivisible"] = fast.metric_approximate_number_of_messages_visible(
            period=period, statistic="Maximum"
        )
        using["iinflight"] = fast.metric_approximate_number_of_messages_not_visible(
            period=period, statistic="Maximum"
        )
        backlog += " + ivisible + iinflight"
    return cloudwatch.MathExpression(
        expression=f"({backlog}) / IF(tasks < 1, 1, tasks)",
        using_metrics=using,
        label="backlog per task",
        period=period,
    )
