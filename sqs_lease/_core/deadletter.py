"""Messages in the dead-letter queue: what each means for its job, and parking the
jobs whose only message SQS moved there (issue 7, "nothing lost").

SQS moves a message to the DLQ by itself once its receives reach the queue's
``maxReceiveCount`` (workers that kept crashing, or could not claim it). Nothing
runs it after that, yet its job record still says ``queued`` or ``running``: the
job would wait forever and an operator could not see why. A reconciliation
receives DLQ messages (with a short hold, giving each back afterwards), reads each
one's job record, and decides by :func:`judge`:

- the record is ``queued``/``running`` and names this message's send (its send id,
  the job's one current message): **park** it, by a conditional write that holds
  only while that is still so (a job re-sent since, or claimed through another
  message, is left alone), with a reason naming the DLQ and the receive count, and
  the token moved on (the move ended any lease the message carried, as
  :func:`claiming._undeliverable`'s park does);
- the record names another send: the job was re-sent since (the stranded sweep,
  ``jobs resume``): **superseded**, left alone (the message is a stray);
- the job is finished: **finished**, reported (deleted when asked);
- already parked, no record, another class, not a job message, a record this
  version cannot read: reported, left.

The CLI (``sqs-lease dlq list --reconcile``) walks the DLQ up to a limit; a
worker's periodic sweep runs one receive of it per sweep.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from .._errors import RecordUnreadable
from .calls import Call, Err, ErrorKind, Flow, Ok, call, emit
from .limits import REASON_LIMIT, bounded
from .messages import SQS_BATCH, Delivery, Poison, fail_call, parse_message
from .records import JobRequests, JobState, JobView

REASON_ATTRIBUTE = "sqs_lease_reason"
SOURCE_ATTRIBUTE = "sqs_lease_source_message_id"
"""On a copy a worker moved to the DLQ: the message id the worker's journal names
(``message_poisoned``'s ``message_id``); the copy has a message id of its own."""
"""The message attribute a worker's own DLQ copy carries (``endwrites.poison_flow``)."""

SQS_REDRIVE_REASON = "moved by the queue's redrive policy (its receives ran out before a claim)"
"""Why a message without our attribute is there: SQS moved it itself."""

DLQ_HOLD_SECONDS = 60
"""Visibility of a DLQ message while a reconciliation looks at it (given back after)."""


class DlqVerdict(StrEnum):
    """What a reconciliation decided (or did) for one DLQ message."""

    PARKED = "parked"  # the job was queued/running on this message: parked now
    WOULD_PARK = "would_park"  # dry run
    ALREADY_PARKED = "already_parked"  # left as it is
    FINISHED = "finished"  # the job ended: the message is reported
    DELETED = "deleted"  # the job ended and the message was deleted (asked for)
    WOULD_DELETE = "would_delete"  # dry run
    SUPERSEDED = "superseded"  # the job was re-sent since (another send id): left alone
    NO_RECORD = "no_record"  # no job record of that id
    CLASS_MISMATCH = "class_mismatch"  # the message names another class than the record
    NOT_A_JOB = "not_a_job"  # the body names no job
    UNREADABLE = "unreadable"  # a record this version cannot read
    FAILED = "failed"  # a read or write got no answer, or was refused


ReconcileBy = Literal["cli", "sweep"]


@dataclass(frozen=True)
class DeadLetter:
    """One DLQ message as a reconciliation saw it (never its body)."""

    message_id: str
    receipt_handle: str
    job_id: str | None
    job_class: str | None
    send_id: str | None
    receive_count: int
    sent_wall: float | None  # epoch seconds, SQS's clock
    reason: str  # why it is in the DLQ: the worker's reason, or SQS's redrive


@dataclass(frozen=True)
class DlqFinding:
    """One DLQ message, its job's state when read, and the verdict."""

    message: DeadLetter
    verdict: DlqVerdict
    job_state: JobState | None = None
    detail: str = ""
    token: int | None = None  # the job's token after a park


@dataclass(frozen=True)
class DlqReport:
    """Every DLQ message a reconciliation looked at; ``more``: it did not reach all."""

    dlq_url: str
    findings: tuple[DlqFinding, ...]
    more: bool

    def count(self, verdict: DlqVerdict) -> int:
        """How many findings have ``verdict``."""
        return sum(1 for f in self.findings if f.verdict is verdict)


def queue_name(url: str) -> str:
    """The queue's name, the last part of its URL."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def is_current(d: Delivery, job: JobView) -> bool:
    """True when ``d`` is the job's current message (the one a claim would accept):
    the same send id, or, for a message without one (an older producer), a record no
    sender ever gave a send id."""
    if d.send_id is None:
        return job.send_id is None and job.unsent_since is None
    return d.send_id == job.send_id


def judge(d: Delivery, job: JobView | None) -> DlqVerdict:
    """What a DLQ message means for its job (the record as read), before any write:
    :attr:`DlqVerdict.PARKED` means "park it"."""
    if job is None:
        return DlqVerdict.NO_RECORD
    if job.state.terminal:
        return DlqVerdict.FINISHED
    if job.state is JobState.PARKED:
        return DlqVerdict.ALREADY_PARKED
    if job.job_class != d.job_class:
        return DlqVerdict.CLASS_MISMATCH
    if not is_current(d, job):
        return DlqVerdict.SUPERSEDED
    return DlqVerdict.PARKED


def park_reason(dlq_url: str, m: DeadLetter) -> str:
    """The parked record's reason: where the message is, its receive count, why it is
    there, and the way back."""
    return bounded(
        f"its message is in the dead-letter queue {queue_name(dlq_url)} after "
        f"{m.receive_count} receives ({m.reason}): nothing will run it; fix the cause, then "
        f"`sqs-lease jobs resume {m.job_id}`",
        REASON_LIMIT,
    )


def _dead_letter(raw: Mapping[str, Any], item: Delivery | Poison) -> DeadLetter:
    ours = ((raw.get("MessageAttributes") or {}).get(REASON_ATTRIBUTE) or {}).get("StringValue")
    if isinstance(item, Delivery):
        return DeadLetter(
            item.message_id,
            item.receipt_handle,
            item.job_id,
            item.job_class,
            item.send_id,
            item.receive_count,
            item.sent_wall,
            ours or SQS_REDRIVE_REASON,
        )
    return DeadLetter(
        item.message_id, item.receipt_handle, item.job_id, None, None, 0, None, ours or item.reason
    )


def _receive(dlq_url: str, want: int, hold: int, wait_seconds: int) -> Flow[Ok | Err]:
    out = yield from call(
        Call(
            "sqs",
            "ReceiveMessage",
            {
                "QueueUrl": dlq_url,
                "MaxNumberOfMessages": max(1, min(SQS_BATCH, want)),
                "WaitTimeSeconds": wait_seconds,
                "VisibilityTimeout": hold,
                "MessageAttributeNames": [REASON_ATTRIBUTE],
                "MessageSystemAttributeNames": ["ApproximateReceiveCount", "SentTimestamp"],
            },
        )
    )
    return out


def _read_job(req: JobRequests, job_id: str) -> Flow[JobView | Err | None]:
    """The record (None: there is none), or an error outcome."""
    out = yield from call(req.get(job_id))
    if isinstance(out, Err):
        return out
    item = out.response.get("Item")
    if not item:
        return None
    return req.parse(item)


def reconcile_dlq_flow(
    req: JobRequests,
    *,
    dlq_url: str,
    wall_now: float,
    limit: int = 50,
    receives: int | None = None,
    hold: int = DLQ_HOLD_SECONDS,
    wait_seconds: int = 1,
    delete_finished: bool = False,
    dry_run: bool = False,
    by: ReconcileBy = "cli",
    receive_until: float | None = None,
) -> Flow[DlqReport]:
    """Look at up to ``limit`` DLQ messages (at most ``receives`` receive calls; None:
    as many as the limit needs, bounded) and reconcile their jobs' records (see the
    module's doc). ``receive_until`` (lease clock): no receive after the first starts
    once a receive came back later than that (a scheduled sweep's time budget; the
    rest is ``more``). ``delete_finished`` deletes the messages of finished jobs;
    ``dry_run`` writes and deletes nothing. Every message not deleted is made visible
    again before the flow returns. A DLQ or table that does not exist raises
    :class:`ResourceMissing`, a failed receive :class:`AwsCallFailed`."""
    rounds = receives if receives is not None else limit // SQS_BATCH + 10
    held: dict[str, str] = {}  # message id -> receipt handle, to give back
    findings: list[DlqFinding] = []
    looked = 0
    more = False
    last_back: float | None = None  # when the last receive came back (lease clock)
    try:
        for _ in range(rounds):
            if receive_until is not None and last_back is not None and last_back > receive_until:
                more = True  # out of time: the DLQ may hold others
                break
            out = yield from _receive(dlq_url, limit + 1 - looked, hold, wait_seconds)
            last_back = out.received_at
            if isinstance(out, Err):
                raise fail_call(f"receive from the DLQ {queue_name(dlq_url)}", out)
            fresh: list[tuple[Mapping[str, Any], Delivery | Poison]] = []
            for raw in out.response.get("Messages", []):
                item = parse_message(raw, out.sent_at, hold)
                if item.message_id not in held:
                    fresh.append((raw, item))
                held[item.message_id] = item.receipt_handle
            if not fresh:
                break
            for raw, item in fresh:
                looked += 1
                if looked > limit:
                    more = True  # seen, not reconciled: given back untouched
                    continue
                finding = yield from _reconcile_one(
                    req, dlq_url, raw, item, wall_now, delete_finished, dry_run, by
                )
                if finding.verdict is DlqVerdict.DELETED:
                    held.pop(finding.message.message_id, None)
                findings.append(finding)
            if more:
                break
        else:
            more = True  # every receive brought messages: the DLQ may hold others
    except GeneratorExit:
        # Closed midway (its process is gone, or its driver): a closed flow may not
        # yield, and the holds lapse by themselves after DLQ_HOLD_SECONDS.
        raise
    except BaseException:
        yield from _give_back(dlq_url, held)
        raise
    yield from _give_back(dlq_url, held)
    report = DlqReport(dlq_url, tuple(findings), more)
    acted = {
        v.value: report.count(v) for v in (DlqVerdict.PARKED, DlqVerdict.DELETED, DlqVerdict.FAILED)
    }
    if any(acted.values()):
        yield from emit(
            "dlq_reconciled",
            dlq=queue_name(dlq_url),
            by=by,
            looked=len(findings),
            more=more,
            finished=report.count(DlqVerdict.FINISHED),
            superseded=report.count(DlqVerdict.SUPERSEDED),
            **acted,
        )
    return report


def _reconcile_one(
    req: JobRequests,
    dlq_url: str,
    raw: Mapping[str, Any],
    item: Delivery | Poison,
    wall_now: float,
    delete_finished: bool,
    dry_run: bool,
    by: ReconcileBy,
) -> Flow[DlqFinding]:
    m = _dead_letter(raw, item)
    if not isinstance(item, Delivery):
        return DlqFinding(m, DlqVerdict.NOT_A_JOB, detail=m.reason)
    try:
        read = yield from _read_job(req, item.job_id)
    except RecordUnreadable as exc:
        return DlqFinding(m, DlqVerdict.UNREADABLE, detail=str(exc))
    if isinstance(read, Err):
        if read.kind is ErrorKind.NOT_FOUND:
            raise fail_call(f"read job {item.job_id}", read)
        return DlqFinding(m, DlqVerdict.FAILED, detail=_said(read))
    job = read if isinstance(read, JobView) else None
    verdict = judge(item, job)
    state = job.state if job is not None else None
    if verdict is DlqVerdict.PARKED:
        if dry_run:
            return DlqFinding(m, DlqVerdict.WOULD_PARK, state)
        assert job is not None
        return (yield from _park(req, dlq_url, m, item, job, wall_now, by))
    if verdict is DlqVerdict.FINISHED and delete_finished:
        if dry_run:
            return DlqFinding(m, DlqVerdict.WOULD_DELETE, state)
        out = yield from call(
            Call("sqs", "DeleteMessage", {"QueueUrl": dlq_url, "ReceiptHandle": m.receipt_handle})
        )
        if isinstance(out, Err):
            return DlqFinding(m, DlqVerdict.FAILED, state, f"delete failed: {_said(out)}")
        return DlqFinding(m, DlqVerdict.DELETED, state)
    detail = _why_left(verdict, job)
    return DlqFinding(m, verdict, state, detail)


def _why_left(verdict: DlqVerdict, job: JobView | None) -> str:
    if job is not None and verdict is DlqVerdict.SUPERSEDED:
        return f"the job was re-sent since (its send is {job.send_id!r})"
    if job is not None and verdict is DlqVerdict.CLASS_MISMATCH:
        return f"the record's class is {job.job_class!r}"
    return ""


def _park(
    req: JobRequests,
    dlq_url: str,
    m: DeadLetter,
    d: Delivery,
    job: JobView,
    wall_now: float,
    by: ReconcileBy,
) -> Flow[DlqFinding]:
    reason = park_reason(dlq_url, m)
    out = yield from call(
        req.park_dead_lettered(
            d.job_id, job_class=d.job_class, send_id=d.send_id, reason=reason, wall_now=wall_now
        )
    )
    if isinstance(out, Err):
        if out.kind is ErrorKind.CONDITION_FAILED:
            # Changed since the read (claimed through a re-send, finished, parked):
            # judged again from what the record is now, and left.
            try:
                now = req.parse(out.item) if out.item else None
            except RecordUnreadable as exc:
                return DlqFinding(m, DlqVerdict.UNREADABLE, detail=str(exc))
            verdict = judge(d, now)
            if verdict is DlqVerdict.PARKED:  # the write's own condition disagreed
                return DlqFinding(m, DlqVerdict.FAILED, now.state if now else None, _said(out))
            return DlqFinding(m, verdict, now.state if now else None, "changed since read")
        return DlqFinding(m, DlqVerdict.FAILED, job.state, f"park failed: {_said(out)}")
    try:
        old = req.parse(out.response.get("Attributes", {}))
    except RecordUnreadable:
        old = job
    yield from emit(
        "job_dead_lettered",
        job_id=d.job_id,
        job_class=d.job_class,
        token=old.token + 1,
        previous_state=old.state.value,
        previous_owner=old.owner,
        send_id=d.send_id,
        message_id=m.message_id,
        receive_count=m.receive_count,
        dlq=queue_name(dlq_url),
        by=by,
        reason=reason,
    )
    return DlqFinding(m, DlqVerdict.PARKED, JobState.PARKED, reason, old.token + 1)


def _give_back(dlq_url: str, held: Mapping[str, str]) -> Flow[None]:
    """Every message still held becomes visible again at once (best effort: one not
    given back reappears when its hold ends)."""
    handles = list(held.values())
    for i in range(0, len(handles), SQS_BATCH):
        entries = [
            {"Id": str(n), "ReceiptHandle": h, "VisibilityTimeout": 0}
            for n, h in enumerate(handles[i : i + SQS_BATCH])
        ]
        yield from call(
            Call("sqs", "ChangeMessageVisibilityBatch", {"QueueUrl": dlq_url, "Entries": entries})
        )


def _said(err: Err) -> str:
    return f"{err.code or err.kind.value}: {err.message}"


__all__ = [
    "DLQ_HOLD_SECONDS",
    "REASON_ATTRIBUTE",
    "SQS_REDRIVE_REASON",
    "DeadLetter",
    "DlqFinding",
    "DlqReport",
    "DlqVerdict",
    "is_current",
    "judge",
    "park_reason",
    "reconcile_dlq_flow",
]
