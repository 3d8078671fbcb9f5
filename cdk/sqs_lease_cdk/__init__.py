"""AWS CDK constructs for sqs-lease.

- ``LeasedQueue``: job queue + DLQ, visibility and redrive from the job classes.
- ``LeaseTables``: jobs, intents, attempts, groups and slots tables from the library's models.
- ``LambdaConsumer``, ``FargateConsumer``: the two ways to run workers (the Lambda one
  with its scheduled sweep).
- ``LeaseMonitoring``: alarms on the library's EMF metrics and the queues, a dashboard.

Every construct checks its props before it builds anything and raises the
library's ``ConfigError`` (or ``JobClassError``) naming the prop and the fix.
"""

from ._common import job_classes_of, lease_rules_of, settings_for
from .bundling import BundlingError, check_native_code, lambda_code
from .consumers import (
    LAMBDA_HANDLER,
    SWEEP_EVERY,
    SWEEP_HANDLER,
    FargateConsumer,
    LambdaConsumer,
    backlog_per_task,
)
from .monitoring import ALARM_METRICS, AlarmMetric, LeaseMonitoring, metrics_namespace
from .queue import (
    PRODUCER_QUEUE_ACTIONS,
    SWEEPER_DLQ_ACTIONS,
    SWEEPER_QUEUE_ACTIONS,
    WORKER_DLQ_ACTIONS,
    WORKER_QUEUE_ACTIONS,
    LeasedQueue,
)
from .tables import (
    PRODUCER_TABLE_ACTIONS,
    SWEEPER_JOBS_ACTIONS,
    WORKER_TABLE_ACTIONS,
    LeaseTables,
)

__all__ = [
    "ALARM_METRICS",
    "LAMBDA_HANDLER",
    "PRODUCER_QUEUE_ACTIONS",
    "PRODUCER_TABLE_ACTIONS",
    "SWEEPER_DLQ_ACTIONS",
    "SWEEPER_JOBS_ACTIONS",
    "SWEEPER_QUEUE_ACTIONS",
    "SWEEP_EVERY",
    "SWEEP_HANDLER",
    "WORKER_DLQ_ACTIONS",
    "WORKER_QUEUE_ACTIONS",
    "WORKER_TABLE_ACTIONS",
    "AlarmMetric",
    "BundlingError",
    "FargateConsumer",
    "LambdaConsumer",
    "LeaseMonitoring",
    "LeaseTables",
    "LeasedQueue",
    "backlog_per_task",
    "check_native_code",
    "job_classes_of",
    "lambda_code",
    "lease_rules_of",
    "metrics_namespace",
    "settings_for",
]
