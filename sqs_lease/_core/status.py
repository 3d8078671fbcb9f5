"""A caller's read of its job: the status, and the wait for the job to settle.

``Producer.status`` / ``Producer.wait`` (and their async twins) run these flows; the
record is read consistently (``JobRequests.get``), so a status never shows less than a
write that already returned. The wait polls with a growing pause: each poll is one
GetItem, billed by DynamoDB on the whole record (one read unit per 4 KB, strongly
consistent), so its cost is the polls a wait makes (:func:`poll_pauses`), never
a stream or an index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .calls import Err, ErrorKind, Flow, Sleep, ask, call
from .inputs import loads
from .messages import fail_call
from .records import JobRequests, JobState, is_cancelled

M = TypeVar("M", covariant=True)


class Validator(Protocol[M]):
    """What :meth:`JobStatus.result_as` takes: a pydantic model class (the core does
    not import pydantic; anything with ``model_validate`` will do)."""

    def model_validate(self, obj: Any, /) -> M: ...


FIRST_POLL = 0.2
"""Seconds before a wait's second read (a short job is often done by then)."""

POLL_GROWTH = 1.5
"""Each pause of a wait is this much longer than the one before ..."""

MAX_POLL = 5.0
"""... up to this many seconds (``max_poll``): 12 reads a minute once it is reached."""

JITTER = 0.2
"""A pause is drawn in ``[p * (1 - JITTER), p]``: waiters started together (a batch
submitted at once) spread their reads instead of polling in step."""


@dataclass(frozen=True)
class JobStatus:
    """A job as its record says now, for the code that submitted it.

    ``state`` is one of ``queued``, ``running``, ``succeeded``, ``failed``, ``parked``;
    a cancelled job is ``failed`` with :attr:`cancelled` true. ``result`` is the
    handler's result (JSON, decoded) once the job succeeded, else None. Times are
    epoch seconds as the writers' clocks stamped them (``finished_at``: None until the
    job succeeded or failed)."""

    job_id: str
    job_class: str
    state: JobState
    stage: str | None
    attempt: int
    token: int
    result: Any
    reason: str | None
    error_code: str | None
    created_at: float | None
    updated_at: float | None
    finished_at: float | None
    group: str | None = None
    tenant: str | None = None

    @property
    def finished(self) -> bool:
        """Succeeded or failed (cancelled included): the record will not change again
        unless an operator retries it."""
        return self.state.terminal

    @property
    def cancelled(self) -> bool:
        """Ended by a cancel (the job's own, or its group's)."""
        return is_cancelled(self)

    @property
    def parked(self) -> bool:
        """Stopped for an operator (an effect whose outcome nobody can tell, a message
        the DLQ took): it goes on only after ``sqs-lease intents resolve`` or ``jobs
        resume`` (docs/operations.md)."""
        return self.state is JobState.PARKED

    @property
    def settled(self) -> bool:
        """Nothing more happens without a person: finished, or parked."""
        return self.finished or self.parked

    def result_as(self, model: Validator[M]) -> M:
        """The result validated as ``model`` (pydantic's ``ValidationError`` if it is
        not one); ``ValueError`` when the job has no result (it did not succeed)."""
        if self.state is not JobState.SUCCEEDED:
            raise ValueError(
                f"job {self.job_id!r} is {self.state.value}, not succeeded: it has no result"
                + (f" ({self.error_code}: {self.reason})" if self.reason else "")
            )
        return model.model_validate(self.result)


def decode_result(text: str | None) -> Any:
    """A stored result's JSON, decoded (None for none)."""
    return None if text is None else loads(text)


def poll_pauses(
    first: float = FIRST_POLL, growth: float = POLL_GROWTH, most: float = MAX_POLL
) -> Iterator[float]:
    """The pauses between a wait's reads, before jitter: 0.2, 0.3, 0.45, ... up to
    ``most`` seconds, then ``most`` for ever (the caller's timeout bounds them)."""
    pause = first
    while True:
        yield min(pause, most)
        pause *= growth


def _read(req: JobRequests, job_id: str) -> Flow[JobStatus | Err]:
    """One consistent read: the status, or the failed call (``JobNotFound`` without a
    record; a missing table is ``ResourceMissing``: waiting cannot mend it)."""
    from .._errors import JobNotFound

    out = yield from call(req.get(job_id))
    if isinstance(out, Err):
        if out.kind is ErrorKind.NOT_FOUND:
            raise fail_call(f"read job {job_id!r}", out)
        return out
    item: Mapping[str, Any] | None = out.response.get("Item")
    if not item:
        raise JobNotFound(
            f"no job {job_id!r} in this jobs table: check the id, and the region, "
            "endpoint and table the settings name"
        )
    return req.parse_status(item)


def status_flow(req: JobRequests, job_id: str) -> Flow[JobStatus]:
    """The job's status from a consistent read; ``JobNotFound`` without a record,
    ``AwsCallFailed`` when the read failed."""
    got = yield from _read(req, job_id)
    if isinstance(got, Err):
        raise fail_call(f"read job {job_id!r}", got)
    return got


def wait_flow(
    req: JobRequests,
    job_id: str,
    *,
    timeout: float,
    clock: Callable[[], float],
    jitter: Callable[[], float],
    max_poll: float = MAX_POLL,
) -> Flow[JobStatus]:
    """Read the job until it is settled (succeeded, failed or parked) and return that
    status; ``WaitTimedOut`` (with the last status read, if any) after ``timeout``
    seconds of ``clock``. A read that fails (throttled, no answer) is one poll lost,
    not the wait's end. ``jitter`` returns a fraction in [0, 1) (the shell's randomness)."""
    from .._errors import WaitTimedOut

    if not timeout >= 0:
        raise ValueError(f"timeout={timeout!r}: give the seconds to wait, 0 or more")
    if not max_poll > 0:
        raise ValueError(f"max_poll={max_poll!r}: give the longest pause in seconds, over 0")
    start = yield from ask("clock", clock)
    deadline = start + timeout
    last: JobStatus | None = None
    failed: Err | None = None
    for pause in poll_pauses(most=max_poll):
        got = yield from _read(req, job_id)
        if isinstance(got, Err):
            failed = got
        else:
            last, failed = got, None
            if got.settled:
                return got
        now = yield from ask("clock", clock)
        left = deadline - now
        if left <= 0:
            state = f"still {last.state.value}" if last is not None else "unread"
            why = f" (the last read failed: {failed.code or failed.kind})" if failed else ""
            raise WaitTimedOut(
                f"job {job_id!r} is {state} after {timeout:g} s{why}: raise the timeout, "
                "or read it later with status()",
                status=last,
            )
        spread = yield from ask("jitter", jitter)
        yield from call(Sleep(min(left, pause * (1.0 - JITTER * float(spread)))))
    raise AssertionError("unreachable: poll_pauses never ends")  # pragma: no cover


__all__ = [
    "FIRST_POLL",
    "JITTER",
    "MAX_POLL",
    "POLL_GROWTH",
    "JobStatus",
    "decode_result",
    "poll_pauses",
    "status_flow",
    "wait_flow",
]
