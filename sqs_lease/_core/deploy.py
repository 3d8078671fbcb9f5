"""Rules a deployment must keep: the redrive bound, Lambda's visibility, ECS's stop timeout.

The worker checks a queue it finds against these rules; the CDK constructs
(``cdk/``) derive the queue and consumer settings from them. One definition,
so a stack and the worker cannot disagree about what "too tight" means.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from .._errors import ConfigError, JobClassError
from .eventsource import END_MARGIN_SECONDS, never_fit

REDRIVE_BACKSTOP = 50
"""The redrive ``maxReceiveCount`` used when the job classes ask for no more. The
worker counts attempts itself (in the job record); SQS's redrive only catches
messages that kill a worker before any claim."""

SQS_MAX_RECEIVE_COUNT = 1000
"""SQS refuses a redrive policy's ``maxReceiveCount`` above 1000."""

LAMBDA_MAX_TIMEOUT = 900
"""Lambda's longest function timeout, in seconds."""

LAMBDA_VISIBILITY_FACTOR = 6
"""AWS's guidance for an SQS event source: visibility >= 6 x function timeout + batching window."""

SHUTDOWN_GRACE_SECONDS = 20.0
"""The worker's default shutdown grace: how long running handlers get after SIGTERM."""

SHUTDOWN_RELEASE_MARGIN = 10.0
"""Time after the grace for the worker to hand back the jobs still held (one release
round: conditional writes and visibility 0) before ECS sends SIGKILL."""

ECS_MAX_STOP_TIMEOUT = 120
"""Fargate's longest ``stopTimeout``, in seconds."""


def redrive_too_tight(max_receive_count: int, max_attempts: int) -> bool:
    """Whether a redrive of ``max_receive_count`` receives can strand a live job.

    Receives that end in no claim (unanswered claims, duplicate deliveries) count
    too, so a count at most twice the largest ``max_attempts`` can move a live
    job's message to the DLQ and leave its record without a message (found by
    the simulation's ``tight_redrive`` mutation).
    """
    return max_receive_count <= 2 * max_attempts


def max_receive_count_for(max_attempts: Iterable[int]) -> int:
    """The redrive ``maxReceiveCount`` for job classes with these ``max_attempts``:
    the backstop, or the smallest count that is not too tight, whichever is larger.

    Raises ``JobClassError`` when no count SQS accepts is loose enough.
    """
    most = max(max_attempts, default=0)
    if most < 1:
        raise ConfigError("no job class given: the redrive bound follows from their max_attempts")
    count = max(REDRIVE_BACKSTOP, 2 * most + 1)
    if count > SQS_MAX_RECEIVE_COUNT:
        raise JobClassError(
            f"max_attempts={most} needs a redrive maxReceiveCount above 2 x {most} = {2 * most}, "
            f"but SQS accepts at most {SQS_MAX_RECEIVE_COUNT}; lower max_attempts to at most "
            f"{(SQS_MAX_RECEIVE_COUNT - 1) // 2}"
        )
    return count


def queue_visibility_for(lease_seconds: Iterable[int]) -> int:
    """The queue's default visibility for job classes with these leases: the longest.

    The worker sets each message's visibility at receive and at claim itself; the
    queue's default is what any other receiver gets, and it must hold a job of
    any class until its first heartbeat.
    """
    longest = max(lease_seconds, default=0)
    if longest < 1:
        raise ConfigError("no job class given: the queue's visibility follows from their leases")
    return longest


def lambda_visibility_floor(function_timeout: int, batching_window: int) -> int:
    """The least queue visibility for a Lambda consumer (AWS's guidance:
    6 x function timeout + the event source's maximum batching window)."""
    return LAMBDA_VISIBILITY_FACTOR * function_timeout + batching_window


def check_lambda_timing(visibility: int, function_timeout: int, batching_window: int) -> None:
    """Refuse a Lambda consumer whose queue visibility is below AWS's guidance,
    or whose timeout Lambda does not allow; the error names the numbers and the fix."""
    if not 1 <= function_timeout <= LAMBDA_MAX_TIMEOUT:
        raise ConfigError(
            f"function timeout {function_timeout} s: Lambda allows 1..{LAMBDA_MAX_TIMEOUT} s; "
            "run longer jobs on the ECS consumer or split them into stages"
        )
    if not 0 <= batching_window <= 300:
        raise ConfigError(
            f"max batching window {batching_window} s: SQS event sources allow 0..300 s"
        )
    floor = lambda_visibility_floor(function_timeout, batching_window)
    if visibility < floor:
        raise ConfigError(
            f"queue visibility {visibility} s is below {LAMBDA_VISIBILITY_FACTOR} x function "
            f"timeout {function_timeout} s + batching window {batching_window} s = {floor} s; "
            "give the queue the Lambda consumer's timing (LeasedQueue lambda_timeout / "
            "max_batching_window) or lower the function timeout"
        )


def check_lambda_fit(rules: Mapping[str, tuple[float, int]], function_timeout: float) -> None:
    """Refuse lease rules (job classes, ``job/stage``, ``job/tool``) that no invocation of
    ``function_timeout`` seconds can ever start: ``rules`` maps each name to its
    (``stage_budget_seconds``, ``lease_seconds``). The budget rule (``can_start``) would
    leave each such record unstarted, released at once, until SQS moved it to the DLQ
    with its job still queued. The construct checks it at synth, the Lambda shell at
    its first invocation; the error names each class and the numbers."""
    unfit = never_fit({name: budget for name, (budget, _) in rules.items()}, function_timeout)
    if not unfit:
        return
    room = function_timeout - END_MARGIN_SECONDS
    named = "; ".join(
        f"{n}: stage_budget_seconds {rules[n][0]:g} s (lease {rules[n][1]} s)" for n in unfit
    )
    raise JobClassError(
        f"job classes {named}: a record starts only when its stage budget + "
        f"{END_MARGIN_SECONDS:g} s fits in the invocation, and the function timeout is "
        f"{function_timeout:g} s, so these can never run on Lambda; route them to a "
        f"worker (the ECS consumer) on a queue of their own, or split them into stages "
        f"whose stage_budget_seconds are at most {room:g} s"
    )


def ecs_stop_timeout(shutdown_grace: float) -> int:
    """The ECS ``stopTimeout`` for a worker with this shutdown grace: the grace plus
    the release margin, in whole seconds. Raises ``ConfigError`` past Fargate's cap."""
    if not (math.isfinite(shutdown_grace) and shutdown_grace >= 0):
        raise ConfigError(f"shutdown_grace={shutdown_grace}: give seconds >= 0")
    stop = math.ceil(shutdown_grace + SHUTDOWN_RELEASE_MARGIN)
    if stop > ECS_MAX_STOP_TIMEOUT:
        raise ConfigError(
            f"shutdown_grace={shutdown_grace:g} s + release margin {SHUTDOWN_RELEASE_MARGIN:g} s "
            f"= {stop} s exceeds Fargate's stopTimeout cap of {ECS_MAX_STOP_TIMEOUT} s; lower "
            f"shutdown_grace to at most {ECS_MAX_STOP_TIMEOUT - SHUTDOWN_RELEASE_MARGIN:g}"
        )
    return stop


# --- Operating a Lambda consumer: scaling, retention, alarms (issue 27) ---

LAMBDA_MAX_CONCURRENCY = 10
"""The SQS event source's default maximum concurrency (the construct's
``max_concurrency``): at most this many invocations at once, so a burst of jobs
cannot take the account's whole Lambda concurrency (or throttle other functions),
and jobs past it wait in the queue, not in throttled invocations."""

ESM_CONCURRENCY_RANGE = (2, 1000)
"""What an SQS event source's ``MaximumConcurrency`` takes."""

QUEUE_RETENTION_SECONDS = 4 * 86_400
"""The job queue's message retention, set explicitly (SQS's default, 4 days): the
DLQ keeps its messages 14 days, so a message SQS moves there after days in the
job queue still has time in the DLQ (its age counts from its first send)."""

DLQ_RETENTION_SECONDS = 14 * 86_400
"""The DLQ's retention: SQS's longest."""


def check_lambda_concurrency(max_concurrency: int | None, reserved: int | None) -> None:
    """Refuse an event source concurrency SQS does not take, or a reserved concurrency
    below it (Lambda would throttle what the event source hands it: a throttled
    invocation's records come back with their receive counted)."""
    low, high = ESM_CONCURRENCY_RANGE
    if max_concurrency is not None and not low <= max_concurrency <= high:
        raise ConfigError(
            f"max_concurrency={max_concurrency}: an SQS event source takes {low}..{high} "
            "(None: no limit but the account's)"
        )
    if reserved is not None and reserved < 1:
        raise ConfigError(f"reserved_concurrency={reserved}: give 1 or more")
    if reserved is not None and max_concurrency is not None and reserved < max_concurrency:
        raise ConfigError(
            f"reserved_concurrency={reserved} is below max_concurrency={max_concurrency}: "
            "the event source would start invocations Lambda throttles; give "
            f"reserved_concurrency >= {max_concurrency} or lower max_concurrency"
        )


def duration_alarm_seconds(function_timeout: int, end_margin: float) -> float:
    """The invocation duration that alarms: into the budget rule's end margin. A
    record starts only when its stage budget and the margin fit, so a healthy
    invocation returns before ``function_timeout - end_margin``; one that ran past
    it had a handler overrun its budget or slow end writes, and the next may time
    out (its records then come back unreported)."""
    return max(1.0, function_timeout - end_margin)


# --- What each role may call: the one list (issue 27) ---

UNSENT_INDEX_RESOURCE = "jobs/index/unsent"
"""The jobs table's sparse ``unsent`` index (the stranded sweep's Query)."""

LIVENESS_RESOURCE = "jobs:worker#"
"""The jobs table, for the worker's liveness record only (keys ``worker#...``)."""

PERMISSIONS: dict[str, dict[str, tuple[str, ...]]] = {
    # A worker: the thread and async workers, the Lambda consumer (one role).
    "worker": {
        "queue": (
            "sqs:ReceiveMessage",
            "sqs:ChangeMessageVisibility",  # also authorises ChangeMessageVisibilityBatch
            "sqs:DeleteMessage",  # also DeleteMessageBatch
            "sqs:SendMessage",  # the stranded sweep re-sends, stages send the next
            "sqs:GetQueueUrl",
            "sqs:GetQueueAttributes",  # the redrive policy, at start
        ),
        "dlq": (
            "sqs:SendMessage",  # a poison message is copied there with its reason
            "sqs:GetQueueUrl",  # the DLQ is found from the redrive policy's ARN
            "sqs:ReceiveMessage",  # the sweep's DLQ reconciliation looks (with a hold)
            "sqs:ChangeMessageVisibility",  # ... and gives back
        ),
        "jobs": (
            "dynamodb:DescribeTable",
            "dynamodb:GetItem",
            "dynamodb:BatchGetItem",  # heartbeat confirmation (consistent)
            "dynamodb:UpdateItem",  # claim, commit, retry, park, release, progress
            "dynamodb:ConditionCheckItem",  # the intents' fenced transactions
        ),
        UNSENT_INDEX_RESOURCE: ("dynamodb:Query",),
        LIVENESS_RESOURCE: ("dynamodb:PutItem",),
        "intents": (
            "dynamodb:DescribeTable",
            "dynamodb:GetItem",  # tell its own start or confirm from another's
            "dynamodb:PutItem",  # prepare
            "dynamodb:UpdateItem",  # start and confirm (in a transaction)
        ),
        "attempts": (
            "dynamodb:DescribeTable",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
        ),
        "slots": (
            "dynamodb:DescribeTable",
            "dynamodb:BatchGetItem",  # a pool's slots (consistent)
            "dynamodb:UpdateItem",  # take and give back one
        ),
    },
    # The Lambda consumer's scheduled sweep: re-send stranded jobs, park dead-lettered.
    "sweeper": {
        "queue": ("sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes"),
        "dlq": ("sqs:GetQueueUrl", "sqs:ReceiveMessage", "sqs:ChangeMessageVisibility"),
        "jobs": ("dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:UpdateItem"),
        UNSENT_INDEX_RESOURCE: ("dynamodb:Query",),
        "intents": ("dynamodb:DescribeTable",),  # the shell checks the tables at start
        "attempts": ("dynamodb:DescribeTable",),
        "slots": ("dynamodb:DescribeTable",),
    },
    # Producer.submit (the CDK narrows each table action to submit's attributes).
    "producer": {
        "queue": ("sqs:SendMessage", "sqs:GetQueueUrl"),
        "jobs": ("dynamodb:PutItem", "dynamodb:UpdateItem"),
        "groups": ("dynamodb:UpdateItem",),  # a grouped submit counts the job
    },
}
"""What each role calls, per resource: ``queue`` (the job queues: the batch and the
interactive one), ``dlq``, a table by its role, :data:`UNSENT_INDEX_RESOURCE`,
:data:`LIVENESS_RESOURCE`. IAM authorises a batch call by its single action
(``DeleteMessageBatch`` by ``sqs:DeleteMessage``) and a transaction per item
action. The CDK grants and the README's table are made from this list, and a test
runs every path and checks each AWS call against it, both ways."""


ECS_EXIT_MARGIN_SECONDS = 2.0
"""How long before the task's ``stopTimeout`` (counted from SIGTERM) a worker has
exited, whatever its handlers do: ECS's SIGKILL must never race its last writes."""


ECS_FORCED_EXIT_LEAD = 1.0
"""Time a forced exit keeps for itself: its journal line, the flushes, the exit."""


def ecs_exit_after(stop_timeout: float) -> float:
    """Seconds after SIGTERM at which a worker process still running ends itself (a
    handler or a call still holds it), so that it is gone
    :data:`ECS_EXIT_MARGIN_SECONDS` before ``stop_timeout``."""
    return max(0.0, stop_timeout - ECS_EXIT_MARGIN_SECONDS - ECS_FORCED_EXIT_LEAD)
