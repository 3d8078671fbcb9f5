"""The dead-letter queue, for an operator: look at its messages and move them back.

SQS cannot read a message without receiving it, so a look (:func:`peek_dlq`)
receives with a short visibility hold and gives every message back (visibility
0) when done. A redrive (:func:`redrive_dlq`) copies each chosen message to the
job queue and deletes it from the DLQ **only after its copy was sent**: a failed
send leaves the message in the DLQ, a failed delete leaves a second copy there
(a later redrive sends it again, which is harmless: a job claims once, and a
message that is not its job's current one is deleted unclaimed).

SQS's own ``StartMessageMoveTask`` is not used: it moves every message, with no
choice by job, and the local emulator (moto) does not implement it; on AWS the
console's "Start DLQ redrive" is that task.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ._aws import SyncDriver, make_client
from ._config import Settings
from ._core.deadletter import (
    REASON_ATTRIBUTE,
    SOURCE_ATTRIBUTE,
    SQS_REDRIVE_REASON,
    DlqReport,
    reconcile_dlq_flow,
)
from ._core.fifo import copy_deduplication_id, fifo_params
from ._core.messages import Delivery, parse_message
from ._errors import AwsCallFailed, AwsUnavailable, ResourceMissing
from ._resources import _call, check_table, queue_url, redrive
from ._schema.job_requests import JobTable

_BATCH = 10  # SQS's largest receive and batch
_HOLD = 60  # seconds a looked-at message stays hidden while the look goes on


class RedriveVerdict(StrEnum):
    """What a redrive did with one message (``sqs-lease dlq redrive --json`` prints it)."""

    MOVED = "moved"  # copied to the job queue, deleted from the DLQ
    COPIED_NOT_DELETED = "copied_not_deleted"  # copied; the DLQ keeps a second copy
    FAILED = "failed"  # not sent: left in the DLQ
    SKIPPED = "skipped"  # not a job message: left
    WOULD_MOVE = "would_move"  # a dry run


@dataclass(frozen=True)
class DlqMessage:
    """One message in the DLQ: which job it names, and why it is there."""

    message_id: str
    job_id: str | None
    job_class: str | None
    send_id: str | None
    reason: str
    receive_count: int
    sent_at: float | None  # epoch seconds, SQS's clock
    body: str
    is_job_message: bool
    receipt_handle: str = field(repr=False, compare=False, default="")
    attributes: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    group_id: str | None = None  # a FIFO DLQ's MessageGroupId (SQS's redrive keeps it)
    # A worker's copy: the id of the message it moved, as its journal names it
    # (``message_poisoned``). SQS's own redrive keeps the id; a copy has its own.
    source_message_id: str | None = None

    def named_by(self, ident: str) -> bool:
        """Whether an operator's MESSAGE_ID|JOB_ID names this message (the id the
        worker's journal gave a copy it moved names it too)."""
        return ident in (self.message_id, self.job_id, self.source_message_id)


@dataclass(frozen=True)
class Redriven:
    """What a redrive did with one message."""

    message: DlqMessage
    verdict: RedriveVerdict
    detail: str = ""
    new_message_id: str | None = None


@dataclass(frozen=True)
class RedriveReport:
    """Every message a redrive looked at; ``more``: messages it did not reach."""

    queue_url: str
    dlq_url: str
    messages: list[Redriven]
    more: bool


def dlq_url_of(settings: Settings) -> tuple[str, str]:
    """The job queue's URL and its DLQ's (from the queue's redrive policy)."""
    url = queue_url(settings)
    dlq, _ = redrive(settings, url)
    if dlq is None:
        raise ResourceMissing(
            f"queue {settings.queue!r} has no dead-letter queue: run `sqs-lease queue create`"
        )
    return url, dlq


def approximate_depth(settings: Settings, dlq_url: str) -> int:
    """SQS's approximate count of visible messages in the DLQ."""
    sqs = make_client(settings, "sqs")
    attrs = _call(
        sqs,
        "get_queue_attributes",
        QueueUrl=dlq_url,
        AttributeNames=["ApproximateNumberOfMessages"],
    )
    return int(attrs.get("Attributes", {}).get("ApproximateNumberOfMessages", "0"))


def _message_of(raw: dict[str, Any]) -> DlqMessage:
    parsed = parse_message(raw, 0.0, 0)
    attrs = raw.get("MessageAttributes") or {}
    ours = attrs.get(REASON_ATTRIBUTE, {}).get("StringValue")
    source = attrs.get(SOURCE_ATTRIBUTE, {}).get("StringValue")
    system = raw.get("Attributes") or {}
    sent = system.get("SentTimestamp")
    if isinstance(parsed, Delivery):
        job_class, send_id, reason = parsed.job_class, parsed.send_id, SQS_REDRIVE_REASON
    else:
        job_class, send_id, reason = None, None, parsed.reason
    return DlqMessage(
        message_id=str(raw.get("MessageId", "")),
        job_id=parsed.job_id,
        job_class=job_class,
        send_id=send_id,
        reason=ours or reason,
        receive_count=int(system.get("ApproximateReceiveCount", "0")),
        sent_at=int(sent) / 1000 if sent else None,
        body=str(raw.get("Body", "")),
        is_job_message=isinstance(parsed, Delivery),
        receipt_handle=str(raw.get("ReceiptHandle", "")),
        attributes=attrs,
        group_id=system.get("MessageGroupId") or None,
        source_message_id=source or None,
    )


class _Looker:
    """Receives DLQ messages once each (held hidden), and gives back what it keeps."""

    def __init__(self, settings: Settings, dlq_url: str) -> None:
        self.sqs = make_client(settings, "sqs")
        self.dlq_url = dlq_url
        self.seen: set[str] = set()
        self.held: dict[str, str] = {}  # message id -> receipt handle, to give back

    def next_batch(self, want: int) -> list[DlqMessage]:
        got = _call(
            self.sqs,
            "receive_message",
            QueueUrl=self.dlq_url,
            MaxNumberOfMessages=max(1, min(_BATCH, want)),
            VisibilityTimeout=_HOLD,
            WaitTimeSeconds=1,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        ).get("Messages", [])
        fresh = []
        for raw in got:
            msg = _message_of(raw)
            self.held[msg.message_id] = msg.receipt_handle
            if msg.message_id not in self.seen:
                self.seen.add(msg.message_id)
                fresh.append(msg)
        return fresh

    def done_with(self, message_id: str) -> None:
        self.held.pop(message_id, None)

    def give_back(self) -> None:
        """Every message still held becomes visible again at once (best effort: one
        not given back reappears when its hold ends)."""
        handles = list(self.held.items())
        self.held.clear()
        for i in range(0, len(handles), _BATCH):
            entries = [
                {"Id": str(n), "ReceiptHandle": h, "VisibilityTimeout": 0}
                for n, (_, h) in enumerate(handles[i : i + _BATCH])
            ]
            with contextlib.suppress(AwsCallFailed, AwsUnavailable):
                _call(
                    self.sqs,
                    "change_message_visibility_batch",
                    QueueUrl=self.dlq_url,
                    Entries=entries,
                )


def _look(looker: _Looker, limit: int) -> tuple[list[DlqMessage], bool]:
    found: list[DlqMessage] = []
    # Bounded: an empty receive ends it, and so does a round budget.
    for _ in range(limit // _BATCH + 10):
        if len(found) > limit:
            break
        batch = looker.next_batch(limit + 1 - len(found))
        if not batch:
            break
        found.extend(batch)
    return found[:limit], len(found) > limit


def peek_dlq(settings: Settings, *, limit: int = 50) -> tuple[list[DlqMessage], bool]:
    """Up to ``limit`` DLQ messages (oldest first by send time) and whether more
    exist; every message is given back (visible again) before this returns."""
    _, dlq = dlq_url_of(settings)
    looker = _Looker(settings, dlq)
    try:
        found, more = _look(looker, limit)
    finally:
        looker.give_back()
    found.sort(key=lambda m: (m.sent_at or 0.0, m.message_id))
    return found, more


def find_in_dlq(settings: Settings, ident: str, *, scan: int = 1000) -> list[DlqMessage]:
    """The DLQ messages whose message id or job id is ``ident`` (looking at up to
    ``scan`` messages; all given back)."""
    found, _ = peek_dlq(settings, limit=scan)
    return [m for m in found if m.named_by(ident)]


@dataclass(frozen=True)
class Deleted:
    """What ``dlq delete`` did with one message: ``error`` None when SQS deleted it."""

    message: DlqMessage
    error: str | None = None


def delete_from_dlq(
    settings: Settings,
    ident: str,
    *,
    scan: int = 1000,
    confirm: Callable[[list[DlqMessage]], bool] = lambda found: True,
) -> tuple[list[DlqMessage], list[Deleted] | None]:
    """Delete the DLQ messages whose message id or job id is ``ident`` (looking at up
    to ``scan`` messages), once ``confirm`` agreed, shown what was found. The found
    messages stay received (hidden) while ``confirm`` decides; every other message,
    and all of them when ``confirm`` says no, is given back. Returns what was found
    and what each delete did (None: not confirmed, nothing deleted)."""
    _, dlq = dlq_url_of(settings)
    looker = _Looker(settings, dlq)
    try:
        seen, _ = _look(looker, scan)
        found = [m for m in seen if m.named_by(ident)]
        if not found or not confirm(found):
            return found, None
        done: list[Deleted] = []
        for msg in found:
            try:
                _call(
                    looker.sqs,
                    "delete_message",
                    QueueUrl=looker.dlq_url,
                    ReceiptHandle=msg.receipt_handle,
                )
            except (AwsCallFailed, AwsUnavailable) as exc:
                done.append(Deleted(msg, str(exc)))  # given back below: it stays
                continue
            looker.done_with(msg.message_id)
            done.append(Deleted(msg))
        return found, done
    finally:
        looker.give_back()


def redrive_dlq(
    settings: Settings,
    *,
    job_ids: Collection[str] | None = None,
    limit: int = 100,
    dry_run: bool = False,
) -> RedriveReport:
    """Move DLQ messages back to the job queue: each is sent to the queue, then
    deleted from the DLQ only if the send succeeded.

    ``job_ids`` limits it to those jobs' messages; messages that name no job (a
    body that is not a job message) are skipped and stay. At most ``limit``
    messages are looked at; ``more`` says whether the DLQ holds others.
    """
    url, dlq = dlq_url_of(settings)
    looker = _Looker(settings, dlq)
    wanted = set(job_ids) if job_ids is not None else None
    out: list[Redriven] = []
    try:
        found, more = _look(looker, limit)
        for msg in found:
            if wanted is not None and msg.job_id not in wanted:
                continue  # not asked for: given back untouched
            if not msg.is_job_message:
                out.append(
                    Redriven(msg, RedriveVerdict.SKIPPED, f"not a job message ({msg.reason}): left")
                )
                continue
            if dry_run:
                out.append(Redriven(msg, RedriveVerdict.WOULD_MOVE))
                continue
            out.append(_move_one(looker, url, msg))
    finally:
        looker.give_back()
    return RedriveReport(url, dlq, out, more)


def reconcile_dlq(
    settings: Settings,
    *,
    limit: int = 50,
    delete_finished: bool = False,
    dry_run: bool = False,
    driver: SyncDriver | None = None,
) -> DlqReport:
    """Reconcile up to ``limit`` DLQ messages with their jobs' records (the decisions
    are the core's, :mod:`sqs_lease._core.deadletter`): a job whose current message
    SQS moved to the DLQ while its record says ``queued`` or ``running`` is parked
    with the reason; finished jobs' messages are reported (deleted with
    ``delete_finished``); everything else is left. ``dry_run`` changes nothing."""
    _, dlq = dlq_url_of(settings)
    check_table(settings)
    return (driver or SyncDriver(settings)).run(
        reconcile_dlq_flow(
            JobTable(settings.jobs_table),
            dlq_url=dlq,
            wall_now=time.time(),
            limit=limit,
            delete_finished=delete_finished,
            dry_run=dry_run,
            by="cli",
        )
    )


def _move_one(looker: _Looker, url: str, msg: DlqMessage) -> Redriven:
    attrs = {
        name: {k: v for k, v in value.items() if k in ("DataType", "StringValue", "BinaryValue")}
        for name, value in msg.attributes.items()
        # Why it was dead-lettered, and which message it was copied from: history now.
        if name not in (REASON_ATTRIBUTE, SOURCE_ATTRIBUTE)
    }
    params: dict[str, Any] = {
        "QueueUrl": url,
        "MessageBody": msg.body,
        # A FIFO queue: the message's own group, and a deduplication id of this copy
        # (never the send id: SQS would drop it as a duplicate of the original send
        # for 5 minutes); a copy repeated after a lost answer stays one copy.
        **fifo_params(
            url,
            group_id=msg.group_id or msg.job_id or msg.message_id,
            dedup_id=copy_deduplication_id("redrive", msg.message_id),
        ),
    }
    if attrs:
        params["MessageAttributes"] = attrs
    try:
        sent = _call(looker.sqs, "send_message", **params)
    except (AwsCallFailed, AwsUnavailable) as exc:
        return Redriven(
            msg, RedriveVerdict.FAILED, f"send to the job queue failed, left in the DLQ: {exc}"
        )
    new_id = str(sent.get("MessageId", ""))
    try:
        _call(
            looker.sqs, "delete_message", QueueUrl=looker.dlq_url, ReceiptHandle=msg.receipt_handle
        )
    except (AwsCallFailed, AwsUnavailable) as exc:
        # Its copy is on the job queue; this one reappears in the DLQ after the hold.
        looker.done_with(msg.message_id)
        return Redriven(
            msg,
            RedriveVerdict.COPIED_NOT_DELETED,
            f"sent, but the DLQ copy could not be deleted ({exc}); a later redrive sends it "
            "again, which is harmless (the job claims once)",
            new_id,
        )
    looker.done_with(msg.message_id)
    return Redriven(msg, RedriveVerdict.MOVED, "", new_id)


def age(ts: float | None, now: float | None = None) -> str:
    """``12.3s`` since ``ts`` (epoch seconds), or ``-``."""
    if ts is None:
        return "-"
    return f"{(now if now is not None else time.time()) - ts:.1f}s"
