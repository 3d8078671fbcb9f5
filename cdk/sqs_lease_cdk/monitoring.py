"""Alarms and a dashboard on the toolkit's signals: its EMF metrics and queue figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from constructs import Construct

from sqs_lease import ConfigError
from sqs_lease._core.eventsource import END_MARGIN_SECONDS
from sqs_lease.deploy import duration_alarm_seconds
from sqs_lease.metrics import METRICS, dimensions_of

from .queue import LeasedQueue

if TYPE_CHECKING:
    from .consumers import LambdaConsumer

_LIBRARY_METRICS = {m.name for m in METRICS}


@dataclass(frozen=True)
class AlarmMetric:
    """An alarm on one of the library's EMF metrics (``sqs_lease.metrics.METRICS``)."""

    metric_name: str
    title: str
    threshold: int
    """The metric's sum over the job classes in one five-minute period that alarms."""

    def __post_init__(self) -> None:
        if self.metric_name not in _LIBRARY_METRICS:
            raise ConfigError(
                f"metric_name={self.metric_name!r}: the library writes no such metric; "
                f"choose one of {sorted(_LIBRARY_METRICS)}"
            )


ALARM_METRICS: tuple[AlarmMetric, ...] = (
    # The heartbeat could not extend a lease before its reserve ran out.
    AlarmMetric("ExpiredLeases", "Expired leases", 5),
    # Another claim took the job: duplicates or pauses; many mean leases are too short.
    AlarmMetric("LostLeases", "Lost leases", 5),
    AlarmMetric("RejectedResults", "Rejected results", 1),
    AlarmMetric("AmbiguousIntents", "Ambiguous intents", 1),
    AlarmMetric("ParkedJobs", "Parked jobs", 1),
)
"""The library metrics an operator alarms on (docs/operations.md, "Metrics")."""

PERIOD = Duration.minutes(5)
MAX_CLASSES = 10
"""CloudWatch's limit on the metrics one alarm's math expression may use."""


def metrics_namespace(prefix: str) -> str:
    """The EMF namespace of one deployment (``SQS_LEASE_METRICS_NAMESPACE`` in both
    consumers; the alarms read the same): the prefix keeps deployments apart."""
    return f"SqsLease/{prefix}"


class LeaseMonitoring(Construct):
    """Alarms and one dashboard on the consumers' EMF metrics and the queues.

    The consumers (``LambdaConsumer``, ``FargateConsumer``) write the library's EMF
    metrics (``sqs_lease.metrics``) in the namespace ``SqsLease/<prefix>``, one
    dimension set per job class (``sqs_lease.metrics.dimensions_of``); each alarm
    sums one metric over the queue's job classes (at most 10, CloudWatch's limit
    for one alarm). Alarms fire on expired and lost leases, rejected results,
    ambiguous intents, parked jobs, any message in the DLQ, and the oldest
    message's age (default: twice the queue's visibility, at least 15 min), on the
    job queue and, where the queue has one, on the interactive queue too.

    With ``lambda_consumer``, also on the function: Errors, Throttles, and an
    invocation that ran into its end margin (``sqs_lease.deploy.
    duration_alarm_seconds``), and the scheduled sweep's Errors. Every alarm has
    every ``alarm_actions`` and, with ``alarm_topic``, an SNS action to the topic
    (docs/operations.md, "Alarms").
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        queue: LeasedQueue,
        oldest_message_age: Duration | None = None,
        alarm_actions: Sequence[cloudwatch.IAlarmAction] = (),
        alarm_topic: sns.ITopic | None = None,
        lambda_consumer: LambdaConsumer | None = None,
    ) -> None:
        classes = queue.job_classes
        if len(classes) > MAX_CLASSES:
            raise ConfigError(
                f"queue: {len(classes)} job classes; an alarm sums at most {MAX_CLASSES} "
                "metrics: split the classes over more queues (one LeaseMonitoring each)"
            )
        age = (
            max(900, 2 * queue.visibility_timeout_seconds)
            if oldest_message_age is None
            else int(oldest_message_age.to_seconds())
        )
        if age < 60:
            raise ConfigError(f"oldest_message_age={age} s: give at least 60 s")
        if alarm_topic is not None:
            # Every alarm tells whoever the topic reaches (and any other action given).
            alarm_actions = (*alarm_actions, cw_actions.SnsAction(alarm_topic))
        super().__init__(scope, construct_id)
        self._namespace = metrics_namespace(queue.settings.prefix)
        self._alarms: dict[str, cloudwatch.Alarm] = {}
        metrics: dict[str, cloudwatch.IMetric] = {}
        for am in ALARM_METRICS:
            per_class = {
                # Ids unique across the dashboard's graphs, which show several sums.
                f"{am.metric_name.lower()}_{i}": cloudwatch.Metric(
                    namespace=self._namespace,
                    metric_name=am.metric_name,
                    dimensions_map=dimensions_of(c),
                    statistic="Sum",
                    period=PERIOD,
                )
                for i, c in enumerate(classes)
            }
            metric = cloudwatch.MathExpression(
                expression=f"SUM([{', '.join(per_class)}])",
                using_metrics=per_class,
                period=PERIOD,
                label=am.title,
            )
            metrics[am.metric_name] = metric
            self._alarm(
                am.metric_name,
                metric,
                am.threshold,
                f"{am.title}: {am.threshold}+ in 5 min over all job classes "
                "(docs/operations.md, 'Metrics')",
                alarm_actions,
            )
        dlq_depth = queue.dead_letter_queue.metric_approximate_number_of_messages_visible(
            period=PERIOD, statistic="Maximum", label="DLQ depth"
        )
        self._alarm(
            "DeadLetterQueueDepth",
            dlq_depth,
            1,
            "messages in the DLQ: read their reasons, fix, then redrive",
            alarm_actions,
        )
        oldest = queue.queue.metric_approximate_age_of_oldest_message(
            period=PERIOD, statistic="Maximum", label="Oldest message age (s)"
        )
        self._alarm(
            "OldestMessageAge",
            oldest,
            age,
            f"the oldest message waited {age}+ s: too few consumers, or they fail",
            alarm_actions,
        )
        function_widgets = (
            self._function_alarms(lambda_consumer, alarm_actions)
            if lambda_consumer is not None
            else []
        )
        fast = queue.interactive_queue
        queue_widget_left = [
            queue.queue.metric_approximate_number_of_messages_visible(period=PERIOD),
            queue.queue.metric_approximate_number_of_messages_not_visible(period=PERIOD),
        ]
        queue_widget_right = [oldest]
        if fast is not None:
            fast_oldest = fast.metric_approximate_age_of_oldest_message(
                period=PERIOD, statistic="Maximum", label="Oldest interactive message age (s)"
            )
            self._alarm(
                "InteractiveOldestMessageAge",
                fast_oldest,
                age,
                f"the oldest interactive message waited {age}+ s: too few consumers, or "
                "they fail (a person is waiting)",
                alarm_actions,
            )
            queue_widget_left += [
                fast.metric_approximate_number_of_messages_visible(
                    period=PERIOD, label="Interactive visible"
                ),
                fast.metric_approximate_number_of_messages_not_visible(
                    period=PERIOD, label="Interactive in flight"
                ),
            ]
            queue_widget_right.append(fast_oldest)
        self._dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=f"{queue.settings.prefix}-sqs-lease"
        )
        self._dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Leases",
                left=[metrics["ExpiredLeases"], metrics["LostLeases"]],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Results and intents",
                left=[
                    metrics["RejectedResults"],
                    metrics["AmbiguousIntents"],
                    metrics["ParkedJobs"],
                ],
                width=12,
            ),
        )
        self._dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Queue",
                left=queue_widget_left,
                right=queue_widget_right,
                width=12,
            ),
            cloudwatch.GraphWidget(title="Dead-letter queue", left=[dlq_depth], width=12),
            *function_widgets,
            cloudwatch.AlarmStatusWidget(
                title="Alarms", alarms=list(self._alarms.values()), width=24
            ),
        )

    def _function_alarms(
        self, consumer: LambdaConsumer, actions: Sequence[cloudwatch.IAlarmAction]
    ) -> list[cloudwatch.IWidget]:
        """The Lambda consumer's own alarms: an invocation failed (crash, timeout, a
        refused configuration), Lambda throttled one, one ran into its end margin
        (the next may time out); and the scheduled sweep's failures."""
        fn = consumer.function
        timeout = consumer.function_timeout_seconds
        near = duration_alarm_seconds(timeout, END_MARGIN_SECONDS)
        errors = fn.metric_errors(period=PERIOD, statistic="Sum", label="Errors")
        throttles = fn.metric_throttles(period=PERIOD, statistic="Sum", label="Throttles")
        duration = fn.metric_duration(period=PERIOD, statistic="Maximum", label="Duration (ms)")
        self._alarm(
            "FunctionErrors",
            errors,
            1,
            "the Lambda consumer's invocations failed (a crash, a timeout, a refused "
            "configuration): their unreported records come back; read the function's log",
            actions,
        )
        self._alarm(
            "FunctionThrottles",
            throttles,
            1,
            "Lambda throttled the consumer: reserved concurrency below the event "
            "source's maximum concurrency, or the account's limit reached",
            actions,
        )
        self._alarm(
            "FunctionNearTimeout",
            duration,
            int(near * 1000),
            f"an invocation ran {near:g}+ s of its {timeout} s timeout (into the "
            f"{END_MARGIN_SECONDS:g} s end margin): a handler overran its stage budget or "
            "end writes were slow; the next may time out",
            actions,
        )
        widgets: list[cloudwatch.IWidget] = [
            cloudwatch.GraphWidget(title="Lambda consumer", left=[errors, throttles], width=12),
            cloudwatch.GraphWidget(
                title="Lambda duration",
                left=[duration],
                left_annotations=[
                    cloudwatch.HorizontalAnnotation(value=timeout * 1000, label="timeout")
                ],
                width=12,
            ),
        ]
        sweep = consumer.sweep_function
        if isinstance(sweep, lambda_.Function):
            self._alarm(
                "SweepErrors",
                sweep.metric_errors(period=PERIOD, statistic="Sum"),
                1,
                "the scheduled sweep failed: stranded jobs are not sent again and "
                "dead-lettered jobs not parked until a sweep succeeds",
                actions,
            )
        return widgets

    def _alarm(
        self,
        name: str,
        metric: cloudwatch.IMetric,
        threshold: int,
        description: str,
        actions: Sequence[cloudwatch.IAlarmAction],
    ) -> None:
        alarm = cloudwatch.Alarm(
            self,
            f"{name}Alarm",
            metric=metric,
            threshold=threshold,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=description,
        )
        for action in actions:
            alarm.add_alarm_action(action)
        self._alarms[name] = alarm

    @property
    def namespace(self) -> str:
        """The CloudWatch namespace of the consumers' EMF metrics."""
        return self._namespace

    @property
    def alarms(self) -> dict[str, cloudwatch.Alarm]:
        """The alarms by name (a copy)."""
        return dict(self._alarms)

    @property
    def dashboard(self) -> cloudwatch.Dashboard:
        """The dashboard."""
        return self._dashboard
