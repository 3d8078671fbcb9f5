"""The public API is what an application uses, and every public module says what it
exports (issue 28 item 5).

``sqs_lease`` exports the app and its handlers' types, the workers and the producer,
settings and the exception hierarchy; drivers (``SyncDriver``, ``AsyncDriver``),
the operator commands' reports and the resolve's vocabulary stay in their modules.
A name added to or dropped from ``sqs_lease.__all__`` changes this list on purpose.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import sqs_lease

PACKAGE = Path(sqs_lease.__file__).resolve().parent

PUBLIC = frozenset(
    {
        # the application: the app, its handlers' context and tools' types
        "App",
        "AsyncJobContext",
        "CheckAnswer",
        "EffectCall",
        "EffectResult",
        "IntentState",
        "IntentView",
        "JobClass",
        "JobContext",
        "JobPolicy",
        "NextStage",
        "PROGRESS_LIMIT",
        "Target",
        "ToolResult",
        "Verdict",
        # running it: workers, producer, settings, resources
        "AsyncWorker",
        "JobState",
        "JobView",
        "Journal",
        "Producer",
        "AsyncProducer",
        "JobStatus",
        "Settings",
        "Timeouts",
        "Worker",
        "WorkerStats",
        "WorkerOptions",
        "create_queue",
        "create_tables",
        "WarmThroughput",
        # the exception hierarchy (what handlers raise and callers catch)
        "AttemptTimedOut",
        "AwsCallFailed",
        "AwsUnavailable",
        "ConfigError",
        "OptionError",
        "FenceRefused",
        "GroupCancelled",
        "WaitTimedOut",
        "HandlerSignal",
        "IntentAmbiguous",
        "IntentBusy",
        "IntentError",
        "IntentNotAmbiguous",
        "IntentNotFound",
        "IntentPayloadMismatch",
        "JobCancelled",
        "JobClassError",
        "JobNotFound",
        "LeaseError",
        "LeaseLost",
        "LimitExceeded",
        "OwnershipUnknown",
        "PayloadError",
        "PermanentError",
        "ProgressTooLarge",
        "RecordUnreadable",
        "ResourceMissing",
        "RetryRefused",
        "SqsLeaseError",
        "SubmitConflict",
        "ToolNotApplied",
        "ToolOutcomeUnknown",
        "TransientError",
        "WorkerShuttingDown",
    }
)

# Dropped from the top level (issue 28): each stays reachable from its own module.
MOVED = {
    "AsyncDriver": "sqs_lease._aio",
    "SyncDriver": "sqs_lease._aws",
    "load_app": "sqs_lease._worker",
    "Cancelled": "sqs_lease._core.cancelling",
    "Stranded": "sqs_lease._core.sweeping",
    "SubmitResult": "sqs_lease._core.sending",
    "SweepReport": "sqs_lease._core.sweeping",
    "GroupReport": "sqs_lease._core.groups",
    "Resolution": "sqs_lease._core.resolving",
    "Resumed": "sqs_lease._core.resuming",
    "StagedJob": "sqs_lease._jobs",
}


def _public_modules() -> list[str]:
    """Every module of the package whose dotted path has no part starting with ``_``
    (``__init__`` names its package)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue
        found.append(".".join(parts))
    return found


def test_the_top_level_exports_exactly_the_public_api() -> None:
    assert set(sqs_lease.__all__) == PUBLIC
    assert len(sqs_lease.__all__) == len(PUBLIC)  # no name listed twice
    for name in sqs_lease.__all__:
        assert hasattr(sqs_lease, name), name


@pytest.mark.parametrize(("name", "module"), sorted(MOVED.items()))
def test_a_name_dropped_from_the_top_level_stays_in_its_module(name: str, module: str) -> None:
    assert name not in sqs_lease.__all__
    assert hasattr(importlib.import_module(module), name)


def test_the_public_modules_are_found() -> None:
    # The walk itself: an empty list would pass the check below vacuously.
    assert {"sqs_lease", "sqs_lease.cli", "sqs_lease.testing", "sqs_lease.receiver"} <= set(
        _public_modules()
    )


@pytest.mark.parametrize("module", _public_modules())
def test_every_public_module_declares_all(module: str) -> None:
    path = PACKAGE.parent.joinpath(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(source.read_text(encoding="utf-8"))
    declared = any(
        isinstance(node, ast.Assign | ast.AnnAssign)
        and any(
            isinstance(t, ast.Name) and t.id == "__all__"
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
        for node in tree.body
    )
    assert declared, f"{module} has no __all__"
    mod = importlib.import_module(module)
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert missing == [], f"{module}.__all__ names what it does not define: {missing}"
