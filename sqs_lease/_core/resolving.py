"""An operator's decision on an ambiguous intent (confirmed, retry, abandon, a new
operation under a successor key), settled together with its parked job's resume.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NotRequired, Protocol, TypedDict, Unpack

from .._errors import OwnershipUnknown
from .calls import Call, Err, ErrorKind, Flow, Ok, Sleep, call, emit
from .intents import IntentState, IntentView, outcome_error
from .intentwrites import RETRY_WAITS, cancel_codes, transient_cancel
from .records import JobRequests, JobState, JobView
from .resuming import ResumeVerdict, resume_flow, send_resumed, sent_note


class Resolution(StrEnum):
    """An operator's decision on an ambiguous intent."""

    CONFIRMED = "confirmed"
    RETRY = "retry"
    ABANDON = "abandon"
    NEW_OPERATION = "new_operation"  # approve a new, separate operation under a derived key


SUCCESSOR_MARK = "~op"


def successor_key(key: str) -> str:
    """The key of the operation that replaces ``key``: ``KEY~op2``, then ``KEY~op3``.

    Derived, never chosen: the same decision on the same intent always names the
    same successor, and the mark says to anyone reading the target's log that this
    is a new operation, not a repeat of the old one.
    """
    base, mark, n = key.rpartition(SUCCESSOR_MARK)
    if mark and n.isdigit() and base:
        return f"{base}{SUCCESSOR_MARK}{int(n) + 1}"
    return f"{key}{SUCCESSOR_MARK}2"


class Decision(TypedDict):
    """An operator's decision on an ambiguous intent, as ``ResolveRequests`` write it."""

    resolution: Resolution
    external_id: str | None
    who: str
    why: str
    wall_now: float
    attempt: NotRequired[int | None]  # the attempt whose ambiguity it decides


class ResolveRequests(Protocol):
    """The intent store's requests an operator's decision needs
    (``_schema.intent_requests.IntentTable``)."""

    def resolve(self, key: str, **decision: Unpack[Decision]) -> Call: ...

    def resolve_and_unpark(
        self,
        key: str,
        *,
        jobs: JobRequests,
        job_id: str,
        send_id: str,
        **decision: Unpack[Decision],
    ) -> Call: ...

    def get(self, key: str) -> Call: ...

    def parse(self, item: Mapping[str, Any]) -> IntentView: ...


@dataclass(frozen=True)
class Resolved:
    """What a resolve did: the intent as settled, and what happened to its job."""

    intent: IntentView
    job_requeued: bool
    job_state: JobState | None  # the job's state before the resolution touched it
    note: str = ""  # what happened to the job, in the operator's words
    finished_earlier: bool = False  # an earlier resolution's job half was finished now


def resolve_flow(
    ireq: ResolveRequests,
    jreq: JobRequests,
    *,
    queue_url: str,
    key: str,
    resolution: Resolution,
    external_id: str | None,
    who: str,
    why: str,
    wall_now: float,
    send_id: str,
    interactive_url: str | None = None,
    attempt: int | None = None,
) -> Flow[Resolved]:
    """An operator's decision on an ambiguous intent, and the parked job's resume,
    as one decision.

    A decision is about one ambiguity: the intent's attempt the operator judged
    (``attempt``, as ``intents show`` prints it; else the attempt this call reads).
    The write is conditioned on it, so a decision never settles a later attempt's
    ambiguity: a command run again after the job was resumed, ran and went
    ambiguous again (the runbook's "run the same command again") is refused with
    "changed meanwhile" instead of telling a second call it may repeat an effect
    the first one may have applied (soak seed 57932).

    Settling the intent and unparking its job (granting the attempt the resume
    starts) are one TransactWriteItems: either both happen or neither. The message
    is sent after it; should that fail, the job is queued without a message, and
    ``jobs resume``, a second ``resolve`` or the workers' stranded sweep sends it.
    A ``resolve`` of an intent an earlier resolution settled finishes that
    resolution's job half (a parked job or an unsent message) instead of saying
    there is nothing to resolve. ``send_id`` is unique to this call.
    """
    from .._errors import IntentError, IntentNotAmbiguous, IntentNotFound

    got = yield from call(ireq.get(key))
    if isinstance(got, Err):
        raise outcome_error(got, "read intent", key)
    item = got.response.get("Item")
    if not item:
        raise IntentNotFound(f"no intent {key!r}")
    intent = ireq.parse(item)
    if attempt is not None and intent.attempts != attempt:
        raise IntentError(
            f"intent {key!r} changed meanwhile: the decision was about its attempt "
            f"{attempt}; it is now {intent.state.value} at attempt {intent.attempts}: "
            f"nothing resolved; look at `sqs-lease intents show {key}` and decide again"
        )
    judged = intent.attempts

    def finish(settled: IntentView) -> Flow[Resolved | None]:
        return _finish_earlier(
            jreq,
            settled,
            queue_url=queue_url,
            wall_now=wall_now,
            send_id=send_id,
            interactive_url=interactive_url,
        )

    if intent.state is not IntentState.AMBIGUOUS:
        if intent.resolution is not None or _settled_late(intent, resolution):
            finished = yield from finish(intent)
            if finished is not None:
                return finished
        raise IntentNotAmbiguous(
            f"intent {key!r} is {intent.state}{_late_note(intent)}, not ambiguous: "
            "nothing to resolve",
            state=intent.state.value,
            final=intent.state
            in (IntentState.CONFIRMED, IntentState.ABANDONED, IntentState.SUPERSEDED),
        )
    decision = Decision(
        resolution=resolution,
        external_id=external_id,
        who=who,
        why=why,
        wall_now=wall_now,
        attempt=judged,
    )
    waits = iter(RETRY_WAITS)
    while True:
        out = yield from call(
            ireq.resolve_and_unpark(
                key, jobs=jreq, job_id=intent.job_id, send_id=send_id, **decision
            )
        )
        if not (isinstance(out, Err) and transient_cancel(out)):
            break
        # Throttled or in conflict: nothing applied, and it says nothing about the
        # job (taking it for "not parked" settled the intent alone, leaving the job
        # parked: soak seed 300478). Try the one decision again.
        wait = next(waits, None)
        if wait is None:
            raise OwnershipUnknown(
                f"resolve intent {key!r}: DynamoDB cancelled it for a transient reason "
                f"({', '.join(cancel_codes(out))}); nothing was resolved: run the same "
                f"`sqs-lease intents resolve` again with `--attempt {judged}`"
            )
        yield from call(Sleep(wait))
    if isinstance(out, Err):
        if out.kind is not ErrorKind.TRANSACTION_CANCELLED:
            raise OwnershipUnknown(
                f"resolve intent {key!r}: no answer ({out.code or out.kind}): run the same "
                f"`sqs-lease intents resolve` again with `--attempt {judged}`; it finishes "
                "whatever was applied, and refuses if the intent moved on meanwhile"
            )
        codes = [str(r.get("Code", "")) for r in out.reasons]
        if not codes or codes[0] == "ConditionalCheckFailed":
            reread = yield from call(ireq.get(key))
            now_item = reread.response.get("Item") if isinstance(reread, Ok) else None
            now = ireq.parse(now_item) if now_item else None
            if now is not None and now.resolution is None and _settled_late(now, resolution):
                # The attempt's own answer confirmed it between our read and our
                # write: the decision is not applied; the parked job is resumed.
                finished = yield from finish(now)
                if finished is not None:
                    return finished
            state = now.state.value if now else "gone"
            by = f" by {now.resolved_by}" if now is not None and now.resolved_by else ""
            raise IntentError(
                f"intent {key!r} changed meanwhile (now {state}{by}{_late_note(now)}): "
                "nothing resolved; look at `sqs-lease intents show` and decide again"
            )
        # The intent is ambiguous but its job is not parked (cancelled, failed, or
        # still on its way to parking): settle the intent alone, and say so.
        return (
            yield from _resolve_intent_only(
                ireq, jreq, out, key=key, job_id=intent.job_id, decision=decision
            )
        )
    resolved = _as_resolved(intent, resolution, external_id, who)
    yield from _emit_resolved(intent, decision)
    yield from emit("job_resumed", job_id=intent.job_id, send_id=send_id, by="resolve")
    sent = yield from send_resumed(
        jreq,
        queue_url=queue_url,
        job_id=intent.job_id,
        send_id=send_id,
        wall_now=wall_now,
        what=f"is queued (intent {key!r} resolved: {resolution.value})",
        interactive_url=interactive_url,
    )
    return Resolved(
        resolved,
        True,
        JobState.PARKED,
        sent_note(sent, "re-enqueued (one attempt granted)"),
    )


def _settled_late(intent: IntentView, resolution: Resolution) -> bool:
    """Was the intent confirmed by its attempt's own late answer (the call applied
    after the intent was parked ambiguous), where the decision asked for wants the
    effect to stand once (confirmed, retry)? Then a resolve finishes the job half:
    the parked job resumes and replays the outcome. An abandon or a new operation
    is the operator's to take again, knowing it applied."""
    return (
        intent.state is IntentState.CONFIRMED
        and intent.confirmed_late is not None
        and resolution in (Resolution.CONFIRMED, Resolution.RETRY)
    )


def _late_note(intent: IntentView | None) -> str:
    if intent is None or intent.confirmed_late is None:
        return ""
    return (
        f", by its attempt {intent.attempts}'s own answer, which came after it was "
        f"{intent.confirmed_late}: the call applied"
        + (f" (external id {intent.external_id})" if intent.external_id else "")
    )


def _emit_resolved(intent: IntentView, decision: Decision) -> Flow[None]:
    yield from emit(
        "intent_resolved",
        key=intent.key,
        job_id=intent.job_id,
        resolution=decision["resolution"].value,
        external_id=decision["external_id"],
        who=decision["who"],
        reason=decision["why"],
    )


def _as_resolved(
    intent: IntentView, resolution: Resolution, external_id: str | None, who: str
) -> IntentView:
    state = {
        Resolution.CONFIRMED: IntentState.CONFIRMED,
        Resolution.RETRY: IntentState.PREPARED,
        Resolution.ABANDON: IntentState.ABANDONED,
        Resolution.NEW_OPERATION: IntentState.SUPERSEDED,
    }[resolution]
    return IntentView(
        key=intent.key,
        job_id=intent.job_id,
        action=intent.action,
        target=intent.target,
        state=state,
        payload_hash=intent.payload_hash,
        attempts=intent.attempts,
        payload_json=intent.payload_json,
        response_json=intent.response_json,
        external_id=external_id if resolution is Resolution.CONFIRMED else intent.external_id,
        last_token=intent.last_token,
        reason=intent.reason,
        resolution=resolution.value,
        resolved_by=who,
        successor=successor_key(intent.key)
        if resolution is Resolution.NEW_OPERATION
        else intent.successor,
    )


def _resolve_intent_only(
    ireq: ResolveRequests,
    jreq: JobRequests,
    cancelled: Err,
    *,
    key: str,
    job_id: str,
    decision: Decision,
) -> Flow[Resolved]:
    from .._errors import IntentError

    job_item = cancelled.reasons[1].get("Item") if len(cancelled.reasons) > 1 else None
    job: JobView | None = jreq.parse(job_item) if job_item else None
    if job is None:
        read = yield from call(jreq.get(job_id))
        if isinstance(read, Ok) and read.response.get("Item"):
            job = jreq.parse(read.response["Item"])
    out = yield from call(ireq.resolve(key, **decision))
    if isinstance(out, Err):
        if out.kind is ErrorKind.CONDITION_FAILED:
            raise IntentError(f"intent {key!r} changed meanwhile: nothing resolved; decide again")
        raise outcome_error(out, "resolve intent", key)
    intent = ireq.parse(out.response.get("Attributes", {}))
    yield from _emit_resolved(intent, decision)
    state = job.state if job is not None else None
    yield from emit("job_resume_skipped", job_id=job_id, state=state.value if state else None)
    where = f"is {state.value}" if state is not None else "has no record"
    note = (
        f"not re-enqueued: it {where}, not parked (should it park later, run "
        "this resolve again to resume it)"
    )
    return Resolved(intent, False, state, note)


def _finish_earlier(
    jreq: JobRequests,
    intent: IntentView,
    *,
    queue_url: str,
    wall_now: float,
    send_id: str,
    interactive_url: str | None = None,
) -> Flow[Resolved | None]:
    """An intent an earlier resolution settled: resume its job if that half is missing."""
    resumed = yield from resume_flow(
        jreq,
        queue_url=queue_url,
        job_id=intent.job_id,
        wall_now=wall_now,
        send_id=send_id,
        interactive_url=interactive_url,
        say_skipped=False,
    )
    if resumed.verdict is ResumeVerdict.NOT_PARKED:
        return None  # nothing half done: the caller says there is nothing to resolve
    yield from emit(
        "intent_resolution_finished",
        key=intent.key,
        job_id=intent.job_id,
        resolution=intent.resolution,
        verdict=resumed.verdict.value,
    )
    settled = (
        f"confirmed{_late_note(intent)}; the decision was not applied"
        if intent.resolution is None
        else f"resolved ({intent.resolution}"
        f"{' by ' + intent.resolved_by if intent.resolved_by else ''})"
    )
    note = (
        f"the intent was already {settled}; its job was "
        + (
            "still parked: "
            if resumed.verdict is ResumeVerdict.RESUMED
            else "queued without a message: "
        )
        + resumed.note
    )
    return Resolved(intent, True, resumed.state, note, finished_earlier=True)
