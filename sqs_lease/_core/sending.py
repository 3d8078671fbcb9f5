"""Submitting a job and sending its message: one send id per message, the fenced
take-over of an unsent send, grouped submits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .._errors import (
    ConfigError,
    GroupCancelled,
    RecordUnreadable,
    SubmitConflict,
)
from . import inputs
from .calls import Call, Err, ErrorKind, Flow, Ok, Outcome, Sleep, call, emit
from .fifo import (
    deduplication_id,
    fifo_params,
    is_fifo,
    message_group_id,
    session_order_problem,
)
from .limits import bounded
from .messages import UNSENT_GRACE_SECONDS, fail_call, message_body
from .records import (
    GroupRequests,
    JobRequests,
    JobState,
    JobView,
    NewJob,
)

# --------------------------------------------------------------------------- submit


@dataclass(frozen=True)
class SubmitResult:
    """What a submission did. ``message_id`` is set only when this call sent a message."""

    job_id: str
    created: bool
    message_id: str | None
    note: str
    send_id: str | None = None  # the send this call made (None: it sent nothing)


class SendVerdict(StrEnum):
    """How sending a job's current message went (see :class:`SendOutcome`)."""

    SENT = "sent"
    SUPERSEDED = "superseded"
    FAILED = "failed"


@dataclass(frozen=True)
class SendOutcome:
    """How sending the job's current message went.

    ``sent``: out and recorded; ``superseded``: out, but another sender took the
    right over meanwhile (this message will be discarded as a stray); ``failed``:
    not sent, and the right to send was given back.
    """

    verdict: SendVerdict
    message_id: str | None = None
    error: Err | None = None


def send_job_message(
    req: JobRequests,
    *,
    queue_url: str,
    job_id: str,
    job_class: str,
    send_id: str,
    wall_now: float,
    stage: str | None = None,
    delay_seconds: int = 0,
    group: str | None = None,
) -> Flow[SendOutcome]:
    """Send the message of a send this caller won (``send_id`` is in the record),
    then record it sent. Shared by submit, resume, resolve and the stranded sweep.

    To a FIFO queue the message goes in the job's ``group`` (else its own id),
    deduplicated per job and per send (``_core.fifo`` says why)."""
    params: dict[str, Any] = {
        "QueueUrl": queue_url,
        "MessageBody": message_body(job_id, job_class, stage, send_id),
        **fifo_params(
            queue_url,
            group_id=message_group_id(job_id, group),
            dedup_id=deduplication_id(job_id, send_id),
        ),
    }
    if delay_seconds:
        params["DelaySeconds"] = delay_seconds
    sent = yield from call(Call("sqs", "SendMessage", params))
    if isinstance(sent, Err):
        # Whether or not it got out, give the right back now: the next resume or
        # resubmission takes it at once, and a message that did get out is a stray.
        released = yield from call(req.release_send(job_id, send_id, wall_now))
        yield from emit(
            "job_send_failed",
            job_id=job_id,
            send_id=send_id,
            error_code=sent.code or sent.kind.value,
            released=isinstance(released, Ok),
        )
        return SendOutcome(SendVerdict.FAILED, None, sent)
    message_id = str(sent.response.get("MessageId", ""))
    marked = yield from call(req.mark_sent(job_id, send_id, wall_now))
    if isinstance(marked, Err) and marked.kind is ErrorKind.CONDITION_FAILED:
        # Another sender (or an outside writer) moved the record: the message is out
        # and will be a stray. The record is read for the journal only, so one this
        # version cannot read is reported, never a crash of the flow that sent.
        current: JobView | None = None
        try:
            current = req.parse(marked.item) if marked.item else None
        except RecordUnreadable as exc:
            yield from emit("job_record_unreadable", job_id=job_id, stage="send", reason=str(exc))
        yield from emit(
            "job_send_superseded",
            job_id=job_id,
            send_id=send_id,
            current_send_id=current.send_id if current else None,
            message_id=message_id,
        )
        return SendOutcome(SendVerdict.SUPERSEDED, message_id)
    if isinstance(marked, Err):
        # The message is out; a record still marked unsent is at worst re-sent by
        # the stranded sweep after its grace, and this message is then a stray.
        yield from emit("job_submit_flag_unset", job_id=job_id, error_code=marked.code)
    return SendOutcome(SendVerdict.SENT, message_id)


def send_record_message(
    req: JobRequests,
    job: JobView,
    *,
    queue_url: str,
    send_id: str,
    wall_now: float,
    delay_seconds: int = 0,
) -> Flow[SendOutcome]:
    """Send the message of a send this caller took over (resume, retry, resolve, the
    sweep, a resubmission): built from the record ``job`` as read with the take,
    never from what the caller knows of the job. Its stage is the record's current
    one (a resubmission during a staged job's unsent continuation names the next
    stage, not the first: the worker checks the input with that stage's model), its
    class and group the record's. The take is conditioned on the send id read with
    ``job``, and a stage only changes with a new send id, so that read is current."""
    return send_job_message(
        req,
        queue_url=queue_url,
        job_id=job.job_id,
        job_class=job.job_class,
        send_id=send_id,
        wall_now=wall_now,
        stage=job.stage,
        delay_seconds=delay_seconds,
        group=job.group,
    )


def submit_flow(
    req: JobRequests,
    *,
    queue_url: str,
    job_id: str,
    job_class: str,
    payload_json: str,
    payload_hash: str,
    wall_now: float,
    send_id: str,
    delay_seconds: int = 0,
    resend_after: float = UNSENT_GRACE_SECONDS,
    group: str | None = None,
    groups: GroupRequests | None = None,
    tenant: str | None = None,
    stage: str | None = None,
    priority: str | None = None,
    stages: int = 1,
    interleave_stages: bool = False,
) -> Flow[SubmitResult]:
    """Write the job record (condition: new) with this submission's send id, then
    send its message.

    ``stages``: how many stages the job can take (its class's, as the producer's app
    knows them; 1 when unknown). A job of several stages in a FIFO group is refused
    unless ``interleave_stages`` (:func:`~sqs_lease._core.fifo.session_order_problem`).

    With a ``group`` (an agent session, set by the producer) the record is written
    in one transaction with the group's marker (``groups.count_job``: one more job,
    only while the group is not cancelled); a cancelled group raises
    :class:`GroupCancelled` and nothing is written.

    "The message is sent" is one decision: the send id in the record names the one
    sender allowed to send, and a message carrying any other id is a stray that no
    claim accepts. A resubmission finding the record without a sent message leaves
    it to the sender named there while that send is younger than ``resend_after``
    (and says so); past it, or when that sender gave the right back, it takes the
    right over with a conditional write and sends under its own id.
    """
    # The rule every worker reads a message by: an id it would refuse is never stored
    # (a reserved one, ``worker#...``, would be replaced by that worker's liveness item).
    if (why := inputs.job_id_problem(job_id)) is not None:
        raise ConfigError(
            f"job_id={bounded(repr(job_id), 120)}: {why}; derive it from the source event's own id"
        )
    if delay_seconds and is_fifo(queue_url):
        raise ConfigError(
            f"delay_seconds={delay_seconds}: a FIFO queue ({queue_url}) takes no delay per "
            "message (only a queue-wide DelaySeconds); submit without a delay"
        )
    order = session_order_problem(
        queue_url, group=group, stages=stages, interleave=interleave_stages
    )
    if order is not None:
        raise ConfigError(order)
    record = NewJob(
        job_id=job_id,
        job_class=job_class,
        payload_json=payload_json,
        payload_hash=payload_hash,
        wall_now=wall_now,
        send_id=send_id,
        tenant=tenant,
        stage=stage,
        priority=priority,
    )
    out: Outcome
    if group is None:
        out = yield from call(req.put_new(**record))
    else:
        if groups is None:  # pragma: no cover - the producer always passes both
            raise ValueError("submit_flow: a group needs its GroupRequests")
        entries = [groups.count_job(group, wall_now), req.put_new_item(**record, group=group)]
        txn = yield from call(Call("dynamodb", "TransactWriteItems", {"TransactItems": entries}))
        for pause in GROUP_SUBMIT_PAUSES:
            # Submits to one session meet on its marker: a conflicting transaction
            # cancels the whole write (nothing applied), so try again a little later.
            if not _transient_txn(txn):
                break
            yield Sleep(pause)
            txn = yield from call(
                Call("dynamodb", "TransactWriteItems", {"TransactItems": entries})
            )
        out = _grouped_put(job_id, group, groups, txn)
    created = True
    if isinstance(out, Err):
        if out.kind is not ErrorKind.CONDITION_FAILED or out.item is None:
            raise fail_call(f"submit {job_id}: put job record", out)
        existing = req.parse(out.item)
        if existing.job_class != job_class or not (
            existing.payload_hash == payload_hash
            or inputs.same_payload(existing.payload_json or "", payload_json)
        ):
            raise SubmitConflict(
                f"job {job_id!r} exists with job class {existing.job_class!r} and payload hash "
                f"{existing.payload_hash[:12]}; this submission has {job_class!r} / "
                f"{payload_hash[:12]}: use a new job id for a new intention"
            )
        if existing.group != group:
            raise SubmitConflict(
                f"job {job_id!r} exists in group {existing.group!r}; this submission names "
                f"group {group!r}: use a new job id for a job of another session"
            )
        if existing.send_id == send_id and not existing.message_sent:
            pass  # our own put, retried after its answer was lost: send now
        else:
            taken = yield from _take_send(
                req, existing, send_id=send_id, wall_now=wall_now, resend_after=resend_after
            )
            if isinstance(taken, SubmitResult):
                return taken
            created = False
    if created:
        sent = yield from send_job_message(
            req,
            queue_url=queue_url,
            job_id=job_id,
            job_class=job_class,
            send_id=send_id,
            wall_now=wall_now,
            stage=stage,
            delay_seconds=delay_seconds,
            group=group,
        )
    else:
        # A send taken over: the record may have moved on from what this submit
        # wrote (a staged job's continuation), and its message says where it is.
        sent = yield from send_record_message(
            req,
            existing,
            queue_url=queue_url,
            send_id=send_id,
            wall_now=wall_now,
            delay_seconds=delay_seconds,
        )
    if sent.verdict is SendVerdict.FAILED:
        assert sent.error is not None
        raise fail_call(
            f"submit {job_id}: send message (the record is kept without a message: submit "
            f"again to send it, or a worker's stranded sweep sends it after "
            f"{resend_after:g} s)",
            sent.error,
        )
    yield from emit(
        "job_submitted",
        job_id=job_id,
        job_class=job_class,
        payload_hash=payload_hash,
        message_id=sent.message_id,
        send_id=send_id,
        resent=not created,
    )
    if sent.verdict is SendVerdict.SUPERSEDED:
        note = (
            "message sent, but another submission took the send over meanwhile: its "
            "message is the job's, this one will be discarded as a stray"
        )
    else:
        note = "submitted" if created else "record existed without a message: message sent"
    return SubmitResult(job_id, created, sent.message_id, note, send_id)


GROUP_SUBMIT_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8)
"""Pauses before retrying a grouped submit whose transaction was cancelled for a
transient reason (a concurrent submit to the same group, throttling)."""


def _transient_txn(out: Outcome) -> bool:
    if not isinstance(out, Err) or out.kind is not ErrorKind.TRANSACTION_CANCELLED:
        return False
    codes = [str(r.get("Code") or "None") for r in out.reasons]
    return "ConditionalCheckFailed" not in codes and any(c != "None" for c in codes)


def _failed_condition(reason: Mapping[str, Any]) -> bool:
    return str(reason.get("Code") or "") == "ConditionalCheckFailed"


def _grouped_put(job_id: str, group: str, groups: GroupRequests, out: Outcome) -> Outcome:
    """What the submit's transaction (group marker, new record) means, in the shape
    of a plain put: Ok, a failed condition carrying the existing record, or another
    error. A cancelled group refuses the submit, whether the record exists or not."""
    if isinstance(out, Ok) or out.kind is not ErrorKind.TRANSACTION_CANCELLED:
        return out
    reasons = list(out.reasons)
    if reasons and _failed_condition(reasons[0]):
        marker = groups.parse(reasons[0].get("Item") or {})
        why = marker.reason or "no reason given"
        raise GroupCancelled(
            f"job {job_id!r}: group {group!r} was cancelled ({why}); a cancelled session takes "
            "no new jobs: submit it without the group or to a new group if it should still run",
            group,
            why,
        )
    if len(reasons) > 1 and _failed_condition(reasons[1]):
        return Err(
            ErrorKind.CONDITION_FAILED, out.code, message=out.message, item=reasons[1].get("Item")
        )
    return out


def _own_unsent_take(now: JobView, send_id: str) -> bool:
    """A refused take-over whose record names ``send_id`` (unique to the caller) and
    has no message yet: the caller's earlier try applied."""
    return now.send_id == send_id and now.state is JobState.QUEUED and not now.message_sent


def _take_send(
    req: JobRequests, existing: JobView, *, send_id: str, wall_now: float, resend_after: float
) -> Flow[SubmitResult | None]:
    """A resubmission met an existing record: say what is there, or win the right to
    send (returns None: the caller sends under ``send_id``)."""
    job_id = existing.job_id
    if existing.message_sent or existing.state is not JobState.QUEUED:
        yield from emit(
            "job_submit_duplicate", job_id=job_id, state=existing.state.value, message="sent"
        )
        return SubmitResult(job_id, False, None, f"already submitted (state {existing.state})")
    age = wall_now - existing.unsent_since if existing.unsent_since is not None else None
    if existing.send_id is not None and age is not None and age < resend_after:
        yield from emit(
            "job_submit_duplicate",
            job_id=job_id,
            state=existing.state.value,
            message="pending",
            send_id=existing.send_id,
        )
        return SubmitResult(
            job_id,
            False,
            None,
            f"already submitted: another submission is sending its message (since "
            f"{max(age, 0.0):.1f} s); nothing sent twice. Should that sender have failed, a "
            f"worker's stranded sweep sends it after {resend_after:g} s "
            "(or `sqs-lease jobs repair`)",
        )
    took = yield from call(
        # Nothing read back: a producer role is granted no read of job records.
        req.take_send(
            job_id,
            seen_send_id=existing.send_id,
            new_send_id=send_id,
            wall_now=wall_now,
            read_back=False,
        )
    )
    if (
        isinstance(took, Err)
        and took.kind is ErrorKind.CONDITION_FAILED
        and took.item is not None
        and _own_unsent_take(req.parse(took.item), send_id)
    ):
        # Our own take-over, retried after its answer was lost (the SDK's second
        # try): the record names this call's send id, so the send is ours to make.
        took = Ok({}, took.sent_at, took.received_at)
    if isinstance(took, Ok):
        yield from emit(
            "job_send_taken",
            job_id=job_id,
            send_id=send_id,
            previous_send_id=existing.send_id,
            unsent_for=None if age is None else round(age, 3),
            by="submit",
        )
        return None
    if took.kind is ErrorKind.CONDITION_FAILED and took.item is not None:
        now = req.parse(took.item)
        yield from emit(
            "job_submit_duplicate", job_id=job_id, state=now.state.value, message="taken"
        )
        return SubmitResult(
            job_id,
            False,
            None,
            f"already submitted: another sender took the send over just now (state {now.state})",
        )
    raise fail_call(f"submit {job_id}: take over the send", took)
