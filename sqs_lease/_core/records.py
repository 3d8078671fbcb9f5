"""What the core knows of stored records, and the request builder it is given.

The core never spells a DynamoDB expression: :class:`JobRequests` (implemented by
``sqs_lease._schema`` from the pynamodb models) does. The core decides when to send
which request and what its answer means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict, Unpack

from .calls import Call
from .liveness import Liveness

if TYPE_CHECKING:
    from .status import JobStatus

UNDELIVERED_CODE = "undeliverable"
"""``error_code`` of a job parked because its message went to the DLQ: no worker
that knows its class took it within the bound."""


DEAD_LETTERED_CODE = "dead_lettered"
"""``error_code`` of a job parked because SQS moved its current message to the DLQ
(its receives reached the queue's ``maxReceiveCount``): found by a DLQ reconciliation."""


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PARKED = "parked"
    CANCELLED = "cancelled"  # an operator's cancel, or its session's: an outcome of its own

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
"""The states a job never leaves by itself (an operator's retry or resume aside)."""


DEFAULT_STAGE = "main"
"""The stage of a job that has no stages of its own (its record has no ``stage``)."""


@dataclass(frozen=True)
class JobView:
    """A job record as the core reads it."""

    job_id: str
    job_class: str
    state: JobState
    token: int
    attempt: int
    owner: str | None
    payload_hash: str
    message_sent: bool = True
    reason: str | None = None
    error_code: str | None = None
    stage: str | None = None
    payload_json: str | None = None  # present when the full item was read
    send_id: str | None = None  # the job's current message (None: an older record)
    unsent_since: float | None = None  # wall time; set while no message is known sent
    granted_attempts: int = 0  # attempts an operator granted beyond max_attempts
    # The attempt count when an operator last resumed the job (None: never resumed):
    # the attempt a resume starts is always allowed (:func:`attempts_allowed`).
    resumed_at_attempt: int | None = None
    group: str | None = None  # the agent session (or run) the producer put it in
    timeline_length: int = 0  # events on the record's timeline (where the item was read)
    progress_json: str | None = None  # the last owner's saved progress details (JSON)
    tenant: str | None = None  # whose job it is (a user, an account): its own limit
    stage_input: str | None = None  # JSON input of the current stage (None: the job payload)
    stage_log: str | None = None  # JSON list of the committed stages' checkpoints
    priority: str | None = None  # "interactive": submitted to the interactive queue
    # The id of the end write that last took the record out of ``running`` (commit,
    # fail, retry, park, release, stage checkpoint): ``<attempt nonce>:<what>``. The
    # nonce is the attempt's own (drawn by its shell, never on the record before its
    # end write), so a retried end write recognises its own earlier write exactly.
    write_id: str | None = None
    late_handbacks: int = 0  # late hand-backs of the current stage (timing.late_charged)

    @property
    def stage_name(self) -> str:
        """The stage this attempt runs (:data:`DEFAULT_STAGE` for a job without stages)."""
        return self.stage or DEFAULT_STAGE


CANCELLED_CODE = "cancelled"
"""``error_code`` of a job a cancel ended: state ``cancelled`` (versions before the
state wrote ``failed`` with this code); :func:`is_cancelled` is the one test of it."""


def attempts_allowed(job: JobView, max_attempts: int) -> int:
    """The attempts a job may start: its class's ``max_attempts`` and the attempts an
    operator granted. A resume grants the attempt it starts whatever the count: claims
    that landed unanswered counted attempts that never ran, so the count at the resume
    may already be past the grants, and the first claim after it must not fail the job
    (soak seed 1113879). The one rule for the claim, the retry and the tally."""
    allowed = max_attempts + job.granted_attempts
    if job.resumed_at_attempt is not None:
        allowed = max(allowed, job.resumed_at_attempt + 1)
    return allowed


class Ended(Protocol):
    """What :func:`is_cancelled` reads: a job's view, or its caller's status."""

    @property
    def state(self) -> JobState: ...

    @property
    def error_code(self) -> str | None: ...


def is_cancelled(job: Ended) -> bool:
    """Whether a cancel ended the job: its owner loses the lease as cancelled, not lost
    (and its caller reads ``JobStatus.cancelled``)."""
    if job.state is JobState.CANCELLED:
        return True
    # A record an earlier version cancelled: ``failed``, with the cancel's code.
    return job.state is JobState.FAILED and job.error_code == CANCELLED_CODE


def awaits_send(job: JobView) -> bool:
    """Whether the record waits for its message: queued, its current message not
    known sent. Such a record, and only such a record, is in the ``unsent`` index
    (the stranded sweep's): every write that sends, claims or ends a record takes it
    out, every write that gives it a new unsent message puts it in
    (``_schema/job_requests.py`` spells both once)."""
    return job.state is JobState.QUEUED and not job.message_sent


class NewJob(TypedDict):
    """A new job record (``put_new``, ``put_new_item``): queued, its message unsent."""

    job_id: str
    job_class: str
    payload_json: str
    payload_hash: str
    wall_now: float
    send_id: str
    stage: NotRequired[str | None]
    tenant: NotRequired[str | None]
    priority: NotRequired[str | None]


class UnheldPark(TypedDict):
    """A park of a job no owner holds (``park_undelivered``, ``park_dead_lettered``):
    only while the record is queued or running with this class and current message."""

    job_class: str
    send_id: str | None
    reason: str
    wall_now: float


class JobRequests(Protocol):
    """Builds DynamoDB calls for the job table and parses its items."""

    def put_new(self, **job: Unpack[NewJob]) -> Call: ...

    def put_new_item(self, *, group: str, **job: Unpack[NewJob]) -> Mapping[str, Any]:
        """The same new record, in ``group``, as a TransactWriteItems entry."""
        ...

    def group_query(self, group: str, start: Mapping[str, Any] | None) -> Call: ...

    def mark_sent(self, job_id: str, send_id: str, wall_now: float) -> Call: ...

    def take_send(
        self,
        job_id: str,
        *,
        seen_send_id: str | None,
        new_send_id: str,
        wall_now: float,
        read_back: bool = True,
        retire: bool = False,
    ) -> Call:
        """Take the right to send (the record queued without a sent message, its send
        id the one seen). ``read_back``: the record comes back (ALL_NEW); submit asks
        for nothing back, so a producer role needs no read of the record. ``retire``:
        the seen message was received and not started, sent or not (a record a Lambda
        invocation did not start waits as a fresh message: ``slots.unstarted_wait_flow``);
        the record queued under the seen send id is the whole condition."""
        ...

    def release_send(self, job_id: str, send_id: str, wall_now: float) -> Call: ...

    def claim(
        self,
        job_id: str,
        worker_id: str,
        wall_now: float,
        lease_seconds: int,
        *,
        job_class: str,
        send_id: str | None,
        take_from: int | None = None,
    ) -> Call:
        """Claim a ``queued`` record; with ``take_from``, also one still ``running``
        under that token (a take-over from an owner judged dead)."""
        ...

    def unsent_query(self, *, limit: int, start: Mapping[str, Any] | None = None) -> Call:
        """One page of the ``unsent`` index, oldest stamp first, from ``start`` (a
        page's ``LastEvaluatedKey``)."""
        ...

    def unsent_ahead_query(self, *, newer_than: float, limit: int) -> Call:
        """The ``unsent`` index's entries stamped after ``newer_than`` (wall), oldest
        first: what a clock ahead of the caller's wrote."""
        ...

    def restamp_unsent(
        self, job_id: str, *, seen_send_id: str | None, seen_since: float, wall_now: float
    ) -> Call:
        """Stamp a waiting record's ``unsent_since`` with ``wall_now`` if its send id and
        stamp are still the ones seen (:func:`~sqs_lease._core.sweeping.sweep_flow`)."""
        ...

    def leave_unsent(self, job_id: str, wall_now: float) -> Call:
        """Take a record out of the ``unsent`` index unless it waits for its message
        (:func:`awaits_send`): an entry a write of an older version left behind."""
        ...

    # The end writes of an attempt (fenced on its token) each carry ``write_id``
    # (:attr:`JobView.write_id`), set in the same conditional update.

    def commit(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        result_json: str,
        wall_now: float,
        *,
        write_id: str,
    ) -> Call: ...

    def advance_stage(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        *,
        stage: str,
        next_stage: str,
        stage_input: str,
        stage_log: str,
        send_id: str,
        wall_now: float,
        write_id: str,
    ) -> Call:
        """A stage's checkpoint, fenced like a commit: the stage log gains the ending
        ``stage``, the record moves to ``next_stage`` (queued, attempt 0, its input) and
        names ``send_id`` as its one unsent message (found by the stranded sweep); the
        timeline gains a ``stage_done`` event in the same write."""
        ...

    def end_in_error(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        reason: str,
        error_code: str,
        wall_now: float,
        *,
        write_id: str,
        retry: bool,
    ) -> Call:
        """An attempt that ended in an error, with its reason and code, fenced like a
        commit: ``failed`` for good, or with ``retry`` back to ``queued``."""
        ...

    def release(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        reason: str,
        wall_now: float,
        *,
        write_id: str,
        resend_id: str | None = None,
        late: bool = False,
        charged: bool = False,
    ) -> Call:
        """Fenced: back to queued, the claim's attempt given back (kept when
        ``charged``); ``late``: a late hand-back, counted on the record. ``resend_id``: the
        job's next message is a fresh one under this send id (the received one is
        retired; the record is unsent until that message is out)."""
        ...

    def park(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        reason: str,
        wall_now: float,
        *,
        write_id: str,
    ) -> Call: ...

    def resend(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        *,
        send_id: str,
        reason: str,
        wall_now: float,
        write_id: str,
    ) -> Call:
        """The job goes on under a new message, fenced like a release: back to queued at
        its stage, the attempt the claim counted given back, ``send_id`` its one unsent
        message (the stranded sweep sends it should this sender not)."""
        ...

    def keep_rejected(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        result_json: str,
        wall_now: float,
        *,
        keep_content: bool,
    ) -> Call:
        """Record a result whose commit was rejected (for people; no decision reads it)."""
        ...

    def park_undelivered(self, job_id: str, **park: Unpack[UnheldPark]) -> Call: ...

    def park_dead_lettered(self, job_id: str, **park: Unpack[UnheldPark]) -> Call:
        """Park a job whose current message (``send_id``) is in the DLQ: only while it is
        queued or running with that send and class; the token moves on (ALL_OLD back)."""
        ...

    def save_progress(self, job_id: str, token: int, details_json: str, wall_now: float) -> Call:
        """Keep a handler's progress details on the record (fenced on the token)."""
        ...

    def trim_timeline(self, job_id: str, token: int, drop: int) -> Call:
        """Drop the ``drop`` oldest timeline events (fenced on the token)."""
        ...

    def liveness(self, part: Liveness) -> Call:
        """Write one part of a worker's liveness record (unconditional; advisory)."""
        ...

    def cancel(self, job_id: str, reason: str, wall_now: float) -> Call: ...

    def unpark(self, job_id: str, send_id: str, wall_now: float) -> Call: ...

    def retry_failed(
        self, job_id: str, token: int, send_id: str, wall_now: float, detail: str
    ) -> Call:
        """An operator's retry of a failed job: failed -> queued (on condition of the
        state and the token the operator read) at its current stage with a fresh
        count of attempts, ``send_id`` its one unsent message; its stage log, its
        stage's input and its intents are kept."""
        ...

    def unpark_item(self, job_id: str, send_id: str, wall_now: float) -> Mapping[str, Any]: ...

    def fence_check(self, job_id: str, token: int) -> Mapping[str, Any]: ...

    def get(self, job_id: str) -> Call: ...

    def batch_get(self, job_ids: Sequence[str]) -> Call: ...

    def batch_get_retry(self, unprocessed: Mapping[str, Any]) -> Call: ...

    def batch_items(self, response: Mapping[str, Any]) -> list[Mapping[str, Any]]: ...

    def parse(self, item: Mapping[str, Any]) -> JobView: ...

    def parse_status(self, item: Mapping[str, Any]) -> JobStatus:
        """The item as its caller's status (``status.JobStatus``: the result decoded)."""
        ...


@dataclass(frozen=True)
class GroupView:
    """A group's marker record: how many job records it holds, and its cancel."""

    group: str
    jobs: int
    cancelled_at: float | None = None
    reason: str | None = None


class GroupRequests(Protocol):
    """Builds DynamoDB calls for the group table (one marker record per group)."""

    def count_job(self, group: str, wall_now: float) -> Mapping[str, Any]:
        """A TransactWriteItems entry: one more job in the group, only while the group
        is not cancelled (so a submit and a cancel are ordered by DynamoDB)."""
        ...

    def cancel(self, group: str, reason: str, wall_now: float) -> Call: ...

    def get(self, group: str) -> Call:
        """Read the group's marker (strongly consistent: a cancel that returned is seen)."""
        ...

    def parse(self, item: Mapping[str, Any]) -> GroupView: ...
