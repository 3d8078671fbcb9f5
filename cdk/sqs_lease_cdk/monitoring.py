"""Alarms and a dashboard on the toolkit's signals: journal events and queue figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_logs as logs
from constructs import Construct

from sqs_lease import ConfigError

from .queue import LeasedQueue


@dataclass(frozen=True)
class JournalMetric:
    """A CloudWatch metric counted from one journal event (a log metric filter)."""

    metric_name: str
    event: str
    title: str
    threshold: int
    """Events in one five-minute period that raise the alarm."""


JOURNAL_METRICS: tuple[JournalMetric, ...] = (
    # The watchdog let a lease go (reserve spent, effect timeout, no progress, budget).
    JournalMetric("LeasesExpired", "lease_dropped", "Expired leases", 5),
    # Another claim took the job: duplicates or pauses; many mean leases are too short.
    JournalMetric("LeasesLost", "heartbeat_lost", "Lost leases", 5),
    JournalMetric("ResultsRejected", "result_rejected", "Rejected results", 1),
    JournalMetric("IntentsAmbiguous", "intent_ambiguous", "Ambiguous intents", 1),
    JournalMetric("JobsParked", "job_parked", "Parked jobs", 1),
)
"""The journal events an operator alarms on (docs/operations.md), as metrics."""

PERIOD = Duration.minutes(5)


class LeaseMonitoring(Construct):
    """Metric filters on the consumers' journals, alarms, and one dashboard.

    Journal events (one JSON object per line) become metrics in the namespace
    ``SqsLease/<prefix>``; alarms fire on expired and lost leases, rejected
    results, ambiguous intents, parked jobs, any message in the DLQ, and the
    oldest message's age (default: twice the queue's visibility, at least 15 min).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        queue: LeasedQueue,
        log_groups: Sequence[logs.ILogGroup],
        oldest_message_age: Duration | None = None,
        alarm_actions: Sequence[cloudwatch.IAlarmAction] = (),
    ) -> None:
        if not log_groups:
            raise ConfigError(
                "log_groups: none given; pass the consumers' log groups (their journals "
                "are where leases, results and intents are counted)"
            )
        age = (
            max(900, 2 * queue.visibility_timeout_seconds)
            if oldest_message_age is None
            else int(oldest_message_age.to_seconds())
        )
        if age < 60:
            raise ConfigError(f"oldest_message_age={age} s: give at least 60 s")
        super().__init__(scope, construct_id)
        self._namespace = f"SqsLease/{queue.settings.prefix}"
        self._alarms: dict[str, cloudwatch.Alarm] = {}
        metrics: dict[str, cloudwatch.Metric] = {}
        for jm in JOURNAL_METRICS:
            for i, group in enumerate(log_groups):
                logs.MetricFilter(
                    self,
                    f"{jm.metric_name}Filter{i}",
                    log_group=group,
                    filter_pattern=logs.FilterPattern.string_value("$.event", "=", jm.event),
                    metric_namespace=self._namespace,
                    metric_name=jm.metric_name,
                    metric_value="1",
                    default_value=0,
                )
            metric = cloudwatch.Metric(
                namespace=self._namespace,
                metric_name=jm.metric_name,
                statistic="Sum",
                period=PERIOD,
                label=jm.title,
            )
            metrics[jm.metric_name] = metric
            self._alarm(
                jm.metric_name,
                metric,
                jm.threshold,
                f"{jm.title}: {jm.threshold}+ `{jm.event}` events in 5 min "
                "(docs/operations.md, 'Reading the journal')",
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
        self._dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=f"{queue.settings.prefix}-sqs-lease"
        )
        self._dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Leases",
                left=[metrics["LeasesExpired"], metrics["LeasesLost"]],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Results and intents",
                left=[
                    metrics["ResultsRejected"],
                    metrics["IntentsAmbiguous"],
                    metrics["JobsParked"],
                ],
                width=12,
            ),
        )
        self._dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Queue",
                left=[
                    queue.queue.metric_approximate_number_of_messages_visible(period=PERIOD),
                    queue.queue.metric_approximate_number_of_messages_not_visible(period=PERIOD),
                ],
                right=[oldest],
                width=12,
            ),
            cloudwatch.GraphWidget(title="Dead-letter queue", left=[dlq_depth], width=12),
            cloudwatch.AlarmStatusWidget(
                title="Alarms", alarms=list(self._alarms.values()), width=24
            ),
        )

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
        """The CloudWatch namespace of the journal metrics."""
        return self._namespace

    @property
    def alarms(self) -> dict[str, cloudwatch.Alarm]:
        """The alarms by name (a copy)."""
        return dict(self._alarms)

    @property
    def dashboard(self) -> cloudwatch.Dashboard:
        """The dashboard."""
        return self._dashboard
