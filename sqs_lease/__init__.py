"""sqs-lease: long tool calls on AWS, made safe.

SQS's visibility timeout is the time lease (extended by a heartbeat); DynamoDB
conditional writes hold the ownership order (a fencing token that rises at
every claim), the results and the intents of side effects.

The names here are what an application uses: the app and its handlers' types, the
workers and the producer, settings, the exception hierarchy. Drivers, reports of
the operator commands and the simulator stay in their own modules (see
``tests/test_public_api.py``, which lists them).

Importing the package imports none of its parts but its error types: each other
public name is imported from its module on first use (``_WHERE``), so a process
pays only for what it uses (a pytest run that loads the testing kit's plugin, a
Lambda whose handler needs one module; see ARCHITECTURE.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The error types import nothing: every caller may catch them for free.
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
    WaitTimedOut,
    WorkerShuttingDown,
)

if TYPE_CHECKING:
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
    from ._core.status import JobStatus
    from ._jobs import (
        App,
        AsyncJobContext,
        EffectCall,
        JobClass,
        JobContext,
        JobPolicy,
        Target,
    )
    from ._journal import Journal
    from ._options import WorkerOptions
    from ._producer import AsyncProducer, Producer
    from ._resources import create_queue, create_tables
    from ._schema.create_table import WarmThroughput
    from ._shell import WorkerStats
    from ._worker import Worker

__all__ = [
    "PROGRESS_LIMIT",
    "App",
    "AsyncJobContext",
    "AsyncProducer",
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
    "JobPolicy",
    "JobState",
    "JobStatus",
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
    "WaitTimedOut",
    "WarmThroughput",
    "Worker",
    "WorkerOptions",
    "WorkerShuttingDown",
    "WorkerStats",
    "create_queue",
    "create_tables",
]

# Where each public name lives (the imports above, for type checkers, say the same;
# tests/test_import_weight.py holds the two and __all__ together).
_WHERE: dict[str, tuple[str, ...]] = {
    "._aio_worker": ("AsyncWorker",),
    "._aws": ("Timeouts",),
    "._config": ("Settings",),
    "._core.intents": (
        "CheckAnswer",
        "EffectResult",
        "IntentState",
        "IntentView",
        "ToolResult",
        "Verdict",
    ),
    "._core.limits": ("PROGRESS_LIMIT",),
    "._core.records": (
        "JobState",
        "JobView",
    ),
    "._core.stages": ("NextStage",),
    "._jobs": (
        "App",
        "AsyncJobContext",
        "EffectCall",
        "JobClass",
        "JobContext",
        "JobPolicy",
        "Target",
    ),
    "._journal": ("Journal",),
    "._options": ("WorkerOptions",),
    "._core.status": ("JobStatus",),
    "._producer": ("AsyncProducer", "Producer"),
    "._resources": (
        "create_queue",
        "create_tables",
    ),
    "._schema.create_table": ("WarmThroughput",),
    "._shell": ("WorkerStats",),
    "._worker": ("Worker",),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next use is a plain attribute
    return value
