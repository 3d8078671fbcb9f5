"""The fenced end write shared by every ending: recognising one's own write,
the fenced tries, the visibility change and delete that follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from .._errors import (
    RecordUnreadable,
)
from .calls import Call, Err, ErrorKind, Flow, Ok, Outcome, Sleep, call, emit
from .messages import COMMIT_TRIES
from .records import (
    JobRequests,
    JobState,
    JobView,
)


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
    # The write's own flow deleted the message, and SQS said so (a DeleteMessage of
    # its receipt handle answered with success): what a Lambda record's success is
    # (``invocation.record_flow``), never read from the calls made.
    deleted: bool = False

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


def delete_message(queue_url: str, receipt_handle: str) -> Flow[Outcome]:
    out = yield from call(
        Call("sqs", "DeleteMessage", {"QueueUrl": queue_url, "ReceiptHandle": receipt_handle})
    )
    if isinstance(out, Err):
        # Not a fence and not fatal: a redelivered message meets a terminal record
        # at its claim and is deleted then.
        yield from emit("message_delete_failed", error_code=out.code or out.kind)
    return out


def fenced_write(
    req: JobRequests, build: Call, *, job: JobView, applied: JobState, write_id: str
) -> Flow[Finish]:
    """:func:`_fenced_tries`, its Finish stamped with when it was sent and answered."""
    flow = _fenced_tries(req, build, job, applied, write_id)
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
    req: JobRequests, build: Call, job: JobView, applied: JobState, write_id: str
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


def limit_hint(message: str) -> str:
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
