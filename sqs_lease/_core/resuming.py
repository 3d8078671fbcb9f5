"""A parked job resumed (parked -> queued with one attempt granted, its message
sent), or a job queued without a sent message sent again: ``jobs resume``, and the
job half of an operator's ``intents resolve``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .._errors import OwnershipUnknown
from .calls import Err, ErrorKind, Flow, Ok, call, emit
from .intents import outcome_error
from .messages import UNSENT_GRACE_SECONDS, fail_call
from .records import JobRequests, JobState, JobView
from .sending import SendOutcome, SendVerdict, send_record_message
from .sweeping import home_queue


class ResumeVerdict(StrEnum):
    """What a resume did (see :class:`Resumed`)."""

    RESUMED = "resumed"  # parked -> queued, message sent
    RESENT = "resent"  # it was queued without a sent message: sent now
    NOT_PARKED = "not_parked"  # nothing to do


@dataclass(frozen=True)
class Resumed:
    """What a resume did: ``resumed`` (parked -> queued, message sent), ``resent``
    (it was queued without a sent message: sent now), ``not_parked`` (nothing to do)."""

    job_id: str
    verdict: ResumeVerdict
    state: JobState
    note: str
    send_id: str | None = None
    message_id: str | None = None


def resume_flow(
    jreq: JobRequests,
    *,
    queue_url: str,
    job_id: str,
    wall_now: float,
    send_id: str,
    interactive_url: str | None = None,
    say_skipped: bool = True,
) -> Flow[Resumed]:
    """Parked -> queued with one attempt granted, then send its message.

    Retryable: a record that is queued without a sent message (an earlier resume
    or submit whose send failed, a producer that died) is sent again now, under a
    new send id that retires any older message. ``send_id`` is unique to this call.
    ``say_skipped=False``: no ``job_resume_skipped`` event when there is nothing to
    do (an operator's resolve that finds its job half done says it itself).
    """

    def sent_as(job: JobView, verdict: ResumeVerdict) -> Flow[Resumed]:
        was, what, done = _SENT_AS[verdict]
        queue = home_queue(job, queue_url, interactive_url)
        sent = yield from _send(jreq, job, queue, send_id=send_id, wall_now=wall_now, what=what)
        return Resumed(job_id, verdict, was, sent_note(sent, done), send_id, sent.message_id)

    out = yield from call(jreq.unpark(job_id, send_id, wall_now))
    if isinstance(out, Ok):
        job = jreq.parse(out.response.get("Attributes", {}))
        yield from emit("job_resumed", job_id=job_id, send_id=send_id, by="resume")
        return (yield from sent_as(job, ResumeVerdict.RESUMED))
    if out.kind is not ErrorKind.CONDITION_FAILED:
        raise outcome_error(out, "resume job", job_id)
    if out.item is None:
        from .._errors import JobNotFound

        raise JobNotFound(f"no job {job_id!r}")
    current = jreq.parse(out.item)
    if current.state is JobState.QUEUED and not current.message_sent:
        took = yield from call(
            jreq.take_send(
                job_id, seen_send_id=current.send_id, new_send_id=send_id, wall_now=wall_now
            )
        )
        if isinstance(took, Ok):
            job = jreq.parse(took.response.get("Attributes", {}))
            yield from emit(
                "job_send_taken",
                job_id=job_id,
                send_id=send_id,
                previous_send_id=current.send_id,
                unsent_for=(
                    None
                    if current.unsent_since is None
                    else round(wall_now - current.unsent_since, 3)
                ),
                by="resume",
            )
            return (yield from sent_as(job, ResumeVerdict.RESENT))
        if took.kind is not ErrorKind.CONDITION_FAILED:
            raise outcome_error(took, "resume job (take over the send)", job_id)
        if took.item is not None:
            current = jreq.parse(took.item)
    if say_skipped:
        yield from emit("job_resume_skipped", job_id=job_id, state=current.state.value)
    return Resumed(
        job_id, ResumeVerdict.NOT_PARKED, current.state, f"job is {current.state.value}, not parked"
    )


def send_resumed(
    jreq: JobRequests,
    *,
    queue_url: str,
    job_id: str,
    send_id: str,
    wall_now: float,
    what: str,
    interactive_url: str | None = None,
) -> Flow[SendOutcome]:
    """Send the message of a job just unparked (``what``: how it is now, for the
    operator), reading its record first."""
    got = yield from call(jreq.get(job_id))
    if isinstance(got, Err) or not got.response.get("Item"):
        # The unpark is applied (it carries our send id); the sweep or a resume sends it.
        raise OwnershipUnknown(
            f"job {job_id!r} {what}, but it could not be read to send its message: run "
            f"`sqs-lease jobs resume {job_id}`, or a worker's stranded sweep sends it after "
            f"{UNSENT_GRACE_SECONDS:g} s"
        )
    job = jreq.parse(got.response["Item"])
    queue = home_queue(job, queue_url, interactive_url)
    return (yield from _send(jreq, job, queue, send_id=send_id, wall_now=wall_now, what=what))


_SENT_AS: dict[ResumeVerdict, tuple[JobState, str, str]] = {
    # The job's state before, what happened to it (for a failed send's error), and
    # what the operator is told.
    ResumeVerdict.RESUMED: (
        JobState.PARKED,
        "resumed (one attempt granted)",
        "re-enqueued (one attempt granted)",
    ),
    ResumeVerdict.RESENT: (
        JobState.QUEUED,
        "queued",
        "it was queued without a message: message sent",
    ),
}


def _send(
    jreq: JobRequests, job: JobView, queue_url: str, *, send_id: str, wall_now: float, what: str
) -> Flow[SendOutcome]:
    """Send the job's message; an unsent one raises, naming the way on (``what``: what
    happened to the job before the send)."""
    sent = yield from send_record_message(
        jreq, job, queue_url=queue_url, send_id=send_id, wall_now=wall_now
    )
    _raise_unsent(sent, job.job_id, what)
    return sent


def sent_note(sent: SendOutcome, done: str) -> str:
    """What a resume tells its operator (``done``), and that another sender was first."""
    if sent.verdict is SendVerdict.SUPERSEDED:
        return f"{done}; another sender sent its message meanwhile"
    return done


def _raise_unsent(sent: SendOutcome, job_id: str, what: str) -> None:
    if sent.verdict is SendVerdict.FAILED:
        assert sent.error is not None
        raise fail_call(
            f"job {job_id!r} {what}, but its message was not sent: run `sqs-lease jobs resume "
            f"{job_id}` again, or a worker's stranded sweep sends it after "
            f"{UNSENT_GRACE_SECONDS:g} s; send",
            sent.error,
        )
