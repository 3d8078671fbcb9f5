"""Claiming a received job: the fenced claim, admitting a message of a known or
unknown class, and what becomes of an undeliverable one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from .._errors import (
    RecordUnreadable,
)
from .calls import Err, ErrorKind, Flow, Ok, Outcome, call, emit
from .endwrites import EndRequest, fail_flow, poison_flow
from .fencing import delete_message, limit_hint, set_visibility
from .limits import REASON_LIMIT, bounded
from .messages import Delivery, Poison, cap_visibility, message_body, on_queue
from .records import (
    UNDELIVERED_CODE,
    JobRequests,
    JobState,
    JobView,
    attempts_allowed,
)
from .timeline import trim_count

# --------------------------------------------------------------------------- claim


@dataclass(frozen=True)
class Claimed:
    delivery: Delivery
    job: JobView  # the record as it is after the claim
    token: int
    attempt: int
    reclaimed: bool
    previous_owner: str | None
    deadline: float  # local lease deadline (monotonic)
    # The attempt's nonce (its shell drew it): every end write of this attempt carries
    # ``end_write_id(nonce, what)``, by which it recognises its own write exactly.
    nonce: str = ""


class NotClaimedOutcome(StrEnum):
    """Why a delivery was not claimed (``NotClaimed.outcome``; the worker's stat for each
    is ``attempt.NOT_CLAIMED_COUNTS``)."""

    DONE = "done"
    PARKED = "parked"
    MISSING = "missing"
    EXHAUSTED = "exhausted"
    UNKNOWN = "unknown"
    CLASS_MISMATCH = "class_mismatch"
    STRAY = "stray"
    # running under another token, this message its current one (left to the
    # duplicate rule, ``_core/duplicates.py``: defer, or take over with take_from):
    RUNNING = "running"
    # from admit_flow:
    DEFERRED = "deferred"
    UNKNOWN_CLASS = "unknown_class"
    UNREADABLE = "unreadable"
    INVALID = "invalid"


@dataclass(frozen=True)
class NotClaimed:
    delivery: Delivery
    outcome: NotClaimedOutcome
    reason: str
    job: JobView | None = None
    # The message was deleted on the way (a stray, a finished job's copy, poison, an
    # exhausted job failed), and SQS took the delete.
    deleted: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", NotClaimedOutcome(self.outcome))


ClaimResult = Claimed | NotClaimed


def claim_flow(
    req: JobRequests,
    *,
    queue_url: str,
    delivery: Delivery,
    worker_id: str,
    wall_now: float,
    lease_seconds: int,
    max_attempts: int,
    nonce: str,
    dlq_url: str | None = None,
    keep_receive_lease: float | None = None,
    take_from: int | None = None,
) -> Flow[ClaimResult]:
    """Claim the job a message names: token + 1, owner = me; the lease is the receive's.

    Only a ``queued`` record is claimed, or with ``take_from`` one still ``running``
    under that token: a record running under another owner answers ``running``
    (nothing written, the message kept) for the duplicate rule to judge
    (``_core/duplicates.py``).

    The receive's own VisibilityTimeout is the first lease (counted from before the
    receive was sent), so a claim makes no ChangeMessageVisibility when more than
    ``keep_receive_lease`` seconds of it are left once the claim is answered (see
    ``attempt.first_beat_reserve``: the first beat, due ``H`` after the receive or at
    once if the receive granted less than L, has no less reserve than any later
    beat). With less left
    (a message that waited, a receive shorter than the class needs), or with
    ``keep_receive_lease`` None, the claim sets the lease to L now, as before.

    Receiving the message is the right to try; this conditional write is the
    ownership. It lands only for the job's current message (its send id) and the
    record's own job class, so a stray duplicate or a message naming another class
    claims nothing and can never take the job from its live owner. Why a claim
    failed is read from ALL_OLD: a terminal record means the work is done, a stray
    is deleted, a class mismatch is poison (DLQ copy, then deleted).
    """
    d = delivery
    out = yield from call(
        req.claim(
            d.job_id,
            worker_id,
            wall_now,
            lease_seconds,
            job_class=d.job_class,
            send_id=d.send_id,
            take_from=take_from,
        )
    )
    if isinstance(out, Err):
        if out.kind is ErrorKind.CONDITION_FAILED:
            return (yield from _refused_claim(req, queue_url, d, out, dlq_url))
        if out.kind is ErrorKind.VALIDATION:
            # The claim can never apply (a record lacking an attribute the claim
            # updates, a malformed value): permanent for this job, not "unknown".
            return NotClaimed(d, NotClaimedOutcome.INVALID, _refusal("claim", out))
        yield from emit(
            "ownership_unknown",
            job_id=d.job_id,
            stage="claim",
            error_code=out.code or out.kind,
            request_id=out.request_id or None,
        )
        return NotClaimed(
            d, NotClaimedOutcome.UNKNOWN, f"claim not answered: {out.code or out.kind}"
        )
    old = req.parse(out.response.get("Attributes", {}))
    token, attempt = old.token + 1, old.attempt + 1
    job = JobView(
        job_id=old.job_id,
        job_class=old.job_class,
        state=JobState.RUNNING,
        token=token,
        attempt=attempt,
        owner=worker_id,
        payload_hash=old.payload_hash,
        message_sent=True,
        stage=old.stage,
        payload_json=old.payload_json,
        send_id=old.send_id,
        granted_attempts=old.granted_attempts,
        resumed_at_attempt=old.resumed_at_attempt,
        progress_json=old.progress_json,
        group=old.group,
        tenant=old.tenant,
        stage_input=old.stage_input,
        stage_log=old.stage_log,
        late_handbacks=old.late_handbacks,  # timing.late_charged reads it
    )
    reclaimed = old.state is JobState.RUNNING
    allowed = attempts_allowed(old, max_attempts)
    if attempt > allowed:
        granted = f" + {old.granted_attempts} granted" if old.granted_attempts else ""
        reason = f"attempts exhausted ({attempt - 1} of {max_attempts}{granted})"
        end = EndRequest(queue_url, job, d, worker_id, wall_now, nonce)
        failed = yield from fail_flow(req, end, reason=reason, error_code="attempts_exhausted")
        return NotClaimed(d, NotClaimedOutcome.EXHAUSTED, reason, job, failed.deleted)
    # The receive granted d.visibility from d.received_at: the first lease. Only when
    # too little of it is left does a CMV move it to L from now (the heartbeat brings
    # a kept receive lease to L at the class's first beat).
    deadline = d.received_at + d.visibility
    lease_granted = d.visibility
    cmv: Outcome | None = None
    if keep_receive_lease is None or deadline - out.received_at <= keep_receive_lease:
        # Never past the message's 12-hour cap: SQS would refuse the change.
        ask = cap_visibility(d, lease_seconds, wall_now)
        cmv = yield from set_visibility(on_queue(d, queue_url), d.receipt_handle, ask)
        if isinstance(cmv, Ok):
            deadline = cmv.sent_at + ask
            lease_granted = ask
    drop = trim_count(old.timeline_length + 1)
    if drop:
        # Advisory: a trim that fails leaves a longer timeline, nothing else.
        yield from call(req.trim_timeline(d.job_id, token, drop))
    yield from emit(
        "job_claimed",
        job_id=d.job_id,
        job_class=old.job_class,
        token=token,
        attempt=attempt,
        payload_hash=old.payload_hash,
        reclaimed=reclaimed,
        previous_owner=old.owner,
        message_id=d.message_id,
        receive_count=d.receive_count,
        lease_seconds=lease_granted,
        # The claim's write sent to the lease's answer (lease clock): the claim span.
        claim_seconds=round(
            max(0.0, (cmv.received_at if cmv is not None else out.received_at) - out.sent_at), 3
        ),
    )
    if reclaimed:
        yield from emit(
            "job_reclaimed",
            job_id=d.job_id,
            token=token,
            previous_owner=old.owner,
            previous_token=old.token,
        )
    return Claimed(d, job, token, attempt, reclaimed, old.owner, deadline, nonce)


def _refused_claim(
    req: JobRequests, queue_url: str, d: Delivery, out: Err, dlq_url: str | None
) -> Flow[NotClaimed]:
    """The claim's condition failed: ALL_OLD says why, and nothing was claimed."""
    if out.item is None:
        gone = yield from delete_message(on_queue(d, queue_url), d.receipt_handle)
        reason = "no job record for the message"
        yield from emit("message_poisoned", job_id=d.job_id, message_id=d.message_id, reason=reason)
        return NotClaimed(d, NotClaimedOutcome.MISSING, reason, deleted=isinstance(gone, Ok))
    current = req.parse(out.item)
    if current.job_class != d.job_class:
        reason = f"message names job class {d.job_class!r}, record says {current.job_class!r}"
        poison = Poison(d.message_id, d.receipt_handle, reason, d.job_id, d.body, d.queue_url)
        moved = yield from poison_flow(
            req, queue_url=queue_url, poison=poison, dlq_url=dlq_url, body=d.body
        )
        return NotClaimed(d, NotClaimedOutcome.CLASS_MISMATCH, reason, current, moved)
    if current.state.terminal or current.state is JobState.PARKED:
        outcome = (
            NotClaimedOutcome.PARKED if current.state is JobState.PARKED else NotClaimedOutcome.DONE
        )
        gone = yield from delete_message(on_queue(d, queue_url), d.receipt_handle)
        yield from emit(
            "job_already_done" if outcome is NotClaimedOutcome.DONE else "job_parked_skip",
            job_id=d.job_id,
            state=current.state.value,
            token=current.token,
        )
        return NotClaimed(d, outcome, f"job is {current.state}", current, isinstance(gone, Ok))
    if current.state is JobState.RUNNING and _is_current(d, current):
        # The job's current message, delivered again while the job runs (SQS's
        # at-least-once copy, or its owner's lease lapsed): the duplicate rule decides.
        return NotClaimed(
            d, NotClaimedOutcome.RUNNING, f"job runs under token {current.token}", current
        )
    # Queued or running under the same class: the message is not the job's current
    # one (a losing sender's, or one a re-send retired). Its owner keeps the job.
    gone = yield from delete_message(on_queue(d, queue_url), d.receipt_handle)
    reason = (
        f"message send id {d.send_id!r} is not the job's current {current.send_id!r}"
        if d.send_id is not None or current.send_id is not None
        else "message is not the job's current message"
    )
    yield from emit(
        "message_stray",
        job_id=d.job_id,
        message_id=d.message_id,
        send_id=d.send_id,
        current_send_id=current.send_id,
        state=current.state.value,
        token=current.token,
    )
    return NotClaimed(d, NotClaimedOutcome.STRAY, reason, current, isinstance(gone, Ok))


def _is_current(d: Delivery, current: JobView) -> bool:
    """The message is the record's current one, as the claim's condition reads it."""
    if d.send_id is None:
        return current.send_id is None and current.unsent_since is None
    return d.send_id == current.send_id


UNKNOWN_CLASS_RECEIVES = 20
"""Default bound: receives of a message whose job class this worker does not know,
after which it goes to the DLQ with the reason (kept below the redrive's 50)."""

UNKNOWN_CLASS_BACKOFF = (4.0, 300.0)
"""Base and cap (seconds) of the visibility backoff for such a message."""


def defer_delay(receive_count: int, rand: float) -> int:
    """Visibility for a message left for another worker: exponential in its receives,
    half of it jittered, never 0 (an immediate redelivery would reach us again)."""
    base, cap = UNKNOWN_CLASS_BACKOFF
    ceiling = min(cap, base * (2.0 ** min(max(0, receive_count - 1), 30)))
    return max(1, int(ceiling / 2 + ceiling / 2 * rand))


def admit_flow(
    req: JobRequests,
    *,
    queue_url: str,
    dlq_url: str | None,
    delivery: Delivery,
    known_class: bool,
    worker_id: str,
    wall_now: float,
    lease_seconds: int,
    max_attempts: int,
    unknown_class_receives: int = UNKNOWN_CLASS_RECEIVES,
    rand: float = 0.5,
    keep_receive_lease: float | None = None,
    nonce: str,
    take_from: int | None = None,
) -> Flow[ClaimResult]:
    """Decide whether this worker may claim a delivery, and claim it.

    ``nonce`` is the attempt's (drawn by its shell, ``Invoke("write_id")``): its end
    writes carry it (:func:`end_write_id`).

    - A job class this worker does not know (another version of the app, during a
      rolling deploy) is never claimed: a claim would move the token and fence out
      a live owner that knows it. The message is left for a worker that knows it
      (visibility backoff, ``job_class_unknown``); after ``unknown_class_receives``
      receives it goes to the DLQ with the reason, and its job is parked first
      (``undeliverable``: the move ends any lease the message carried), so the record
      shows where the job is and ``jobs resume`` brings it back.
    - A record this version cannot read, or a claim DynamoDB refuses as invalid,
      makes the message poison: journaled with the job id, copied to the DLQ with
      the reason; nothing crashes, and no other job is affected.
    """
    d = delivery
    if not known_class:
        if d.receive_count >= unknown_class_receives:
            given_up = yield from _undeliverable(
                req, queue_url, dlq_url, d, wall_now, unknown_class_receives
            )
            if given_up is not None:
                return given_up
        delay = defer_delay(d.receive_count, rand)
        cmv = yield from set_visibility(on_queue(d, queue_url), d.receipt_handle, delay)
        yield from _class_unknown(
            d, unknown_class_receives, delay=delay, visibility_set=isinstance(cmv, Ok)
        )
        return NotClaimed(
            d, NotClaimedOutcome.DEFERRED, f"job class {d.job_class!r} unknown to this worker"
        )
    try:
        result = yield from claim_flow(
            req,
            queue_url=queue_url,
            delivery=d,
            worker_id=worker_id,
            wall_now=wall_now,
            lease_seconds=lease_seconds,
            max_attempts=max_attempts,
            dlq_url=dlq_url,
            keep_receive_lease=keep_receive_lease,
            nonce=nonce,
            take_from=take_from,
        )
    except RecordUnreadable as exc:
        reason = str(exc)
        yield from emit(
            "job_record_unreadable",
            job_id=d.job_id,
            stage="claim",
            message_id=d.message_id,
            reason=reason,
        )
        moved = yield from _poison_delivery(queue_url, dlq_url, d, reason)
        return NotClaimed(d, NotClaimedOutcome.UNREADABLE, reason, deleted=moved)
    if isinstance(result, NotClaimed) and result.outcome is NotClaimedOutcome.INVALID:
        moved = yield from _poison_delivery(queue_url, dlq_url, d, result.reason)
        return replace(result, deleted=moved)
    return result


def _undeliverable(
    req: JobRequests,
    queue_url: str,
    dlq_url: str | None,
    d: Delivery,
    wall_now: float,
    bound: int,
) -> Flow[NotClaimed | None]:
    """A message of an unknown class reached the bound: park its job, then move it to
    the DLQ. ``None``: the park got no answer, so the message stays (the next receive
    decides again) rather than leave a DLQ copy behind a record that says ``running``.

    Moving the job's current message to the DLQ ends whatever lease it carried (an
    owner's heartbeat can no longer extend it, and nobody would ever receive it
    again), so the record must say where the job is: ``parked`` (token + 1, error code
    ``undeliverable``), with the reason and the way back (``jobs resume`` once a worker
    that knows the class runs). Only the job's current message and the record's own
    class may do it, and only while the job is queued or running.
    """
    why = (
        f"no worker that knows job class {d.job_class!r} took its message in "
        f"{d.receive_count} receives (bound {bound}); the message is in the DLQ"
    )
    record_reason = bounded(
        f"{why}; resume the job (`sqs-lease jobs resume {d.job_id}`) once workers that "
        "know the class run",
        REASON_LIMIT,
    )
    out = yield from call(
        req.park_undelivered(
            d.job_id,
            job_class=d.job_class,
            send_id=d.send_id,
            reason=record_reason,
            wall_now=wall_now,
        )
    )
    parked: JobView | None = None
    if isinstance(out, Ok):
        try:
            old = req.parse(out.response.get("Attributes", {}))
        except RecordUnreadable:
            old = None
        yield from emit(
            "job_parked",
            job_id=d.job_id,
            token=(old.token + 1) if old else None,
            reason=record_reason,
            previous_state=old.state.value if old else None,
            previous_owner=old.owner if old else None,
            undeliverable=True,
        )
        dlq_reason = f"{why}; job parked: resume it once workers that know the class run"
    elif out.kind is ErrorKind.CONDITION_FAILED:
        # Finished, parked already (an earlier park whose DLQ move failed), or the
        # message is not the job's current one: the record needs nothing from us.
        try:
            parked = req.parse(out.item) if out.item is not None else None
        except RecordUnreadable:
            parked = None
        if parked is not None and parked.error_code == UNDELIVERED_CODE:
            dlq_reason = f"{why}; job parked: resume it once workers that know the class run"
        else:
            dlq_reason = f"{why}; redrive it once workers that know the class run"
    else:
        yield from _class_unknown(
            d, bound, moved_to_dlq=False, park_error=out.code or out.kind.value
        )
        return None
    yield from _class_unknown(d, bound, moved_to_dlq=True, record_parked=isinstance(out, Ok))
    moved = yield from _poison_delivery(queue_url, dlq_url, d, dlq_reason)
    return NotClaimed(d, NotClaimedOutcome.UNKNOWN_CLASS, dlq_reason, parked, moved)


def _class_unknown(d: Delivery, bound: int, **fields: Any) -> Flow[None]:
    """Journal a message of a job class this worker does not know (``job_class_unknown``:
    its receives against the bound, then what was done with it)."""
    yield from emit(
        "job_class_unknown",
        job_id=d.job_id,
        job_class=d.job_class,
        receive_count=d.receive_count,
        bound=bound,
        **fields,
    )


def _poison_delivery(queue_url: str, dlq_url: str | None, d: Delivery, reason: str) -> Flow[bool]:
    """``poison_flow`` for a delivery; whether its message was deleted."""
    body = d.body or message_body(d.job_id, d.job_class)
    return (
        yield from poison_flow(
            None,
            queue_url=queue_url,
            poison=Poison(
                d.message_id, d.receipt_handle, bounded(reason), d.job_id, body, d.queue_url
            ),
            dlq_url=dlq_url,
            body=body,
        )
    )


def _refusal(what: str, err: Err) -> str:
    message = f"{err.code or err.kind}: {err.message}"
    return bounded(f"DynamoDB refused the {what}: {message}{limit_hint(message)}")
