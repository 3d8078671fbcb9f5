"""The protocol steps, each written once as a flow (see DESIGN.md section 4).

A flow yields :class:`Call`/:class:`Sleep`/:class:`Emit` and receives outcomes; it
returns a result value. Drivers execute; flows decide.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal, TypeVar

from .._errors import (
    AwsCallFailed,
    ConfigError,
    GroupCancelled,
    JobNotFound,
    RecordUnreadable,
    ResourceMissing,
    SqsLeaseError,
    SubmitConflict,
)
from . import inputs
from .calls import Call, Emit, Err, ErrorKind, Flow, Ok, Outcome, Sleep, call, emit, sqs_code_is
from .fifo import (
    copy_deduplication_id,
    deduplication_id,
    fifo_params,
    is_fifo,
    message_group_id,
    session_order_problem,
)
from .lease import OPEN, Action, Drop, LeaseEvent, LocalLease
from .limits import REASON_LIMIT, bounded, result_problem
from .records import (
    UNDELIVERED_CODE,
    GroupRequests,
    JobRequests,
    JobState,
    JobView,
    awaits_send,
    is_cancelled,
)
from .timeline import trim_count

SQS_BATCH = 10
DDB_BATCH_GET = 100
COMMIT_TRIES = 3
BATCH_GET_TRIES = 3
MESSAGE_VERSION = 1
UNSENT_GRACE_SECONDS = 60.0
"""How long a record may stay without a sent message before another sender (a
resubmission, a worker's stranded sweep) takes the right to send over. Taking over
is always safe (the new send id turns any older message into a stray); the grace
only spares a duplicate send while the first sender is still at work. It compares
the record's ``unsent_since`` (the first sender's wall clock) with the taker's:
clock skew shifts only when a take-over happens, never what is correct."""


def _chunks(seq: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


Q = TypeVar("Q")


def _by_queue(
    items: Sequence[Q], default: str, queue_of: Callable[[Q], str]
) -> Iterator[tuple[str, Sequence[Any]]]:
    """Batches of at most 10 on one queue each (a worker serving several queues holds
    messages of each), in the order the queues first appear."""
    queues: dict[str, list[Q]] = {}
    for item in items:
        queues.setdefault(queue_of(item) or default, []).append(item)
    for queue, on_it in queues.items():
        for chunk in _chunks(on_it, SQS_BATCH):
            yield queue, chunk


def _lease_queue(lease: LocalLease) -> str:
    return lease.queue_url


def _fail_call(what: str, err: Err) -> SqsLeaseError:
    if err.kind is ErrorKind.NOT_FOUND:
        fix = (
            "run `sqs-lease queue create`"
            if "Queue" in err.code or "Queue" in err.query_code
            else "run `sqs-lease tables create`"
        )
        return ResourceMissing(f"{what}: {err.code or 'not found'}: {err.message}; {fix}")
    return AwsCallFailed(f"{what} failed: {err.code or err.kind}: {err.message}", err.code)


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Delivery:
    """A received SQS message that names a job (the right to try, not ownership)."""

    message_id: str
    receipt_handle: str
    job_id: str
    job_class: str
    receive_count: int
    received_at: float  # monotonic, taken before ReceiveMessage was sent
    visibility: int  # the visibility the receive granted
    send_id: str | None = None  # which send of the job this is (None: an older producer)
    body: str = ""  # the original bytes, kept for a DLQ copy should it prove poison
    queue_url: str = ""  # the queue it came from (priorities); "": the flow's queue_url
    stage: str | None = None  # the stage the message was sent for (None: a job of one stage)
    # SQS's wall times (seconds) of the send and of the first receive, where it said:
    # the 12-hour cap counts from the first receive (AWS) or the send (moto).
    sent_wall: float | None = None
    first_received_wall: float | None = None


@dataclass(frozen=True)
class Poison:
    """A message that can never be processed; the reason says why."""

    message_id: str
    receipt_handle: str
    reason: str
    job_id: str | None = None
    body: str = ""  # kept so the DLQ copy carries the original bytes
    queue_url: str = ""  # the queue it came from; "": the flow's queue_url


def message_body(
    job_id: str, job_class: str, stage: str | None = None, send_id: str | None = None
) -> str:
    """The job's message: what to claim, and which send of it this is (``send_id``)."""
    body: dict[str, Any] = {"v": MESSAGE_VERSION, "job_id": job_id, "job_class": job_class}
    if stage is not None:
        body["stage"] = stage
    if send_id is not None:
        body["send_id"] = send_id
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def on_queue(item: Delivery | Poison, default: str) -> str:
    """The queue a message lives on: the one it was received from, else ``default``."""
    return item.queue_url or default


def parse_message(
    message: Mapping[str, Any], received_at: float, visibility: int, queue_url: str = ""
) -> Delivery | Poison:
    """Turn one ReceiveMessage entry into a delivery, or say why it is poison
    (``queue_url``: the queue it was received from, when a worker serves several).

    Total: whatever anyone sent, this returns; nothing raises out of it into a
    worker's receive loop, a Lambda batch or an operator's DLQ command."""
    try:
        item = _parse_message(message, received_at, visibility)
    except Exception as exc:  # a reader's defect must cost one message, never the worker
        item = Poison(
            _text(message, "MessageId"),
            _text(message, "ReceiptHandle"),
            f"message could not be read ({type(exc).__name__})",
            body=_text(message, "Body"),
        )
    return replace(item, queue_url=queue_url) if queue_url else item


def _text(message: Any, key: str) -> str:
    value = message.get(key, "") if isinstance(message, Mapping) else ""
    return value if isinstance(value, str) else ""


def _parse_message(
    message: Mapping[str, Any], received_at: float, visibility: int
) -> Delivery | Poison:
    mid = _text(message, "MessageId")
    handle = _text(message, "ReceiptHandle")
    raw = _text(message, "Body")
    try:
        body = inputs.loads(raw)
    except ValueError:
        return Poison(mid, handle, "message body is not JSON", body=raw)
    if not isinstance(body, dict):
        return Poison(mid, handle, "message body is not a JSON object", body=raw)
    job_id, job_class = body.get("job_id"), body.get("job_class")
    if not isinstance(job_id, str) or not job_id:
        return Poison(mid, handle, "message names no job_id", body=raw)
    if (why := inputs.job_id_problem(job_id)) is not None:
        # Never carried into a request or a journal line: the id is not one.
        return Poison(mid, handle, f"message job_id is not a job id: {why}", body=raw)
    if not isinstance(job_class, str) or not job_class:
        return Poison(mid, handle, "message names no job_class", job_id, raw)
    if (why := inputs.name_problem("job class", job_class)) is not None:
        # No worker of any version can serve it: poison now, not a deferral.
        return Poison(mid, handle, f"message job_class is not a class name: {why}", job_id, raw)
    send_id = body.get("send_id")
    if send_id is not None and (not isinstance(send_id, str) or not send_id):
        return Poison(mid, handle, "message send_id is not a non-empty string", job_id, raw)
    if send_id is not None and (why := inputs.send_id_problem(send_id)) is not None:
        return Poison(mid, handle, f"message send_id is not a send id: {why}", job_id, raw)
    stage = body.get("stage")
    if stage is not None and (not isinstance(stage, str) or not stage):
        return Poison(mid, handle, "message stage is not a non-empty string", job_id, raw)
    if stage is not None and (why := inputs.name_problem("stage", stage)) is not None:
        return Poison(mid, handle, f"message stage is not a stage name: {why}", job_id, raw)
    attrs = message.get("Attributes")
    attrs = attrs if isinstance(attrs, Mapping) else {}
    return Delivery(
        mid,
        handle,
        job_id,
        job_class,
        _count(attrs.get("ApproximateReceiveCount")),
        received_at,
        visibility,
        send_id,
        raw,
        stage=stage,
        sent_wall=_epoch(attrs.get("SentTimestamp")),
        first_received_wall=_epoch(attrs.get("ApproximateFirstReceiveTimestamp")),
    )


def _count(text: Any) -> int:
    """ApproximateReceiveCount (SQS's own, as text); 1 where it is missing or garbled."""
    try:
        return max(1, int(text)) if text is not None else 1
    except (TypeError, ValueError, OverflowError):
        return 1


def _epoch(millis: Any) -> float | None:
    """An SQS timestamp attribute (epoch milliseconds, as text) in seconds, or None."""
    try:
        return int(millis) / 1000.0 if millis is not None else None
    except (TypeError, ValueError, OverflowError):
        return None


def receive_flow(
    *,
    queue_url: str,
    max_messages: int,
    wait_seconds: int,
    visibility: int,
    tag_queue: bool = False,
) -> Flow[list[Delivery | Poison]]:
    """Long-poll one batch; each message's local lease counts from before the request.
    ``tag_queue``: each message names the queue it came from (a worker serving several).

    From a FIFO queue one message at a time: a batch may hold several messages of one
    group, which the worker would run side by side, out of their order; received one
    by one, the next of a group comes only once the one before it is gone (SQS holds
    a group while one of its messages is in flight), and no message is received
    and handed back to wait (each receive would count towards the redrive)."""
    most = 1 if is_fifo(queue_url) else max(1, min(SQS_BATCH, max_messages))
    out = yield from call(
        Call(
            "sqs",
            "ReceiveMessage",
            {
                "QueueUrl": queue_url,
                "MaxNumberOfMessages": most,
                "WaitTimeSeconds": wait_seconds,
                "VisibilityTimeout": visibility,
                "MessageSystemAttributeNames": [
                    "ApproximateReceiveCount",
                    "SentTimestamp",
                    "ApproximateFirstReceiveTimestamp",
                ],
            },
        )
    )
    if isinstance(out, Err):
        if out.kind is ErrorKind.NOT_FOUND:
            raise _fail_call(f"receive from {queue_url}", out)
        yield from emit("receive_failed", error_code=out.code or out.kind.value)
        return []
    return [
        parse_message(m, out.sent_at, visibility, queue_url if tag_queue else "")
        for m in out.response.get("Messages", [])
    ]


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
    out: Outcome
    if group is None:
        out = yield from call(
            req.put_new(
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
        )
    else:
        if groups is None:  # pragma: no cover - the producer always passes both
            raise ValueError("submit_flow: a group needs its GroupRequests")
        entries = [
            groups.count_job(group, wall_now),
            req.put_new_item(
                job_id=job_id,
                job_class=job_class,
                payload_json=payload_json,
                payload_hash=payload_hash,
                wall_now=wall_now,
                send_id=send_id,
                group=group,
                tenant=tenant,
                stage=stage,
                priority=priority,
            ),
        ]
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
            raise _fail_call(f"submit {job_id}: put job record", out)
        existing = req.parse(out.item)
        if existing.payload_hash != payload_hash or existing.job_class != job_class:
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
        raise _fail_call(
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
    raise _fail_call(f"submit {job_id}: take over the send", took)


# --------------------------------------------------------------------------- stranded

StrandedVerdict = Literal["resent", "would_resend", "moved", "cleared", "failed"]


@dataclass(frozen=True)
class Stranded:
    """One record found without a sent message, and what the sweep did with it.

    ``cleared``: the index still listed a record that no longer waits for its message
    (ended or parked by a write of an older version); the sweep took it out."""

    job_id: str
    job_class: str
    unsent_for: float  # seconds, by the sweeper's wall clock
    verdict: StrandedVerdict
    send_id: str | None = None  # the new send (resent) or the one found (otherwise)
    detail: str = ""


@dataclass(frozen=True)
class SweepReport:
    jobs: tuple[Stranded, ...]
    more: bool  # the limit or the page bound was reached: more stranded records may wait
    # Where a next run may start (a query's LastEvaluatedKey, or the last entry this
    # run read when it stopped at its limit; None: the index was read to its end). A
    # record left in the index (moved, failed, unreadable) is behind it, so a sweep
    # that pages on (a Lambda deployment's scheduled sweep) reaches what follows.
    next_key: Mapping[str, Any] | None = None


SWEEP_PAGES = 10
"""Pages of the ``unsent`` index one sweep reads at most. Entries it cannot act on
(a record this version cannot read; an entry it clears) do not count against its
``limit``: it reads on past them, so they never hide a stranded job behind them,
within this bound on one run's reads."""


def _index_key(item: Mapping[str, Any]) -> dict[str, Any]:
    """An ``unsent`` index entry's keys: a query's ExclusiveStartKey after it."""
    return {k: item[k] for k in ("job_id", "unsent", "unsent_since") if k in item}


def home_queue(job: JobView, queue_url: str, interactive_url: str | None) -> str:
    """The queue a job's re-sent message goes to (a sweep, a resume, a retry): the one
    it was submitted to, so an interactive job keeps its priority. Without the
    interactive queue's address the default queue (the job still runs, at batch
    priority)."""
    if job.priority == "interactive" and interactive_url:
        return interactive_url
    return queue_url


def sweep_flow(
    req: JobRequests,
    *,
    queue_url: str,
    wall_now: float,
    older_than: float,
    limit: int,
    send_id_prefix: str,
    dry_run: bool = False,
    interactive_url: str | None = None,
    start_key: Mapping[str, Any] | None = None,
) -> Flow[SweepReport]:
    """Find records left without a sent message for ``older_than`` seconds and send
    them again, at most ``limit`` per run, oldest first (from ``start_key``, an
    earlier page's ``next_key``, when given).

    The records come from the sparse ``unsent`` index (Query pages, never a Scan).
    Each re-send first takes the right to send (a conditional write of a new send
    id, so concurrent sweepers and resubmitters send it once), which also retires
    any message an earlier sender did get out. ``send_id_prefix`` must be unique
    to this run (the shell makes it); the new ids are ``PREFIX.N``.

    The sweep makes progress past what it cannot act on: an entry whose record no
    longer waits for its message (``records.awaits_send``; left by an older
    version's cancel or park) is taken out of the index, and neither it nor a
    record this version cannot read counts against ``limit``: the sweep reads the
    next page instead (at most :data:`SWEEP_PAGES`).
    """
    found: list[Stranded] = []
    acted = 0  # entries that count against the limit
    seq = 0  # entries read: the new send ids' numbers
    start: Mapping[str, Any] | None = start_key
    more = False
    last: Mapping[str, Any] | None = None  # the last entry read: where a stop resumes
    for _page in range(SWEEP_PAGES):
        out = yield from call(
            req.unsent_query(older_than=wall_now - older_than, limit=limit, start=start)
        )
        if isinstance(out, Err):
            if out.kind is ErrorKind.INVALID and "index" in out.message.lower():
                raise ResourceMissing(
                    f"stranded sweep: the jobs table has no {'unsent'!r} index ({out.message}); "
                    "run `sqs-lease tables create` (it adds the index to an existing table)"
                )
            raise _fail_call("stranded sweep: query the unsent index", out)
        start = out.response.get("LastEvaluatedKey") or None
        for item in out.response.get("Items", []):
            if acted >= limit:
                more = True
                break
            n, seq = seq, seq + 1
            last = item
            entry, counted = yield from _sweep_one(
                req,
                item,
                new_id=f"{send_id_prefix}.{n}",
                queue_url=queue_url,
                wall_now=wall_now,
                dry_run=dry_run,
                interactive_url=interactive_url,
            )
            if entry is not None:
                found.append(entry)
            acted += counted
        if acted >= limit:
            more = True  # (as a full page did: more may wait, a next run looks)
            break
        if start is None:
            break
    else:
        more = start is not None
    next_key = _index_key(last) if more and last is not None else (start if more else None)
    report = SweepReport(tuple(found), more=more, next_key=next_key)
    if found:
        verdicts = ("resent", "moved", "cleared", "failed")
        counts = {v: sum(1 for j in found if j.verdict == v) for v in verdicts}
        yield from emit(
            "stranded_swept",
            found=len(found),
            dry_run=dry_run,
            more=report.more,
            **counts,
        )
    return report


def _sweep_one(
    req: JobRequests,
    item: Mapping[str, Any],
    *,
    new_id: str,
    queue_url: str,
    wall_now: float,
    dry_run: bool,
    interactive_url: str | None,
) -> Flow[tuple[Stranded | None, int]]:
    """One entry of the unsent index: send its record again, or take a dead entry out.
    Returns what was done (None: a dead entry in a dry run, no stranded job) and
    whether it counts against the sweep's limit (1) or not (0: nothing could be
    done for a job, so the sweep reads on)."""
    try:
        seen = req.parse(item)
    except RecordUnreadable as exc:
        return (yield from _unreadable_stranded(exc)), 0
    age = round(wall_now - (seen.unsent_since or wall_now), 3)
    if not awaits_send(seen):
        # The index (projecting state and message_sent) shows a record that no longer
        # waits for its message: never sent again, and taken out so that it stops
        # taking a place in every sweep's page.
        if dry_run:
            return None, 0
        cleared = yield from _clear_entry(req, seen, age, wall_now)
        if isinstance(cleared, Stranded):
            return cleared, 0
        if cleared is None:
            return None, 0  # it had left the index already
        seen = cleared  # it waits after all (the index's copy was behind): send it
    if dry_run:
        return Stranded(seen.job_id, seen.job_class, age, "would_resend", seen.send_id), 1
    took = yield from call(
        req.take_send(seen.job_id, seen_send_id=seen.send_id, new_send_id=new_id, wall_now=wall_now)
    )
    if isinstance(took, Err):
        if took.kind is ErrorKind.CONDITION_FAILED:
            # Sent, claimed, or taken over by another sender since the index saw it.
            now = _parsed_or_none(req, took.item)
            if now is not None and now.unsent_since is not None and not awaits_send(now):
                cleared = yield from _clear_entry(req, now, age, wall_now)
                if isinstance(cleared, Stranded):
                    return cleared, 0
            return Stranded(seen.job_id, seen.job_class, age, "moved", seen.send_id), 1
        why = f"{took.code or took.kind}: {took.message}"
        return Stranded(seen.job_id, seen.job_class, age, "failed", seen.send_id, why), 1
    try:
        job = req.parse(took.response.get("Attributes", {}))
    except RecordUnreadable as exc:  # turned unreadable since the index saw it
        return (yield from _unreadable_stranded(exc)), 0
    yield from emit(
        "job_send_taken",
        job_id=job.job_id,
        send_id=new_id,
        previous_send_id=seen.send_id,
        unsent_for=age,
        by="sweep",
    )
    sent = yield from send_record_message(
        req,
        job,
        queue_url=home_queue(job, queue_url, interactive_url),
        send_id=new_id,
        wall_now=wall_now,
    )
    if sent.verdict is SendVerdict.FAILED:
        err = sent.error
        why = f"{err.code or err.kind}: {err.message}" if err else "send failed"
        return Stranded(job.job_id, job.job_class, age, "failed", new_id, why), 1
    return Stranded(job.job_id, job.job_class, age, "resent", new_id), 1


def _parsed_or_none(req: JobRequests, item: Mapping[str, Any] | None) -> JobView | None:
    if not item:
        return None
    try:
        return req.parse(item)
    except RecordUnreadable:
        return None


def _clear_entry(
    req: JobRequests, job: JobView, age: float, wall_now: float
) -> Flow[Stranded | JobView | None]:
    """Take a dead entry out of the index: what was done (``cleared``, or ``failed``:
    the next sweep tries again and reads past it meanwhile), else the record as it
    is when it was refused: one that waits for its message after all (the index's
    copy was behind, or a retry revived it: the caller sends it), or None (it left
    the index already)."""
    out = yield from call(req.leave_unsent(job.job_id, wall_now))
    if isinstance(out, Ok):
        yield from emit("unsent_entry_cleared", job_id=job.job_id, state=job.state.value)
        return Stranded(job.job_id, job.job_class, age, "cleared", job.send_id)
    if out.kind is not ErrorKind.CONDITION_FAILED:
        why = f"taking the entry out of the unsent index: {out.code or out.kind}: {out.message}"
        return Stranded(job.job_id, job.job_class, age, "failed", job.send_id, why)
    now = _parsed_or_none(req, out.item)
    return now if now is not None and awaits_send(now) else None


def _unreadable_stranded(exc: RecordUnreadable) -> Flow[Stranded]:
    """A stranded record this version cannot read is its own job's problem: the sweep
    reports it (``failed``, naming the record) and goes on with the others, as the
    heartbeat does with such a record in its round."""
    job_id = exc.job_id or "?"
    yield from emit("job_record_unreadable", job_id=job_id, stage="sweep", reason=str(exc))
    return Stranded(job_id, "?", 0.0, "failed", None, str(exc)[:300])


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


NotClaimedOutcome = Literal[
    "done",
    "parked",
    "missing",
    "exhausted",
    "unknown",
    "class_mismatch",
    "stray",
    # running under another token, this message its current one (left to the
    # duplicate rule, ``_core/duplicates.py``: defer, or take over with take_from):
    "running",
    # from admit_flow:
    "deferred",
    "unknown_class",
    "unreadable",
    "invalid",
]


@dataclass(frozen=True)
class NotClaimed:
    delivery: Delivery
    outcome: NotClaimedOutcome
    reason: str
    job: JobView | None = None


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
            return NotClaimed(d, "invalid", _refusal("claim", out))
        yield from emit(
            "ownership_unknown",
            job_id=d.job_id,
            stage="claim",
            error_code=out.code or out.kind,
            request_id=out.request_id or None,
        )
        return NotClaimed(d, "unknown", f"claim not answered: {out.code or out.kind}")
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
        progress_json=old.progress_json,
        group=old.group,
        tenant=old.tenant,
        stage_input=old.stage_input,
        stage_log=old.stage_log,
        late_handbacks=old.late_handbacks,  # timing.late_charged reads it
    )
    reclaimed = old.state is JobState.RUNNING
    allowed = max_attempts + old.granted_attempts
    if attempt > allowed:
        granted = f" + {old.granted_attempts} granted" if old.granted_attempts else ""
        reason = f"attempts exhausted ({attempt - 1} of {max_attempts}{granted})"
        yield from fail_flow(
            req,
            queue_url=queue_url,
            job=job,
            delivery=d,
            worker_id=worker_id,
            wall_now=wall_now,
            reason=reason,
            error_code="attempts_exhausted",
            nonce=nonce,
        )
        return NotClaimed(d, "exhausted", reason, job)
    # The receive granted d.visibility from d.received_at: the first lease. Only when
    # too little of it is left does a CMV move it to L from now (the heartbeat brings
    # a kept receive lease to L at the class's first beat).
    deadline = d.received_at + d.visibility
    lease_granted = d.visibility
    cmv: Outcome | None = None
    if keep_receive_lease is None or deadline - out.received_at <= keep_receive_lease:
        cmv = yield from set_visibility(on_queue(d, queue_url), d.receipt_handle, lease_seconds)
        if isinstance(cmv, Ok):
            deadline = cmv.sent_at + lease_seconds
            lease_granted = lease_seconds
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
        yield from _delete(on_queue(d, queue_url), d.receipt_handle)
        reason = "no job record for the message"
        yield from emit("message_poisoned", job_id=d.job_id, message_id=d.message_id, reason=reason)
        return NotClaimed(d, "missing", reason)
    current = req.parse(out.item)
    if current.job_class != d.job_class:
        reason = f"message names job class {d.job_class!r}, record says {current.job_class!r}"
        poison = Poison(d.message_id, d.receipt_handle, reason, d.job_id, d.body, d.queue_url)
        yield from poison_flow(
            req, queue_url=queue_url, poison=poison, dlq_url=dlq_url, body=d.body
        )
        return NotClaimed(d, "class_mismatch", reason, current)
    if current.state.terminal or current.state is JobState.PARKED:
        outcome: NotClaimedOutcome = "parked" if current.state is JobState.PARKED else "done"
        yield from _delete(on_queue(d, queue_url), d.receipt_handle)
        yield from emit(
            "job_already_done" if outcome == "done" else "job_parked_skip",
            job_id=d.job_id,
            state=current.state.value,
            token=current.token,
        )
        return NotClaimed(d, outcome, f"job is {current.state}", current)
    if current.state is JobState.RUNNING and _is_current(d, current):
        # The job's current message, delivered again while the job runs (SQS's
        # at-least-once copy, or its owner's lease lapsed): the duplicate rule decides.
        return NotClaimed(d, "running", f"job runs under token {current.token}", current)
    # Queued or running under the same class: the message is not the job's current
    # one (a losing sender's, or one a re-send retired). Its owner keeps the job.
    yield from _delete(on_queue(d, queue_url), d.receipt_handle)
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
    return NotClaimed(d, "stray", reason, current)


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
        yield from emit(
            "job_class_unknown",
            job_id=d.job_id,
            job_class=d.job_class,
            receive_count=d.receive_count,
            bound=unknown_class_receives,
            delay=delay,
            visibility_set=isinstance(cmv, Ok),
        )
        return NotClaimed(d, "deferred", f"job class {d.job_class!r} unknown to this worker")
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
        yield from _poison_delivery(queue_url, dlq_url, d, reason)
        return NotClaimed(d, "unreadable", reason)
    if isinstance(result, NotClaimed) and result.outcome == "invalid":
        yield from _poison_delivery(queue_url, dlq_url, d, result.reason)
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
        yield from emit(
            "job_class_unknown",
            job_id=d.job_id,
            job_class=d.job_class,
            receive_count=d.receive_count,
            bound=bound,
            moved_to_dlq=False,
            park_error=out.code or out.kind.value,
        )
        return None
    yield from emit(
        "job_class_unknown",
        job_id=d.job_id,
        job_class=d.job_class,
        receive_count=d.receive_count,
        bound=bound,
        moved_to_dlq=True,
        record_parked=isinstance(out, Ok),
    )
    yield from _poison_delivery(queue_url, dlq_url, d, dlq_reason)
    return NotClaimed(d, "unknown_class", dlq_reason, parked)


def _poison_delivery(queue_url: str, dlq_url: str | None, d: Delivery, reason: str) -> Flow[None]:
    body = d.body or message_body(d.job_id, d.job_class)
    yield from poison_flow(
        None,
        queue_url=queue_url,
        poison=Poison(d.message_id, d.receipt_handle, bounded(reason), d.job_id, body, d.queue_url),
        dlq_url=dlq_url,
        body=body,
    )


def _refusal(what: str, err: Err) -> str:
    message = f"{err.code or err.kind}: {err.message}"
    return bounded(f"DynamoDB refused the {what}: {message}{_limit_hint(message)}")


# --------------------------------------------------------------------------- heartbeat


class BeatStatus(StrEnum):
    """The heartbeat's verdict on one job."""

    OK = "ok"  # extended, and the record says this attempt still owns the job
    LOST = "lost"  # the token, owner or state moved on: the lease is gone
    CANCELLED = "cancelled"  # an operator cancelled the job
    UNKNOWN = "unknown"  # no answer: keep the old deadline, try again soon
    DONE = "done"  # this attempt already ended itself: nothing to extend, nothing lost
    # SQS refused the extension (InvalidParameterValue: its 12-hour cap, or a handle
    # it no longer takes) while the record still runs under this attempt's token:
    # nobody else took the job, so it goes on under a new message, uncharged.
    CAPPED = "capped"


@dataclass(frozen=True)
class Beat:
    """The heartbeat's verdict on one job (a :class:`BeatStatus`)."""

    job_id: str
    status: BeatStatus
    deadline: float | None = None  # new local deadline when ok
    reason: str = ""
    request_id: str = ""  # of the call that left ownership unknown, where it has one

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", BeatStatus(self.status))


@dataclass(frozen=True)
class HeartbeatReport:
    beats: dict[str, Beat] = field(default_factory=dict)
    calls: int = 0
    progress_saved: dict[str, str] = field(default_factory=dict)  # job id -> details saved


_LEASE_GONE_CODES = ("ReceiptHandleIsInvalid", "MessageNotInflight", "InvalidParameterValue")


def heartbeat_flow(
    req: JobRequests,
    *,
    queue_url: str,
    leases: Sequence[LocalLease],
    worker_id: str,
    wall_now: float,
) -> Flow[HeartbeatReport]:
    """Extend visibility (batches of 10), then confirm ownership (BatchGetItem of 100).

    Both must succeed for a local lease to move forward; the new deadline counts
    from before the visibility change was sent. No write per job: what people see
    (lease left, heartbeat age) comes from the worker's one liveness record per
    round (``_core/liveness.py``), written after the round.
    """
    beats: dict[str, Beat] = {}
    extended: dict[str, float] = {}
    gone: set[str] = set()
    refused: set[str] = set()  # InvalidParameterValue: the cap (or a handle SQS refuses)
    calls = 0
    # ``wall_now`` was read just before this round; the first call's send stamp is
    # the lease clock at about the same moment: the pair turns the monotonic
    # ``last_confirmed`` into a wall-clock time a person can read.
    mono_now: float | None = None
    by_id = {lease.job_id: lease for lease in leases}
    for queue, chunk in _by_queue(leases, queue_url, _lease_queue):
        entries = [
            {
                "Id": str(i),
                "ReceiptHandle": lease.receipt_handle,
                "VisibilityTimeout": lease.lease_seconds,
            }
            for i, lease in enumerate(chunk)
        ]
        out = yield from call(
            Call("sqs", "ChangeMessageVisibilityBatch", {"QueueUrl": queue, "Entries": entries})
        )
        calls += 1
        if mono_now is None:
            mono_now = out.sent_at
        answers: list[tuple[LocalLease, Outcome]] = []
        if isinstance(out, Err) and _refused_for_value(out):
            # The whole batch refused for one entry (moto raises its cap refusal so;
            # every entry we send is well formed): ask each alone, to know which.
            for lease in chunk:
                single = yield from call(set_visibility_call(queue, lease))
                calls += 1
                answers.append((lease, single))
        elif isinstance(out, Err):
            answers = [(lease, out) for lease in chunk]
        else:
            for ok in out.response.get("Successful", []):
                extended[chunk[int(ok["Id"])].job_id] = out.sent_at
            # Batch calls report per-entry failures on HTTP 200: always read Failed[].
            for bad in out.response.get("Failed", []):
                lease = chunk[int(bad["Id"])]
                code = str(bad.get("Code", ""))
                answers.append((lease, Err(ErrorKind.INVALID, code, sent_at=out.sent_at)))
        for lease, got in answers:
            if isinstance(got, Ok):
                extended[lease.job_id] = got.sent_at
                continue
            assert isinstance(got, Err)
            code = got.code or got.query_code
            if got is out:  # the whole call went unanswered or failed: keep trying
                why = got.code or got.kind
                beats[lease.job_id] = Beat(
                    lease.job_id, BeatStatus.UNKNOWN, reason=why, request_id=got.request_id
                )
            elif any(sqs_code_is(name, got.code, got.query_code) for name in _LEASE_GONE_CODES):
                beats[lease.job_id] = Beat(lease.job_id, BeatStatus.LOST, reason=f"sqs: {code}")
                gone.add(lease.job_id)
                if _refused_for_value(got):
                    refused.add(lease.job_id)
            else:
                beats[lease.job_id] = Beat(lease.job_id, BeatStatus.UNKNOWN, reason=f"sqs: {code}")
    # Jobs SQS calls gone are read too: a message our own commit just deleted is a
    # finished attempt, not a lost lease.
    pending = [job_id for job_id in by_id if job_id in extended or job_id in gone]
    seen: dict[str, JobView] = {}
    unreadable: dict[str, str] = {}
    for chunk in _chunks(pending, DDB_BATCH_GET):
        out = yield from call(req.batch_get(chunk))
        calls += 1
        tries = 1
        while True:
            if isinstance(out, Err):
                break
            for item in req.batch_items(out.response):
                try:
                    view = req.parse(item)
                except RecordUnreadable as exc:
                    # One record this version cannot read affects only its own job.
                    if exc.job_id in by_id:
                        unreadable[exc.job_id] = str(exc)
                    continue
                seen[view.job_id] = view
            unprocessed = out.response.get("UnprocessedKeys") or {}
            if not unprocessed or tries >= BATCH_GET_TRIES:
                break
            yield Sleep(0.05 * tries)
            out = yield from call(req.batch_get_retry(unprocessed))
            calls += 1
            tries += 1
        for job_id in chunk:
            lease = by_id[job_id]
            found = seen.get(job_id)
            if job_id in unreadable:
                yield from emit(
                    "job_record_unreadable",
                    job_id=job_id,
                    token=lease.token,
                    stage="heartbeat",
                    reason=unreadable[job_id],
                )
                if job_id not in gone:
                    beats[job_id] = Beat(job_id, BeatStatus.UNKNOWN, reason="job record unreadable")
                continue
            if job_id in gone:
                if found is not None and _finished_by(lease, found):
                    beats[job_id] = Beat(job_id, BeatStatus.DONE, reason=f"job is {found.state}")
                elif job_id in refused and found is not None and _still_ours(lease, found):
                    beats[job_id] = Beat(job_id, BeatStatus.CAPPED, reason=beats[job_id].reason)
                continue
            if found is None:
                why = out.code or out.kind if isinstance(out, Err) else "not read"
                if isinstance(out, Ok) and not out.response.get("UnprocessedKeys"):
                    beats[job_id] = Beat(job_id, BeatStatus.LOST, reason="job record is gone")
                else:
                    rid = out.request_id if isinstance(out, Err) else ""
                    beats[job_id] = Beat(
                        job_id, BeatStatus.UNKNOWN, reason=f"dynamodb: {why}", request_id=rid
                    )
                continue
            beats[job_id] = _verdict(lease, found, worker_id, extended[job_id])
    saved: dict[str, str] = {}
    for lease in leases:
        # Progress details: a separate, only-when-changed write, fenced on the token,
        # at most one per job per round; a failed one is tried again next round.
        text, job_id = lease.progress, lease.job_id
        b = beats.get(job_id)
        if text is None or text == lease.progress_saved or b is None or b.status != BeatStatus.OK:
            continue
        out = yield from call(req.save_progress(job_id, lease.token, text, wall_now))
        calls += 1
        if isinstance(out, Ok):
            saved[job_id] = text
            yield from emit("progress_saved", job_id=job_id, token=lease.token, size=len(text))
        elif out.kind is ErrorKind.CONDITION_FAILED:
            # A stale token's details are refused, and say the lease is gone.
            try:
                now_view = req.parse(out.item) if out.item else None
            except RecordUnreadable:
                now_view = None
            beats[job_id] = (
                _verdict(lease, now_view, worker_id, extended[job_id])
                if now_view is not None
                else Beat(job_id, BeatStatus.LOST, reason="job record is gone")
            )
            yield from emit("progress_refused", job_id=job_id, token=lease.token)
    for job_id, beat in beats.items():
        lease = by_id[job_id]
        if beat.status is BeatStatus.OK:
            yield from emit(
                "heartbeat_ok",
                job_id=job_id,
                token=lease.token,
                lease_left=round((beat.deadline or 0.0) - extended[job_id], 3),
            )
        elif beat.status in (BeatStatus.DONE, BeatStatus.LOST, BeatStatus.CANCELLED):
            # done: this attempt already ended itself, nothing was lost. A loss is
            # journaled once per attempt where the lease changes (apply_beats, lose).
            continue
        else:
            yield from emit(
                "ownership_unknown",
                job_id=job_id,
                token=lease.token,
                reason=beat.reason,
                last_confirmed=lease.last_confirmed,
                last_confirmed_at=_wall_of(lease.last_confirmed, mono_now, wall_now),
                conservative_deadline=lease.conservative_deadline,
                request_id=beat.request_id or None,
            )
    return HeartbeatReport(beats, calls, saved)


def _wall_of(mono: float, mono_now: float | None, wall_now: float) -> float | None:
    """A lease-clock time as wall-clock seconds (None: never confirmed, or no anchor)."""
    if mono_now is None or mono <= 0.0:
        return None
    return round(wall_now - (mono_now - mono), 3)


@dataclass(frozen=True)
class BeatOutcome:
    """What a heartbeat round changed: leases extended, handlers to cancel, and the
    ``heartbeat_lost`` events to journal (one per attempt, see :func:`lose`)."""

    extended: tuple[LocalLease, ...]
    cancel: tuple[LocalLease, ...]
    events: tuple[Emit, ...] = ()
    # Dropped as Drop.MESSAGE_CAP (SQS refused the extension, the job still ours): the
    # round gives each its new message (``attempt.watchdog_drops_flow``).
    capped: tuple[LocalLease, ...] = ()


class LossSource(StrEnum):
    """How an attempt learned that its lease is gone (the ``detected_by`` field)."""

    HEARTBEAT = "heartbeat"  # the heartbeat's ownership read (or its progress save)
    HANDLER = "handler"  # the handler raised LeaseLost: a fenced call of its own was refused
    COMMIT = "commit"  # a fenced end write was rejected: the token had moved
    FAIL = "fail"
    RETRY = "retry"
    PARK = "park"
    RELEASE = "release"  # the shutdown hand-back was rejected
    INTENT_START = "intent_start"  # the fenced intent start was refused: token moved
    OWN_CLAIM = "own_claim"  # this worker's own newer claim of the job superseded it
    CLAIM = "claim"  # a write right after the claim, before the lease was held


def lost_event(
    job_id: str, token: int, source: LossSource, reason: str, cancelled: bool = False
) -> Emit:
    """The one event for a lost lease: ``heartbeat_lost`` (its documented name, kept for
    alerting), whatever detected it."""
    return Emit(
        "heartbeat_lost",
        {
            "job_id": job_id,
            "token": token,
            "reason": reason,
            "cancelled": cancelled,
            "detected_by": source.value,
        },
    )


def lose(
    lease: LocalLease, source: LossSource, reason: str, *, cancelled: bool = False
) -> Emit | None:
    """The attempt learned that its lease is gone: mark it, and return the event to
    journal, or None when this attempt's loss is already known (once per attempt).

    Any status but lost/cancelled can learn it: a running handler (ok/unknown), one
    that returned (done) and meets a rejected commit, one the watchdog dropped
    (expired) whose late write finds the token moved.
    """
    event = LeaseEvent.CANCELLED if cancelled else LeaseEvent.LOST
    if lease.process(event, reason) is not Action.TELL_LOSS:
        return None
    return lost_event(lease.job_id, lease.token, source, reason, cancelled)


def gave_back(lease: LocalLease, reason: str) -> None:
    """This attempt handed its job back itself (a watchdog retry, a release): nothing
    it learns later is a lost lease, and nothing may be done for it any more."""
    lease.process(LeaseEvent.GAVE_BACK, reason)


def rejected_loss(fin: Finish) -> tuple[str, bool] | None:
    """For a rejected end write: the loss reason and whether it was a cancel."""
    if fin.outcome is not FinishOutcome.REJECTED:
        return None
    cur = fin.current
    cancelled = cur is not None and is_cancelled(cur)
    return fin.reason, cancelled


def apply_beats(
    leases: Sequence[LocalLease],
    report: HeartbeatReport,
    *,
    started: float,
) -> BeatOutcome:
    """Move each lease by its verdict (the shells call this; they decide nothing).

    ``started`` is the worker's monotonic time when the round began. A lease that
    finished or was dropped while the round was in flight is left alone; ``ok``
    moves the local deadline (counted from before the visibility change was sent);
    ``lost``/``cancelled`` stop the attempt; ``unknown`` keeps the old deadline and
    asks for another try soon, while the reserve lasts.
    """
    extended: list[LocalLease] = []
    cancel: list[LocalLease] = []
    capped: list[LocalLease] = []
    events: list[Emit] = []
    for lease in leases:
        beat = report.beats.get(lease.job_id)
        if beat is None or beat.status is BeatStatus.DONE:
            continue
        if lease.status not in OPEN:
            continue
        if beat.status is BeatStatus.OK and beat.deadline is not None:
            lease.process(LeaseEvent.CONFIRMED)
            lease.deadline = beat.deadline
            lease.last_confirmed = started
            lease.next_beat = started + lease.heartbeat_seconds
            if lease.job_id in report.progress_saved:
                lease.progress_saved = report.progress_saved[lease.job_id]
            extended.append(lease)
        elif beat.status is BeatStatus.CAPPED:
            lease.drop(Drop.MESSAGE_CAP)
            capped.append(lease)
            cancel.append(lease)
        elif beat.status in (BeatStatus.LOST, BeatStatus.CANCELLED):
            ev = lose(
                lease,
                LossSource.HEARTBEAT,
                beat.reason,
                cancelled=beat.status is BeatStatus.CANCELLED,
            )
            if ev is not None:
                events.append(ev)
            cancel.append(lease)
        else:
            lease.process(LeaseEvent.UNCONFIRMED, beat.reason)
            lease.next_beat = started + min(lease.heartbeat_seconds, 1.0)
    return BeatOutcome(tuple(extended), tuple(cancel), tuple(events), tuple(capped))


def _refused_for_value(err: Err) -> bool:
    """SQS refused a visibility change as InvalidParameterValue (its 12-hour cap)."""
    return sqs_code_is("InvalidParameterValue", err.code, err.query_code)


def set_visibility_call(queue_url: str, lease: LocalLease) -> Call:
    """One lease's extension alone (a batch SQS refused whole, to find the entry)."""
    return Call(
        "sqs",
        "ChangeMessageVisibility",
        {
            "QueueUrl": queue_url,
            "ReceiptHandle": lease.receipt_handle,
            "VisibilityTimeout": lease.lease_seconds,
        },
    )


def _still_ours(lease: LocalLease, view: JobView) -> bool:
    """The record still runs under this attempt's token (and was not cancelled)."""
    return view.token == lease.token and view.state is JobState.RUNNING


def end_write_id(nonce: str, what: str) -> str:
    """The id an end write of the attempt with ``nonce`` carries (``what``: commit,
    fail, retry, park, release, stage): unique to that write of that attempt."""
    return f"{nonce}:{what}"


def own_end_write(view: JobView, nonce: str) -> bool:
    """Whether the record's last end write is one of the attempt with ``nonce``.

    The one rule by which an attempt recognises its own write: by the id it wrote,
    never by state, token and owner alone, which any writer of the record (a
    producer role, a hand-made update) could copy. An attempt without a nonce (none
    drawn) recognises nothing."""
    return bool(nonce) and (view.write_id or "").startswith(f"{nonce}:")


def _finished_by(lease: LocalLease, view: JobView) -> bool:
    """The record left `running` under this attempt's own token by the attempt's own
    end write (commit, fail, retry, park, stage, release): its write id says so.
    Cancel moves the token; any other writer that left it under the token (a
    producer's forged `succeeded`) took the lease, it did not end it."""
    return (
        view.token == lease.token
        and view.state is not JobState.RUNNING
        and own_end_write(view, lease.nonce)
    )


def _verdict(lease: LocalLease, view: JobView, worker_id: str, sent_at: float) -> Beat:
    if is_cancelled(view):
        return Beat(lease.job_id, BeatStatus.CANCELLED, reason=view.reason or "cancelled")
    if _finished_by(lease, view):
        return Beat(lease.job_id, BeatStatus.DONE, reason=f"job is {view.state}")
    if view.token != lease.token:
        return Beat(lease.job_id, BeatStatus.LOST, reason=f"token moved to {view.token}")
    if view.state is not JobState.RUNNING:
        return Beat(lease.job_id, BeatStatus.LOST, reason=f"job is {view.state}")
    if view.owner != worker_id:
        return Beat(lease.job_id, BeatStatus.LOST, reason=f"owner is {view.owner}")
    return Beat(lease.job_id, BeatStatus.OK, deadline=sent_at + lease.lease_seconds)


# --------------------------------------------------------------------------- finish


class FinishOutcome(StrEnum):
    """How a write that ends an attempt went."""

    DONE = "done"  # applied (by this try or an earlier one)
    REJECTED = "rejected"  # the condition failed: the token moved, the lease is gone
    UNKNOWN = "unknown"  # no answer: it may or may not have applied
    INVALID = "invalid"  # DynamoDB can never apply it as sent
    FAILED = "failed"  # the job was ended ``failed`` instead, naming the limit it broke


@dataclass(frozen=True)
class Finish:
    """How a write that ends an attempt went (a :class:`FinishOutcome`)."""

    outcome: FinishOutcome
    reason: str = ""
    current: JobView | None = None
    request_id: str = ""  # of the unanswered or refused write, where the service gave one
    # Lease-clock stamps: the write's first try sent, and the last answer (the message's
    # delete included, where one followed). For spans and durations, never a decision.
    sent_at: float | None = field(default=None, compare=False)
    answered_at: float | None = field(default=None, compare=False)
    # The write ended the job and its message is still to be deleted: the caller
    # asked to batch the delete (``defer_delete``) and queues the receipt handle.
    delete_pending: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", FinishOutcome(self.outcome))

    @property
    def seconds(self) -> float | None:
        """How long the end write (and its delete) took, where both stamps are known."""
        if self.sent_at is None or self.answered_at is None:
            return None
        return round(max(0.0, self.answered_at - self.sent_at), 3)


def set_visibility(queue_url: str, receipt_handle: str, seconds: int) -> Flow[Outcome]:
    """One ChangeMessageVisibility: a new timeout counted from the call (it does not add)."""
    return (
        yield from call(
            Call(
                "sqs",
                "ChangeMessageVisibility",
                {
                    "QueueUrl": queue_url,
                    "ReceiptHandle": receipt_handle,
                    "VisibilityTimeout": seconds,
                },
            )
        )
    )


def _delete(queue_url: str, receipt_handle: str) -> Flow[Outcome]:
    out = yield from call(
        Call("sqs", "DeleteMessage", {"QueueUrl": queue_url, "ReceiptHandle": receipt_handle})
    )
    if isinstance(out, Err):
        # Not a fence and not fatal: a redelivered message meets a terminal record
        # at its claim and is deleted then.
        yield from emit("message_delete_failed", error_code=out.code or out.kind)
    return out


def _fenced_write(
    req: JobRequests,
    build: Call,
    *,
    job: JobView,
    worker_id: str,
    applied: JobState,
    write_id: str,
) -> Flow[Finish]:
    """:func:`_fenced_tries`, its Finish stamped with when it was sent and answered."""
    flow = _fenced_tries(
        req, build, job=job, worker_id=worker_id, applied=applied, write_id=write_id
    )
    sent: float | None = None
    answered: float | None = None
    try:
        instruction = next(flow)
        while True:
            outcome = yield instruction
            if isinstance(instruction, Call) and outcome is not None:
                sent = outcome.sent_at if sent is None else sent
                answered = outcome.received_at
            instruction = flow.send(outcome)
    except StopIteration as stop:
        fin: Finish = stop.value
    return replace(fin, sent_at=sent, answered_at=answered)


def _fenced_tries(
    req: JobRequests,
    build: Call,
    *,
    job: JobView,
    worker_id: str,
    applied: JobState,
    write_id: str,
) -> Flow[Finish]:
    """Send a write conditioned on the token (``build`` carries ``write_id``); retry
    an unanswered one.

    A retried write whose first try did apply fails its condition; ALL_OLD then
    shows the record in ``applied`` state under our token with our ``write_id``,
    which we recognise as our own write instead of calling it rejected. The same
    state, token and owner without that id is another writer's: rejected.
    """
    last: Err | None = None
    for attempt in range(COMMIT_TRIES):
        out = yield from call(build)
        if isinstance(out, Ok):
            return Finish(FinishOutcome.DONE)
        last = out
        if out.kind is ErrorKind.CONDITION_FAILED:
            try:
                current = req.parse(out.item) if out.item else None
            except RecordUnreadable as exc:
                # The condition failed, so the record is not running under our token:
                # not ours, whatever else it holds.
                yield from emit(
                    "job_record_unreadable",
                    job_id=job.job_id,
                    token=job.token,
                    stage="end",
                    reason=str(exc),
                )
                return Finish(FinishOutcome.REJECTED, "job record unreadable")
            if (
                current is not None
                and current.state is applied
                and current.token == job.token
                and current.write_id == write_id
            ):
                return Finish(FinishOutcome.DONE, "an earlier try applied", current)
            return Finish(FinishOutcome.REJECTED, _why_rejected(current, job), current)
        if out.kind is ErrorKind.VALIDATION:
            return Finish(FinishOutcome.INVALID, f"{out.code or out.kind}: {out.message}")
        if not out.unknown:
            return Finish(
                FinishOutcome.UNKNOWN,
                f"{out.code or out.kind}: {out.message}",
                request_id=out.request_id,
            )
        if attempt + 1 < COMMIT_TRIES:
            yield Sleep(0.2 * (attempt + 1))
    assert last is not None
    return Finish(
        FinishOutcome.UNKNOWN, f"no answer: {last.code or last.kind}", request_id=last.request_id
    )


def _limit_hint(message: str) -> str:
    low = message.lower()
    if "size" in low and "item" in low:
        return " (DynamoDB's item limit is 400 KB, payload and result together)"
    if "key" in low and ("size" in low or "length" in low):
        return " (DynamoDB's partition key limit is 2048 bytes)"
    return ""


def _why_rejected(current: JobView | None, job: JobView) -> str:
    if current is None:
        return "job record is gone"
    if current.token != job.token:
        return f"token moved from {job.token} to {current.token}"
    if current.state is not JobState.RUNNING:
        # Out of running under this token, yet not by this write: another writer's.
        return f"job is {current.state} (owner {current.owner}), not by this attempt's write"
    return f"job is {current.state} (owner {current.owner})"


def _end_attempt(
    req: JobRequests,
    *,
    queue_url: str,
    job: JobView,
    delivery: Delivery,
    worker_id: str,
    write: Call,
    write_id: str,
    applied: JobState,
    stage: str,
    wall_now: float,
    nonce: str,
    delete: bool = True,
    defer_delete: bool = False,
) -> Flow[Finish]:
    """A fenced write that ends this attempt; then delete the message (if asked;
    ``defer_delete``: the caller batches it, told by ``Finish.delete_pending``).
    ``write`` carries ``write_id`` (``end_write_id(nonce, ...)``).

    A rejected write is journaled ``result_rejected`` (never reported as done), an
    unanswered one ``ownership_unknown``; both leave the message alone.
    """
    fin = yield from _fenced_write(
        req, write, job=job, worker_id=worker_id, applied=applied, write_id=write_id
    )
    if fin.outcome is FinishOutcome.INVALID:
        # DynamoDB refused the write as it can never apply (a size limit, a malformed
        # value, an attribute the record lacks): retrying cannot help, and it is not a
        # question of ownership. End the job failed with the refusal as the reason.
        reason = bounded(
            f"DynamoDB refused the {stage} write: {fin.reason}{_limit_hint(fin.reason)}"
        )
        yield from emit(
            "job_write_refused",
            job_id=job.job_id,
            token=job.token,
            stage=stage,
            reason=reason,
        )
        if stage == "fail":
            return fin  # nothing smaller to write; the message comes back, attempts count
        failed = yield from fail_flow(
            req,
            queue_url=queue_url,
            job=job,
            delivery=delivery,
            worker_id=worker_id,
            wall_now=wall_now,
            reason=reason,
            error_code="dynamodb_validation",
            defer_delete=defer_delete,
            nonce=nonce,
        )
        return (
            Finish(FinishOutcome.FAILED, reason, delete_pending=failed.delete_pending)
            if failed.outcome is FinishOutcome.DONE
            else failed
        )
    if fin.outcome is FinishOutcome.DONE:
        if delete and defer_delete:
            fin = replace(fin, delete_pending=True)
        elif delete:
            deleted = yield from _delete(on_queue(delivery, queue_url), delivery.receipt_handle)
            fin = replace(fin, answered_at=deleted.received_at)
    elif fin.outcome is FinishOutcome.REJECTED:
        cur = fin.current
        yield from emit(
            "result_rejected",
            job_id=job.job_id,
            job_class=job.job_class,
            token=job.token,
            attempt=job.attempt,
            stage=stage,
            reason=fin.reason,
            current_token=cur.token if cur else None,
            current_state=cur.state.value if cur else None,
            write_seconds=fin.seconds,
        )
    else:
        yield from emit(
            "ownership_unknown",
            job_id=job.job_id,
            token=job.token,
            stage=stage,
            reason=fin.reason,
            request_id=fin.request_id or None,
        )
    return fin


def commit_flow(
    req: JobRequests,
    *,
    queue_url: str,
    job: JobView,
    delivery: Delivery,
    worker_id: str,
    result_json: str,
    wall_now: float,
    duration: float,
    nonce: str,
    keep_rejected_content: bool = False,
    defer_delete: bool = False,
) -> Flow[Finish]:
    """Write the result on condition of the token; then delete the message.

    A rejected result (the token moved on) is never shown as the job's result, but
    kept for inspection on the record (``jobs show``): its hash and size, and with
    ``keep_rejected_content`` (the class's ``keep_rejected_results``) its bounded
    content.

    A result that would make the record break DynamoDB's item limit (the whole
    record: payload, a staged job's checkpoints and last input, and the result) is
    never sent: the job fails ``result_too_large`` with a reason naming the limit.
    """
    problem = result_problem(
        job.job_id,
        job.payload_json,
        result_json,
        stage_log=job.stage_log,
        stage_input=job.stage_input,
    )
    if problem is not None:
        failed = yield from fail_flow(
            req,
            queue_url=queue_url,
            job=job,
            delivery=delivery,
            worker_id=worker_id,
            wall_now=wall_now,
            reason=problem,
            error_code="result_too_large",
            defer_delete=defer_delete,
            nonce=nonce,
        )
        return (
            Finish(FinishOutcome.FAILED, problem, delete_pending=failed.delete_pending)
            if failed.outcome is FinishOutcome.DONE
            else failed
        )
    fin = yield from _end_attempt(
        req,
        queue_url=queue_url,
        job=job,
        delivery=delivery,
        worker_id=worker_id,
        write=req.commit(
            job.job_id,
            job.token,
            worker_id,
            result_json,
            wall_now,
            write_id=end_write_id(nonce, "commit"),
        ),
        write_id=end_write_id(nonce, "commit"),
        applied=JobState.SUCCEEDED,
        stage="commit",
        wall_now=wall_now,
        nonce=nonce,
        defer_delete=defer_delete,
    )
    if fin.outcome is FinishOutcome.DONE:
        yield from emit(
            "result_committed",
            job_id=job.job_id,
            job_class=job.job_class,
            token=job.token,
            attempt=job.attempt,
            payload_hash=job.payload_hash,
            duration=round(duration, 3),
            commit_seconds=fin.seconds,
        )
    elif fin.outcome is FinishOutcome.REJECTED and fin.current is not None:
        kept = yield from call(
            req.keep_rejected(
                job.job_id,
                job.token,
                worker_id,
                result_json,
                wall_now,
                keep_content=keep_rejected_content,
            )
        )
        yield from emit(
            "rejected_result_kept",
            job_id=job.job_id,
            token=job.token,
            size=len(result_json.encode("utf-8")),
            content=keep_rejected_content,
            stored=isinstance(kept, Ok),
        )
    return fin


def fail_flow(
    req: JobRequests,
    *,
    queue_url: str,
    job: JobView,
    delivery: Delivery,
    worker_id: str,
    wall_now: float,
    reason: str,
    error_code: str,
    nonce: str,
    defer_delete: bool = False,
) -> Flow[Finish]:
    """End the job ``failed`` with a reason (fenced), then delete its message."""
    write_id = end_write_id(nonce, "fail")
    fin = yield from _end_attempt(
        req,
        queue_url=queue_url,
        job=job,
        delivery=delivery,
        worker_id=worker_id,
        write=req.finish_failed(
            job.job_id,
            job.token,
            worker_id,
            bounded(reason, REASON_LIMIT),
            error_code,
            wall_now,
            write_id=write_id,
        ),
        write_id=write_id,
        applied=JobState.FAILED,
        stage="fail",
        wall_now=wall_now,
        nonce=nonce,
        defer_delete=defer_delete,
    )
    if fin.outcome is FinishOutcome.DONE:
        yield from emit(
            "job_failed",
            job_id=job.job_id,
            job_class=job.job_class,
            token=job.token,
            attempt=job.attempt,
            error_code=error_code,
            reason=reason,
        )
    return fin


def retry_flow(
    req: JobRequests,
    *,
    queue_url: str,
    job: JobView,
    delivery: Delivery,
    worker_id: str,
    wall_now: float,
    reason: str,
    error_code: str,
    delay: int,
    max_attempts: int,
    nonce: str,
    defer_delete: bool = False,
    handle_ours: bool = True,
) -> Flow[Finish]:
    """Give the job back for a later attempt: record -> queued (fenced), visibility -> delay.

    When the attempts are spent the job fails instead, with that reason. With
    ``handle_ours`` False (the local lease lapsed: ``LocalLease.handle_ours``) no
    visibility change is sent: the message comes back when its lease runs out,
    without the backoff, rather than risk moving another receive's visibility.
    """
    if job.attempt >= max_attempts + job.granted_attempts:
        granted = f" + {job.granted_attempts} granted" if job.granted_attempts else ""
        return (
            yield from fail_flow(
                req,
                queue_url=queue_url,
                job=job,
                delivery=delivery,
                worker_id=worker_id,
                wall_now=wall_now,
                reason=(
                    f"attempts exhausted ({job.attempt} of {max_attempts}{granted}); "
                    f"last error: {reason}"
                ),
                error_code="attempts_exhausted",
                defer_delete=defer_delete,
                nonce=nonce,
            )
        )
    write_id = end_write_id(nonce, "retry")
    fin = yield from _end_attempt(
        req,
        queue_url=queue_url,
        job=job,
        delivery=delivery,
        worker_id=worker_id,
        write=req.requeue(
            job.job_id,
            job.token,
            worker_id,
            bounded(reason, REASON_LIMIT),
            error_code,
            wall_now,
            write_id=write_id,
        ),
        write_id=write_id,
        applied=JobState.QUEUED,
        stage="retry",
        wall_now=wall_now,
        nonce=nonce,
        delete=False,
    )
    if fin.outcome != "done":
        return fin
    cmv: Outcome | None = None
    if handle_ours:
        cmv = yield from set_visibility(
            on_queue(delivery, queue_url), delivery.receipt_handle, delay
        )
    yield from emit(
        "job_retry_scheduled",
        job_id=job.job_id,
        job_class=job.job_class,
        token=job.token,
        attempt=job.attempt,
        delay=delay,
        error_code=error_code,
        reason=reason,
        visibility_set=isinstance(cmv, Ok),
        lease_lapsed=not handle_ours,
    )
    return fin


def park_flow(
    req: JobRequests,
    *,
    queue_url: str,
    job: JobView,
    delivery: Delivery,
    worker_id: str,
    wall_now: float,
    reason: str,
    nonce: str,
    defer_delete: bool = False,
) -> Flow[Finish]:
    """Park the job for an operator (fenced), then delete its message."""
    write_id = end_write_id(nonce, "park")
    fin = yield from _end_attempt(
        req,
        queue_url=queue_url,
        job=job,
        delivery=delivery,
        worker_id=worker_id,
        write=req.park(
            job.job_id,
            job.token,
            worker_id,
            bounded(reason, REASON_LIMIT),
            wall_now,
            write_id=write_id,
        ),
        write_id=write_id,
        applied=JobState.PARKED,
        stage="park",
        wall_now=wall_now,
        nonce=nonce,
        defer_delete=defer_delete,
    )
    if fin.outcome is FinishOutcome.DONE:
        yield from emit("job_parked", job_id=job.job_id, token=job.token, reason=reason)
    return fin


def release_flow(
    req: JobRequests,
    *,
    queue_url: str,
    held: Sequence[tuple[JobView | None, Delivery]],
    worker_id: str,
    wall_now: float,
    reason: str,
    nonce: str,
    visibility: int = 0,
    lapsed: Collection[str] = (),
    late: bool = False,
    charged: bool = False,
) -> Flow[int]:
    """Hand messages back (shutdown: at once): claimed records -> queued, visibility ->
    ``visibility`` (0). (A job waiting for a slot waits as a fresh message instead:
    ``slots.wait_flow``.)

    ``nonce``: the attempt's own when it releases its job itself; a fresh one when
    another flow (shutdown, a late hand-back) releases on its behalf, so the
    attempt never takes that release for its own write.

    The worker, not the job, ended these attempts, so each claimed record gets
    back the attempt its claim counted. ``lapsed``: receipt handles whose local
    lease has run out (``LocalLease.handle_ours``): their records are handed back,
    but no visibility change is sent with them, since the message may already be
    another receive's. ``late``/``charged``: a late hand-back, counted on the
    record, and whether its attempt is kept (``timing.late_charged``). Returns how
    many messages are back: SQS confirmed the change, or the lease had already lapsed.
    """
    handback: list[Delivery] = []
    gone_back = 0  # lapsed leases handed back by their record alone
    for job, d in held:
        if job is None:
            handback.append(d)
            continue
        if not nonce:
            raise ValueError("release_flow: releasing a claimed record needs a nonce")
        write_id = end_write_id(nonce, "release")
        fin = yield from _fenced_write(
            req,
            req.release(
                job.job_id,
                job.token,
                worker_id,
                reason,
                wall_now,
                write_id=write_id,
                late=late,
                charged=charged,
            ),
            job=job,
            worker_id=worker_id,
            applied=JobState.QUEUED,
            write_id=write_id,
        )
        if fin.outcome is FinishOutcome.DONE:
            if d.receipt_handle in lapsed:
                gone_back += 1
            else:
                handback.append(d)
        else:
            # Not ours any more (or unknown): its visibility belongs to the new owner.
            yield from emit(
                "job_release_skipped", job_id=job.job_id, token=job.token, reason=fin.reason
            )
            loss = rejected_loss(fin)
            if loss is not None:
                # The shell stopped the attempt for shutdown before this write, so no
                # other path has journaled this loss.
                ev = lost_event(job.job_id, job.token, LossSource.RELEASE, *loss)
                yield from emit(ev.event, **ev.fields)
    released = 0
    for queue, chunk in _by_queue(handback, queue_url, lambda d: d.queue_url):
        out = yield from call(
            Call(
                "sqs",
                "ChangeMessageVisibilityBatch",
                {
                    "QueueUrl": queue,
                    "Entries": [
                        {
                            "Id": str(i),
                            "ReceiptHandle": d.receipt_handle,
                            "VisibilityTimeout": visibility,
                        }
                        for i, d in enumerate(chunk)
                    ],
                },
            )
        )
        if isinstance(out, Ok):
            released += len(out.response.get("Successful", []))
    released += gone_back
    yield from emit("messages_released", count=released, reason=reason, lapsed=gone_back)
    return released


def poison_flow(
    req: JobRequests | None,
    *,
    queue_url: str,
    poison: Poison,
    dlq_url: str | None,
    body: str,
) -> Flow[None]:
    """Move a message nobody can process out of the way, with the reason journaled.

    With a DLQ it is copied there first (so the bytes survive for forensics), then
    deleted; without one it is deleted. It never stops the worker. A FIFO DLQ gets
    the job's id (else the message's) as the group and the message id as the
    deduplication id: a copy repeated because the delete failed stays one copy.
    """
    moved = False
    if dlq_url:
        out = yield from call(
            Call(
                "sqs",
                "SendMessage",
                {
                    "QueueUrl": dlq_url,
                    "MessageBody": body or "<empty>",
                    "MessageAttributes": {
                        "sqs_lease_reason": {
                            "DataType": "String",
                            "StringValue": poison.reason[:256],
                        },
                    },
                    **fifo_params(
                        dlq_url,
                        group_id=poison.job_id or poison.message_id,
                        dedup_id=copy_deduplication_id("poison", poison.message_id),
                    ),
                },
            )
        )
        moved = isinstance(out, Ok)
        if not moved:
            # Keep the only copy: SQS's own redrive moves it once receives run out.
            yield from emit(
                "message_poisoned",
                message_id=poison.message_id,
                job_id=poison.job_id,
                reason=poison.reason,
                moved_to_dlq=False,
                kept=True,
            )
            return
    yield from _delete(on_queue(poison, queue_url), poison.receipt_handle)
    yield from emit(
        "message_poisoned",
        message_id=poison.message_id,
        job_id=poison.job_id,
        reason=poison.reason,
        moved_to_dlq=moved,
    )


def cancel_flow(req: JobRequests, *, job_id: str, reason: str, wall_now: float) -> Flow[JobView]:
    """End a job ``failed`` (cancelled) and move its token on, fencing out its owner."""
    view, _ = yield from cancel_one(req, job_id=job_id, reason=reason, wall_now=wall_now)
    return view


def cancel_one(
    req: JobRequests, *, job_id: str, reason: str, wall_now: float
) -> Flow[tuple[JobView, bool]]:
    """:func:`cancel_flow`, also saying whether this call ended the job (False: it
    was already terminal, and the view is what it found)."""
    out = yield from call(req.cancel(job_id, reason, wall_now))
    if isinstance(out, Err):
        if out.kind is ErrorKind.CONDITION_FAILED:
            if out.item is None:
                raise JobNotFound(f"no job {job_id!r}")
            current = req.parse(out.item)
            yield from emit("job_cancel_noop", job_id=job_id, state=current.state.value)
            return current, False
        raise _fail_call(f"cancel {job_id}", out)
    view = req.parse(out.response.get("Attributes", {}))
    yield from emit("job_cancelled", job_id=job_id, token=view.token, reason=reason)
    return view, True


class CancelVerdict(StrEnum):
    """What a cancel did (``sqs-lease jobs cancel --json`` prints the value)."""

    CANCELLED = "cancelled"  # this call ended the job
    ALREADY_FINAL = "already_final"  # it had ended before: nothing changed


@dataclass(frozen=True)
class Cancelled:
    """What a cancel did: ``cancelled`` (this call ended the job), or
    ``already_final`` (it had ended before: nothing changed). ``job`` is the record
    after the call."""

    job: JobView
    verdict: CancelVerdict


def cancel_job_flow(
    req: JobRequests, *, job_id: str, reason: str, wall_now: float
) -> Flow[Cancelled]:
    """:func:`cancel_flow` with a typed verdict (what ``sqs-lease jobs cancel`` says)."""
    view, ended = yield from cancel_one(req, job_id=job_id, reason=reason, wall_now=wall_now)
    return Cancelled(view, CancelVerdict.CANCELLED if ended else CancelVerdict.ALREADY_FINAL)
