"""sqs-lease: long tool calls on AWS, made safe.

SQS's visibility timeout is the time lease (extended by a heartbeat); DynamoDB
conditional writes hold the ownership order (a fencing token that rises at
every claim), the results and the intents of side effects.

The names here are what an application uses: the app and its handlers' types, the
workers and the producer, settings, the exception hierarchy. Drivers, reports of
the operator commands and the simulator stay in their own modules (see
``tests/test_public_api.py``, which lists them).
"""

from ._aio_worker import AsyncWorker
from ._aws import Timeouts
from ._config import Settings
from ._core.intents import (
    CheckAnswer,
    EffectResult,
    IntentState,
    IntentView,
    ToolResult,
    Verdict,
)
from ._core.limits import PROGRESS_LIMIT
from ._core.records import JobState, JobView
from ._core.stages import NextStage
from ._errors import (
    AttemptTimedOut,
    AwsCallFailed,
    AwsUnavailable,
    ConfigError,
    FenceRefused,
    GroupCancelled,
    HandlerSignal,
    IntentAmbiguous,
    IntentBusy,
    IntentError,
    IntentNotAmbiguous,
    IntentNotFound,
    IntentPayloadMismatch,
    JobCancelled,
    JobClassError,
    JobNotFound,
    LeaseError,
    LeaseLost,
    LimitExceeded,
    OptionError,
    OwnershipUnknown,
    PayloadError,
    PermanentError,
    ProgressTooLarge,
    RecordUnreadable,
    ResourceMissing,
    RetryRefused,
    SqsLeaseError,
    SubmitConflict,
    ToolNotApplied,
    ToolOutcomeUnknown,
    TransientError,
    WorkerShuttingDown,
)
from ._jobs import App, AsyncJobContext, EffectCall, JobClass, JobContext, Target
from ._journal import Journal
from ._options import WorkerOptions
from ._producer import Producer
from ._resources import create_queue, create_tables
from ._shell import WorkerStats
from ._worker import Worker

__all__ = [
    "PROGRESS_LIMIT",
    "App",
    "AsyncJobContext",
    "AsyncWorker",
    "AttemptTimedOut",
    "AwsCallFailed",
    "AwsUnavailable",
    "CheckAnswer",
    "ConfigError",
    "EffectCall",
    "EffectResult",
    "FenceRefused",
    "GroupCancelled",
    "HandlerSignal",
    "IntentAmbiguous",
    "IntentBusy",
    "IntentError",
    "IntentNotAmbiguous",
    "IntentNotFound",
    "IntentPayloadMismatch",
    "IntentState",
    "IntentView",
    "JobCancelled",
    "JobClass",
    "JobClassError",
    "JobContext",
    "JobNotFound",
    "JobState",
    "JobView",
    "Journal",
    "LeaseError",
    "LeaseLost",
    "LimitExceeded",
    "NextStage",
    "OptionError",
    "OwnershipUnknown",
    "PayloadError",
    "PermanentError",
    "Producer",
    "ProgressTooLarge",
    "RecordUnreadable",
    "ResourceMissing",
    "RetryRefused",
    "Settings",
    "SqsLeaseError",
    "SubmitConflict",
    "Target",
    "Timeouts",
    "ToolNotApplied",
    "ToolOutcomeUnknown",
    "ToolResult",
    "TransientError",
    "Verdict",
    "Worker",
    "WorkerOptions",
    "WorkerShuttingDown",
    "WorkerStats",
    "create_queue",
    "create_tables",
]
