"""How an attempt ends, one flow per ending: commit, fail, retry, park, release,
poison; each a fenced write of the record, then the message's fate.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from .calls import Call, Flow, Ok, Outcome, call, emit
from .deadletter import REASON_ATTRIBUTE, SOURCE_ATTRIBUTE
from .fencing import (
    Finish,
    FinishOutcome,
    delete_message,
    end_write_id,
    fenced_write,
    limit_hint,
    set_visibility,
)
from .fifo import (
    copy_deduplication_id,
    fifo_params,
)
from .heartbeats import LossSource, lost_event, rejected_loss
from .limits import REASON_LIMIT, bounded, result_problem
from .messages import Delivery, Poison, by_queue, on_queue
from .records import (
    JobRequests,
    JobState,
    JobView,
    attempts_allowed,
)


@dataclass(frozen=True)
class EndRequest:
    """What every end write of one attempt shares: the record as claimed (its token),
    the message it came on, who writes, when, and the attempt's nonce (its writes'
    ids, :func:`end_write_id`). ``defer_delete``: the caller batches the message's
    delete (``Finish.delete_pending``) instead of the write deleting it at once."""

    queue_url: str
    job: JobView
    delivery: Delivery
    worker_id: str
    wall_now: float
    nonce: str
    defer_delete: bool = False

    @property
    def home(self) -> str:
        """The queue the message came from (priorities: the interactive queue's)."""
        return on_queue(self.delivery, self.queue_url)

    def write_id(self, what: str) -> str:
        """The id of this attempt's ``what`` write (commit, fail, retry, ...)."""
        return end_write_id(self.nonce, what)


def end_attempt(
    req: JobRequests,
    end: EndRequest,
    write: Callable[[str], Call],
    *,
    applied: JobState,
    stage: str,
    delete: bool = True,
) -> Flow[Finish]:
    """A fenced write that ends this attempt; then delete the message (if asked;
    ``end.defer_delete``: the caller batches it, told by ``Finish.delete_pending``;
    deleted here, ``Finish.deleted`` says whether SQS took the delete).
    ``write`` builds the write given its id: the attempt's ``stage`` write
    (``end.write_id(stage)``), decided here alone.

    A rejected write is journaled ``result_rejected`` (never reported as done), an
    unanswered one ``ownership_unknown``; both leave the message alone.
    """
    job, write_id = end.job, end.write_id(stage)
    fin = yield from fenced_write(req, write(write_id), job=job, applied=applied, write_id=write_id)
    if fin.outcome is FinishOutcome.INVALID:
        # DynamoDB refused the write as it can never apply (a size limit, a malformed
        # value, an attribute the record lacks): retrying cannot help, and it is not a
        # question of ownership. End the job failed with the refusal as the reason.
        reason = bounded(
            f"DynamoDB refused the {stage} write: {fin.reason}{limit_hint(fin.reason)}"
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
        # A write that keeps its message (a retry, a stage, a resend) batches no delete.
        failing = end if delete else replace(end, defer_delete=False)
        return (yield from fail_instead(req, failing, reason, "dynamodb_validation"))
    if fin.outcome is FinishOutcome.DONE:
        if delete and end.defer_delete:
            fin = replace(fin, delete_pending=True)
        elif delete:
            out = yield from delete_message(end.home, end.delivery.receipt_handle)
            fin = replace(fin, answered_at=out.received_at, deleted=isinstance(out, Ok))
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


def fail_instead(req: JobRequests, end: EndRequest, reason: str, error_code: str) -> Flow[Finish]:
    """An ending that cannot be written as asked (a result or a stage too large, a
    write DynamoDB refuses): the job fails with ``reason`` instead, reported
    ``failed`` once that write is done (else the fail write's own outcome)."""
    failed = yield from fail_flow(req, end, reason=reason, error_code=error_code)
    if failed.outcome is not FinishOutcome.DONE:
        return failed
    return Finish(
        FinishOutcome.FAILED,
        reason,
        delete_pending=failed.delete_pending,
        deleted=failed.deleted,
    )


def commit_flow(
    req: JobRequests,
    end: EndRequest,
    *,
    result_json: str,
    duration: float,
    keep_rejected_content: bool = False,
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
    job = end.job
    problem = result_problem(
        job.job_id,
        job.payload_json,
        result_json,
        stage_log=job.stage_log,
        stage_input=job.stage_input,
    )
    if problem is not None:
        return (yield from fail_instead(req, end, problem, "result_too_large"))
    fin = yield from end_attempt(
        req,
        end,
        lambda write_id: req.commit(
            job.job_id, job.token, end.worker_id, result_json, end.wall_now, write_id=write_id
        ),
        applied=JobState.SUCCEEDED,
        stage="commit",
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
                end.worker_id,
                result_json,
                end.wall_now,
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


def _error_write(
    req: JobRequests, end: EndRequest, reason: str, error_code: str, *, retry: bool
) -> Flow[Finish]:
    """The fenced write of an attempt that ended in an error, with its reason and code:
    ``failed`` for good (its message then deleted), or with ``retry`` back to
    ``queued`` (its message kept: the retry's backoff is its visibility)."""
    stage = "retry" if retry else "fail"
    job = end.job
    why = bounded(reason, REASON_LIMIT)
    return (
        yield from end_attempt(
            req,
            end,
            lambda write_id: req.end_in_error(
                job.job_id,
                job.token,
                end.worker_id,
                why,
                error_code,
                end.wall_now,
                write_id=write_id,
                retry=retry,
            ),
            applied=JobState.QUEUED if retry else JobState.FAILED,
            stage=stage,
            delete=not retry,
        )
    )


def fail_flow(req: JobRequests, end: EndRequest, *, reason: str, error_code: str) -> Flow[Finish]:
    """End the job ``failed`` with a reason (fenced), then delete its message."""
    fin = yield from _error_write(req, end, reason, error_code, retry=False)
    if fin.outcome is FinishOutcome.DONE:
        job = end.job
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
    end: EndRequest,
    *,
    reason: str,
    error_code: str,
    delay: int,
    max_attempts: int,
    handle_ours: bool = True,
) -> Flow[Finish]:
    """Give the job back for a later attempt: record -> queued (fenced), visibility -> delay.

    When the attempts are spent the job fails instead, with that reason. With
    ``handle_ours`` False (the local lease lapsed: ``LocalLease.handle_ours``) no
    visibility change is sent: the message comes back when its lease runs out,
    without the backoff, rather than risk moving another receive's visibility.
    """
    job = end.job
    if job.attempt >= attempts_allowed(job, max_attempts):
        granted = f" + {job.granted_attempts} granted" if job.granted_attempts else ""
        return (
            yield from fail_flow(
                req,
                end,
                reason=(
                    f"attempts exhausted ({job.attempt} of {max_attempts}{granted}); "
                    f"last error: {reason}"
                ),
                error_code="attempts_exhausted",
            )
        )
    fin = yield from _error_write(req, end, reason, error_code, retry=True)
    if fin.outcome is not FinishOutcome.DONE:
        return fin
    cmv: Outcome | None = None
    if handle_ours:
        cmv = yield from set_visibility(end.home, end.delivery.receipt_handle, delay)
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


def park_flow(req: JobRequests, end: EndRequest, *, reason: str) -> Flow[Finish]:
    """Park the job for an operator (fenced), then delete its message."""
    job = end.job
    why = bounded(reason, REASON_LIMIT)
    fin = yield from end_attempt(
        req,
        end,
        lambda write_id: req.park(
            job.job_id, job.token, end.worker_id, why, end.wall_now, write_id=write_id
        ),
        applied=JobState.PARKED,
        stage="park",
    )
    if fin.outcome is FinishOutcome.DONE:
        yield from emit("job_parked", job_id=job.job_id, token=job.token, reason=reason)
    return fin


def release_write(req: JobRequests, job: JobView, write: Call, write_id: str) -> Flow[Finish]:
    """The fenced write that hands a claimed record back (``req.release``: queued, the
    claim's attempt given back, since the worker, not the job, ended the attempt).
    One that does not apply is journaled ``job_release_skipped`` (its message is the
    new owner's), and a refusal that proves the lease lost, the loss: whoever
    releases on the attempt's behalf stopped it first, so no other path journals it."""
    fin = yield from fenced_write(req, write, job=job, applied=JobState.QUEUED, write_id=write_id)
    if fin.outcome is not FinishOutcome.DONE:
        yield from emit(
            "job_release_skipped", job_id=job.job_id, token=job.token, reason=fin.reason
        )
        loss = rejected_loss(fin)
        if loss is not None:
            ev = lost_event(job.job_id, job.token, LossSource.RELEASE, *loss)
            yield from emit(ev.event, **ev.fields)
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
        fin = yield from release_write(
            req,
            job,
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
            write_id,
        )
        # A write that did not apply leaves the message alone: its visibility is the
        # new owner's (or, unknown, the lease's).
        if fin.outcome is FinishOutcome.DONE:
            if d.receipt_handle in lapsed:
                gone_back += 1
            else:
                handback.append(d)
    released = 0
    for queue, chunk in by_queue(handback, queue_url, lambda d: d.queue_url):
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
) -> Flow[bool]:
    """Move a message nobody can process out of the way, with the reason journaled.

    With a DLQ it is copied there first (so the bytes survive for forensics), then
    deleted; without one it is deleted. It never stops the worker. A FIFO DLQ gets
    the job's id (else the message's) as the group and the message id as the
    deduplication id: a copy repeated because the delete failed stays one copy.
    Returns whether the message was deleted (SQS answered the delete).
    """
    moved = False
    copy_id: str | None = None
    if dlq_url:
        out = yield from call(
            Call(
                "sqs",
                "SendMessage",
                {
                    "QueueUrl": dlq_url,
                    "MessageBody": body or "<empty>",
                    "MessageAttributes": {
                        REASON_ATTRIBUTE: {
                            "DataType": "String",
                            "StringValue": poison.reason[:256],
                        },
                        # The journal names the original; the copy gets an id of its own.
                        SOURCE_ATTRIBUTE: {"DataType": "String", "StringValue": poison.message_id},
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
        if isinstance(out, Ok):
            copy_id = out.response.get("MessageId")
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
            return False
    out = yield from delete_message(on_queue(poison, queue_url), poison.receipt_handle)
    yield from emit(
        "message_poisoned",
        message_id=poison.message_id,
        job_id=poison.job_id,
        reason=poison.reason,
        moved_to_dlq=moved,
        **({"dlq_message_id": copy_id} if moved else {}),
    )
    return isinstance(out, Ok)
