"""sqs-lease: long tool calls on AWS, made safe.

SQS's visibility timeout is the time lease (extended by a heartbeat); DynamoDB
conditional writes hold the ownership order (a fencing token that rises at
every claim), the results and the intents of side effects.
"""

from ._aio import AsyncDriver
from ._aio_worker import AsyncWorker
from ._aws import SyncDriver, Timeouts
from ._config import Settings
from ._core.flows import Cancelled, Stranded, SubmitResult, SweepReport
from ._core.groups import GroupReport
from ._core.intents import (
    CheckAnswer,
    EffectResult,
    IntentState,
    IntentView,
    Resolution,
    Resumed,
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
from ._jobs import App, AsyncJobContext, EffectCall, JobClass, JobContext, StagedJob, Target
from ._journal import Journal
from ._options import WorkerOptions
from ._producer import Producer
from ._resources import create_queue, create_tables
from ._shell import WorkerStats
from ._worker import Worker, load_app

__all__ = [
    "PROGRESS_LIMIT",
    "App",
    "AsyncDriver",
    "AsyncJobContext",
    "AsyncWorker",
    "AttemptTimedOut",
    "AwsCallFailed",
    "AwsUnavailable",
    "Cancelled",
    "CheckAnswer",
    "ConfigError",
    "EffectCall",
    "EffectResult",
    "FenceRefused",
    "GroupCancelled",
    "GroupReport",
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
    "Resolution",
    "ResourceMissing",
    "Resumed",
    "RetryRefused",
    "Settings",
    "SqsLeaseError",
    "StagedJob",
    "Stranded",
    "SubmitConflict",
    "SubmitResult",
    "SweepReport",
    "SyncDriver",
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
    "load_app",
]
