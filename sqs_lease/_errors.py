"""The one exception hierarchy of sqs-lease.

::

    SqsLeaseError                     every error this package raises
    ├── ConfigError                   bad settings, names the field and the fix
    │   └── JobClassError             a job class breaks the lease timing rules
    ├── PayloadError                  a payload fails its job class's model
    ├── LimitExceeded                 a value breaks a DynamoDB size limit (named)
    │   └── ProgressTooLarge          ctx.progress(details) over PROGRESS_LIMIT (also a ValueError)
    ├── RecordUnreadable              a stored record this version cannot read
    ├── SubmitConflict                same job id submitted with another payload
    ├── GroupCancelled                a submit to a group (agent session) that was cancelled
    ├── JobNotFound                   no job record for that id
    ├── WaitTimedOut                  a wait for a job outlasted its timeout (also a TimeoutError)
    ├── RetryRefused                  a retry the job's record does not allow
    ├── ResourceMissing               queue or table does not exist
    ├── AwsUnavailable                AWS (or the local emulator) did not answer
    ├── AwsCallFailed                 an AWS call failed in a way the flow cannot handle
    ├── LeaseError                    raised in handlers by ``ctx.check()``/``ctx.wait()``
    │   ├── LeaseLost                 the token moved on: stop, never commit success
    │   │   ├── JobCancelled          an operator or the session cancelled the job
    │   │   └── FenceRefused          a fenced target refused the token (412): not applied
    │   ├── OwnershipUnknown          cannot confirm ownership: start no irreversible step
    │   ├── AttemptTimedOut           the watchdog stopped the attempt (effect call, progress,
    │   │                             stage budget): it was given back for a counted retry
    │   └── WorkerShuttingDown        the worker is stopping: the job goes back to the queue
    ├── HandlerSignal                 raised by handlers to steer the worker
    │   ├── TransientError            retry with backoff (counted attempts)
    │   ├── PermanentError            fail now, with the reason
    │   ├── ToolOutcomeUnknown        the external call may or may not have applied
    │   └── ToolNotApplied            the call certainly did not apply (never sent, or refused)
    ├── IntentError                   side-effect intents
    │   ├── IntentPayloadMismatch     same key, different payload: a changed intention
    │   ├── IntentAmbiguous           cannot tell whether the effect applied: job parked
    │   ├── IntentBusy                another job holds the key past the wait bound: parked
    │   ├── IntentNotFound            no intent under that key
    │   └── IntentNotAmbiguous        a resolve met an intent with nothing to resolve
    └── FenceError                    a fence is missing or malformed (also a ValueError)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ._core.status import JobStatus

FenceProblem = Literal["missing_header", "invalid_header", "fence_signature_mismatch"]


class SqsLeaseError(Exception):
    """Base of every error raised by sqs-lease."""


class ConfigError(SqsLeaseError):
    """A setting is wrong; the message names the field and the fix."""


class OptionError(ConfigError):
    """A worker option is wrong (``WorkerOptions``): ``field``, the ``value`` given and
    the ``fix``; the message says all three."""

    def __init__(self, field: str, value: object, fix: str) -> None:
        super().__init__(f"{field}={value!r}: {fix}")
        self.field = field
        self.value = value
        self.fix = fix


class JobClassError(ConfigError):
    """A job class breaks a lease timing rule; the message names the numbers."""


class PayloadError(SqsLeaseError):
    """A payload does not validate against its job class's model."""


class LimitExceeded(SqsLeaseError):
    """A value the toolkit would store breaks a DynamoDB limit; the message names it."""


class ProgressTooLarge(LimitExceeded, ValueError):
    """``ctx.progress(details)`` got details whose JSON is over ``PROGRESS_LIMIT``
    bytes: keep a resume hint small (a cursor, a page number), not the work itself."""


class RecordUnreadable(SqsLeaseError):
    """A stored job record this version cannot read (an unknown state, a malformed
    value): written by hand or by a newer version. It affects only its own job."""

    def __init__(self, message: str, job_id: str = "") -> None:
        super().__init__(message)
        self.job_id = job_id


class SubmitConflict(SqsLeaseError):
    """A job id was submitted again with a different job class or payload."""


class GroupCancelled(SqsLeaseError):
    """A job was submitted to a group (an agent session) that was cancelled.

    ``group_id`` names the group and ``reason`` is the cancel's reason. Submit the
    job without the group, or to a new group, if it should still run."""

    def __init__(self, message: str, group_id: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.group_id = group_id
        self.reason = reason


class JobNotFound(SqsLeaseError):
    """No job record exists for the id."""


class WaitTimedOut(SqsLeaseError, TimeoutError):
    """``Producer.wait`` gave up: the job was not settled within the timeout. The job
    goes on; ``status`` is the last one read (None if no read succeeded)."""

    def __init__(self, message: str, status: JobStatus | None = None) -> None:
        super().__init__(message)
        self.status = status


class RetryRefused(SqsLeaseError):
    """A retry the job's record does not allow (a stage already committed, a job
    cancelled, another stage named); the message names what to do instead."""


class ResourceMissing(SqsLeaseError):
    """A queue or table does not exist (create it with the CLI)."""


class AwsUnavailable(SqsLeaseError):
    """AWS or the emulator did not answer, or credentials are missing."""


class AwsCallFailed(SqsLeaseError):
    """An AWS call failed in a way the calling flow cannot recover from."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class LeaseError(SqsLeaseError):
    """The worker may not (or may no longer) act for the job."""


class LeaseLost(LeaseError):
    """Another claim moved the fencing token on, or the job left `running`."""


class JobCancelled(LeaseLost):
    """The job was cancelled; its owner lost the lease."""


class FenceRefused(LeaseLost):
    """A fenced target refused this owner's token (``412 stale_token``): the call was
    not applied, and a newer owner holds the job. A lease loss that also says "not
    applied", so the journal never tells it as an unknown outcome."""


class OwnershipUnknown(LeaseError):
    """Ownership could not be confirmed recently enough for an irreversible step."""


class AttemptTimedOut(LeaseError):
    """The watchdog stopped the attempt: an effect call ran past its timeout, the
    handler made no progress, or the stage budget is spent. The job was given
    back for a counted retry; nothing this attempt returns is committed."""


class WorkerShuttingDown(LeaseError):
    """The worker is shutting down: stop now. The job goes back to the queue at
    once without spending an attempt; nothing this attempt returns is committed."""


class HandlerSignal(SqsLeaseError):
    """Raised by a handler to tell the worker how the attempt ended."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code or type(self).__name__


class TransientError(HandlerSignal):
    """Retry later with backoff; counts as an attempt."""


class PermanentError(HandlerSignal):
    """Fail the job now; retrying cannot help."""


class ToolOutcomeUnknown(HandlerSignal):
    """An external call timed out: it may have applied. Reconcile, never retry blindly."""


class ToolNotApplied(HandlerSignal):
    """The target certainly did not apply the call: it was never sent, or the target refused it.

    Raise it from an effect's tool only when that is provable: the connection was
    refused, the name did not resolve, your own validation failed before the
    request, or the target answered that it rejected the request. Any other
    exception from a tool means "outcome unknown" and goes to reconciliation. The
    intent reopens; ``retry=True`` (the default) retries the job later with backoff
    (a counted attempt), ``retry=False`` fails it now (the target refuses it for
    good, e.g. HTTP 400 or 422).
    """

    def __init__(self, message: str, code: str = "", *, retry: bool = True) -> None:
        super().__init__(message, code)
        self.retry = retry


class IntentError(SqsLeaseError):
    """A side-effect intent cannot proceed."""


class IntentPayloadMismatch(IntentError):
    """The key exists with another payload hash: a changed intention needs its own key."""


class IntentAmbiguous(IntentError):
    """Whether the effect applied cannot be told; the job is parked for an operator."""


class IntentBusy(IntentError):
    """Another job holds the intent's key (prepared or in progress) and did not finish it
    while this job waited; the job is parked with the holder's id in the reason."""

    def __init__(self, message: str, holder: str = "") -> None:
        super().__init__(message)
        self.holder = holder


class IntentNotFound(IntentError):
    """No intent exists under the key."""


class IntentNotAmbiguous(IntentError):
    """A resolve met an intent that is not ambiguous: nothing to resolve.

    ``final`` says it is settled for good (confirmed or abandoned): the resolve is
    a no-op, not a failure. Otherwise (prepared, in progress) a worker still owns it.
    """

    def __init__(self, message: str, *, state: str, final: bool) -> None:
        super().__init__(message)
        self.state = state
        self.final = final


class FenceError(SqsLeaseError, ValueError):
    """A fence (scope, token, idempotency key, signature) is missing or malformed.

    ``problem`` is ``missing_header``, ``invalid_header`` or
    ``fence_signature_mismatch``; ``header`` names the header; ``status`` is
    the HTTP answer a receiver gives (400, or 403 for a signature that does
    not match).
    """

    def __init__(self, problem: FenceProblem, header: str, message: str) -> None:
        super().__init__(f"{header}: {message}")
        self.problem = problem
        self.header = header
        self.reason = message
        self.status = 403 if problem == "fence_signature_mismatch" else 400
