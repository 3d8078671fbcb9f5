"""Side effects as intents: prepare, start (fenced), call, confirm, reconcile.

An intent is written *before* a call that changes the outside world, under a
stable key built in code. It moves ``prepared -> in_progress`` only in a
transaction that also checks the job's token, so a worker that lost its lease
cannot start an effect. The attempt log, apart from the intent, records what
each attempt observed. An intent found ``in_progress`` (after a takeover, a
restart or a timeout) is reconciled with the target's own answer, never retried
blindly; when nobody can tell, it turns ``ambiguous`` and the job is parked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from .._errors import (
    IntentAmbiguous,
    IntentPayloadMismatch,
    LeaseLost,
    OwnershipUnknown,
    PermanentError,
    ToolOutcomeUnknown,
    TransientError,
)
from .calls import Call, Err, ErrorKind, Flow, Invoke, Ok, call, emit
from .flows import _fail_call, message_body
from .records import JobRequests, JobState

MAX_REPEATS = 3
"""Repeats of one effect (same key, same payload) inside one attempt, after the
target's check said the call certainly did not apply."""


class IntentState(StrEnum):
    PREPARED = "prepared"
    IN_PROGRESS = "in_progress"
    CONFIRMED = "confirmed"
    AMBIGUOUS = "ambiguous"
    ABANDONED = "abandoned"


@dataclass(frozen=True)
class IntentView:
    key: str
    job_id: str
    action: str
    target: str
    state: IntentState
    payload_hash: str
    attempts: int = 0
    payload_json: str | None = None
    response_json: str | None = None
    external_id: str | None = None
    last_token: int = 0
    reason: str | None = None


class Verdict(StrEnum):
    """A target's answer to "did this key apply?"."""

    CONFIRMED = "confirmed"
    NOT_APPLIED = "not_applied"
    CANNOT_TELL = "cannot_tell"


@dataclass(frozen=True)
class CheckAnswer:
    verdict: Verdict
    external_id: str | None = None
    response: Mapping[str, Any] | None = None
    detail: str = ""


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returned: the response to store and the target's id for it."""

    response: Mapping[str, Any]
    external_id: str | None = None


@dataclass(frozen=True)
class EffectResult:
    response: Mapping[str, Any]
    external_id: str | None
    replayed: bool = False
    reconciled: bool = False
    key: str = ""


@dataclass(frozen=True)
class EffectSpec:
    key: str
    job_id: str
    stage: str
    action: str
    target: str
    payload_json: str
    payload_hash: str
    tool: Callable[[], Any]  # returns ToolResult (or a mapping); raises on failure
    check: Callable[[IntentView], CheckAnswer] | None = None
    lease_check: Callable[[], None] | None = None
    log_bodies: bool = False
    key_retention_seconds: float | None = None  # how long the target keeps keys


def default_key(job_id: str, stage: str, action: str, target: str, version: str | None) -> str:
    """The default intent key: source event (job id), stage, action, target (+ version)."""
    key = f"{job_id}:{stage}:{action}:{target}"
    return f"{key}:v{version}" if version else key


class IntentRequests(Protocol):
    def prepare(self, spec: EffectSpec, wall_now: float) -> Call: ...

    def start(
        self,
        spec: EffectSpec,
        *,
        jobs: JobRequests,
        token: int,
        worker_id: str,
        expected: IntentState,
        attempts: int,
        wall_now: float,
    ) -> Call: ...

    def confirm(
        self,
        key: str,
        *,
        attempt: int,
        response_json: str,
        external_id: str | None,
        wall_now: float,
        log_response: str,
        reconciled: bool,
    ) -> Call: ...

    def attempt_failed(
        self, key: str, *, attempt: int, outcome: str, error: str, wall_now: float, reopen: bool
    ) -> Call: ...

    def mark_ambiguous(self, key: str, *, attempts: int, reason: str, wall_now: float) -> Call: ...

    def get(self, key: str) -> Call: ...

    def parse(self, item: Mapping[str, Any]) -> IntentView: ...


def _bounded(value: Any, limit: int) -> str:
    text = json.dumps(value, default=str, sort_keys=True, separators=(",", ":"))
    if len(text) <= limit:
        return text
    return json.dumps({"truncated": True, "bytes": len(text), "head": text[: limit - 60]})


RESPONSE_LIMIT = 16_000
LOG_LIMIT = 2_000


def effect_flow(
    ireq: IntentRequests,
    jreq: JobRequests,
    *,
    spec: EffectSpec,
    token: int,
    worker_id: str,
    wall_now: float,
) -> Flow[EffectResult]:
    """The whole life of one side effect, from intent to confirmation."""
    key = spec.key
    out = yield from call(ireq.prepare(spec, wall_now))
    expected, attempts = IntentState.PREPARED, 0
    reconcile_first = False
    stored: IntentView | None = None
    if isinstance(out, Ok):
        yield from emit(
            "intent_prepared",
            job_id=spec.job_id,
            key=key,
            action=spec.action,
            target=spec.target,
            payload_hash=spec.payload_hash,
            token=token,
        )
    elif out.kind is ErrorKind.CONDITION_FAILED and out.item is not None:
        existing = ireq.parse(out.item)
        if existing.payload_hash != spec.payload_hash:
            yield from emit(
                "intent_refused",
                job_id=spec.job_id,
                key=key,
                reason="payload_mismatch",
                payload_hash=spec.payload_hash,
                stored_hash=existing.payload_hash,
            )
            raise IntentPayloadMismatch(
                f"intent {key!r} exists with payload hash {existing.payload_hash[:12]}, this "
                f"call has {spec.payload_hash[:12]}: a changed intention needs its own key "
                "(pass version=... or another key)"
            )
        settled = yield from _settled(existing, spec, token)
        if settled is not None:
            return settled
        expected, attempts = existing.state, existing.attempts
        reconcile_first = existing.state is IntentState.IN_PROGRESS
        stored = existing
    else:
        raise _unknown(out, "prepare intent", key)

    repeats = 0
    while True:
        if reconcile_first:
            decision = yield from _reconcile(ireq, spec, attempts, token, wall_now, stored)
            if isinstance(decision, EffectResult):
                return decision
            expected = IntentState.IN_PROGRESS
            repeats += 1
            if repeats > MAX_REPEATS:
                raise TransientError(
                    f"intent {key!r}: not applied after {MAX_REPEATS} repeats", code="repeats"
                )
        if spec.lease_check is not None:
            lc = yield from call(Invoke("lease_check", spec.lease_check))
            if isinstance(lc, Err) and lc.exc is not None:
                raise lc.exc
        started = yield from call(
            ireq.start(
                spec,
                jobs=jreq,
                token=token,
                worker_id=worker_id,
                expected=expected,
                attempts=attempts,
                wall_now=wall_now,
            )
        )
        if isinstance(started, Err):
            yield from _refused_start(ireq, spec, started, token, attempts + 1)
        attempts += 1
        yield from emit(
            "intent_started",
            job_id=spec.job_id,
            key=key,
            action=spec.action,
            target=spec.target,
            attempt=attempts,
            token=token,
            payload_hash=spec.payload_hash,
        )
        yield from emit(
            "tool_request_started",
            job_id=spec.job_id,
            key=key,
            tool=spec.target,
            action=spec.action,
            attempt=attempts,
            token=token,
        )
        res = yield from call(Invoke("tool", spec.tool))
        duration = round(res.received_at - res.sent_at, 3)
        if isinstance(res, Ok):
            value = res.response.get("value")
            result = (
                value
                if isinstance(value, ToolResult)
                else ToolResult(dict(value) if isinstance(value, Mapping) else {"value": value})
            )
            yield from emit(
                "tool_request_finished",
                job_id=spec.job_id,
                key=key,
                tool=spec.target,
                attempt=attempts,
                token=token,
                duration=duration,
                external_id=result.external_id,
            )
            return (
                yield from _confirm(
                    ireq,
                    spec,
                    attempts,
                    result.response,
                    result.external_id,
                    wall_now,
                    reconciled=False,
                )
            )
        exc = res.exc
        unknown = isinstance(exc, (ToolOutcomeUnknown, TimeoutError))
        yield from emit(
            "tool_request_failed",
            job_id=spec.job_id,
            key=key,
            tool=spec.target,
            attempt=attempts,
            token=token,
            duration=duration,
            error_code=res.code,
            outcome_unknown=unknown,
        )
        # A plain exception says "certainly not applied": the intent goes back to
        # prepared so a later attempt repeats it with the same key and payload.
        # "Cannot tell" keeps it in_progress and goes to reconciliation.
        yield from call(
            ireq.attempt_failed(
                key,
                attempt=attempts,
                outcome="unknown" if unknown else "failed",
                error=f"{res.code}: {res.message}"[:LOG_LIMIT],
                wall_now=wall_now,
                reopen=not unknown,
            )
        )
        if not unknown:
            assert exc is not None
            raise exc
        reconcile_first = True


def _settled(existing: IntentView, spec: EffectSpec, token: int) -> Flow[EffectResult | None]:
    """An intent some earlier attempt or an operator already decided: replay or refuse.

    Returns None when it is still open (prepared or in progress).
    """
    key = spec.key
    if existing.state is IntentState.CONFIRMED:
        yield from emit(
            "intent_replayed",
            job_id=spec.job_id,
            key=key,
            external_id=existing.external_id,
            token=token,
        )
        return EffectResult(
            json.loads(existing.response_json or "{}"), existing.external_id, True, False, key
        )
    if existing.state is IntentState.AMBIGUOUS:
        raise IntentAmbiguous(f"intent {key!r} is ambiguous and waits for an operator")
    if existing.state is IntentState.ABANDONED:
        raise PermanentError(
            f"intent {key!r} was abandoned by an operator: {existing.reason}",
            code="intent_abandoned",
        )
    return None


def _unknown(out: Err, what: str, key: str) -> BaseException:
    if out.kind is ErrorKind.NOT_FOUND:
        return _fail_call(f"{what} {key!r}", out)
    return OwnershipUnknown(f"{what} {key!r}: {out.code or out.kind}: {out.message}")


def _read_intent(ireq: IntentRequests, key: str) -> Flow[IntentView | None]:
    out = yield from call(ireq.get(key))
    if isinstance(out, Err):
        return None
    item = out.response.get("Item")
    return ireq.parse(item) if item else None


def _refused_start(
    ireq: IntentRequests, spec: EffectSpec, err: Err, token: int, attempt: int
) -> Flow[None]:
    """Why did the start transaction fail? Returns only if it was our own start after all."""
    if err.kind is ErrorKind.TRANSACTION_CANCELLED:
        codes = [str(r.get("Code", "")) for r in err.reasons]
        job_failed = bool(codes) and codes[0] == "ConditionalCheckFailed"
        if not job_failed and codes:
            # The job is still ours; the intent is not as we saw it. A retried
            # transaction whose first try applied looks exactly like this: the
            # intent then shows our attempt and our token.
            now = yield from _read_intent(ireq, spec.key)
            if (
                now is not None
                and now.state is IntentState.IN_PROGRESS
                and now.attempts == attempt
                and now.last_token == token
            ):
                return
        yield from emit(
            "intent_start_refused",
            job_id=spec.job_id,
            key=spec.key,
            token=token,
            reason="token_moved" if job_failed or not codes else "intent_moved",
        )
        if job_failed or not codes:
            raise LeaseLost(
                f"intent {spec.key!r} not started: job {spec.job_id} token {token} is no "
                "longer current"
            )
        raise LeaseLost(f"intent {spec.key!r} changed under us; another attempt owns it")
    raise _unknown(err, "start intent", spec.key)


def _confirm(
    ireq: IntentRequests,
    spec: EffectSpec,
    attempt: int,
    response: Mapping[str, Any],
    external_id: str | None,
    wall_now: float,
    *,
    reconciled: bool,
) -> Flow[EffectResult]:
    out = yield from call(
        ireq.confirm(
            spec.key,
            attempt=attempt,
            response_json=_bounded(dict(response), RESPONSE_LIMIT),
            external_id=external_id,
            wall_now=wall_now,
            log_response=_bounded(dict(response), LOG_LIMIT) if spec.log_bodies else "",
            reconciled=reconciled,
        )
    )
    if isinstance(out, Err) and out.kind is ErrorKind.TRANSACTION_CANCELLED:
        # A retried confirm whose first try applied (or another owner's reconcile)
        # finds the intent confirmed already: that is the outcome we wanted.
        now = yield from _read_intent(ireq, spec.key)
        if now is not None and now.state is IntentState.CONFIRMED:
            yield from emit(
                "intent_confirmed",
                job_id=spec.job_id,
                key=spec.key,
                external_id=now.external_id,
                attempt=attempt,
                reconciled=reconciled,
                already=True,
            )
            return EffectResult(
                json.loads(now.response_json or "{}"), now.external_id, False, reconciled, spec.key
            )
    if isinstance(out, Err):
        # The effect happened but is not recorded: the intent stays in_progress and
        # the next owner reconciles it with the target. Nothing more may run now.
        yield from emit(
            "ownership_unknown",
            job_id=spec.job_id,
            key=spec.key,
            stage="intent_confirm",
            error_code=out.code or out.kind.value,
        )
        raise _unknown(out, "confirm intent", spec.key)
    yield from emit(
        "intent_confirmed",
        job_id=spec.job_id,
        key=spec.key,
        external_id=external_id,
        attempt=attempt,
        reconciled=reconciled,
    )
    return EffectResult(dict(response), external_id, False, reconciled, spec.key)


def _reconcile(
    ireq: IntentRequests,
    spec: EffectSpec,
    attempts: int,
    token: int,
    wall_now: float,
    stored: IntentView | None = None,
) -> Flow[EffectResult | None]:
    """Ask the target what happened to an in-progress intent.

    Returns the confirmed result, or None when the call certainly did not apply
    (repeat it, same key and payload). Raises IntentAmbiguous after marking the
    intent when nobody can tell.
    """
    check = spec.check
    view = stored or IntentView(
        spec.key,
        spec.job_id,
        spec.action,
        spec.target,
        IntentState.IN_PROGRESS,
        spec.payload_hash,
        attempts=attempts,
        payload_json=spec.payload_json,
        last_token=token,
    )
    if check is None:
        answer = CheckAnswer(Verdict.CANNOT_TELL, detail="no check registered")
    else:
        out = yield from call(Invoke("check", lambda: check(view)))
        if isinstance(out, Ok) and isinstance(out.response.get("value"), CheckAnswer):
            answer = out.response["value"]
        elif isinstance(out, Ok):
            answer = CheckAnswer(Verdict.CANNOT_TELL, detail="check returned no CheckAnswer")
        else:
            answer = CheckAnswer(Verdict.CANNOT_TELL, detail=f"check raised {out.code}")
    yield from emit(
        "intent_reconciled",
        job_id=spec.job_id,
        key=spec.key,
        verdict=answer.verdict.value,
        external_id=answer.external_id,
        attempt=attempts,
        token=token,
    )
    if answer.verdict is Verdict.CONFIRMED:
        return (
            yield from _confirm(
                ireq,
                spec,
                attempts,
                answer.response or {},
                answer.external_id,
                wall_now,
                reconciled=True,
            )
        )
    if answer.verdict is Verdict.NOT_APPLIED:
        return None
    reason = f"cannot tell whether {spec.action} at {spec.target} applied: {answer.detail}"
    out2 = yield from call(
        ireq.mark_ambiguous(spec.key, attempts=attempts, reason=reason, wall_now=wall_now)
    )
    if isinstance(out2, Err):
        if out2.kind is not ErrorKind.CONDITION_FAILED or out2.item is None:
            raise _unknown(out2, "mark intent ambiguous", spec.key)
        # The intent moved while the target was asked (e.g. the earlier owner's
        # late confirmation landed): act on what it is now, never park blindly.
        current = ireq.parse(out2.item)
        settled = yield from _settled(current, spec, token)
        if settled is not None:
            return settled
        raise TransientError(
            f"intent {spec.key!r} moved to {current.state} (attempt {current.attempts}) "
            "while it was being reconciled",
            code="intent_moved",
        )
    yield from emit(
        "intent_ambiguous",
        job_id=spec.job_id,
        key=spec.key,
        action=spec.action,
        target=spec.target,
        attempt=attempts,
        token=token,
        reason=reason,
    )
    raise IntentAmbiguous(f"intent {spec.key!r}: {reason}")


# --------------------------------------------------------------------------- operators


class Resolution(StrEnum):
    CONFIRMED = "confirmed"
    RETRY = "retry"
    ABANDON = "abandon"


class ResolveRequests(Protocol):
    def resolve(
        self,
        key: str,
        *,
        resolution: Resolution,
        external_id: str | None,
        who: str,
        why: str,
        wall_now: float,
    ) -> Call: ...

    def get(self, key: str) -> Call: ...

    def parse(self, item: Mapping[str, Any]) -> IntentView: ...


@dataclass(frozen=True)
class Resolved:
    intent: IntentView
    job_requeued: bool
    job_state: JobState | None


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
) -> Flow[Resolved]:
    """An operator's decision on an ambiguous intent; the parked job is re-enqueued."""
    from .._errors import IntentError, IntentNotFound

    out = yield from call(
        ireq.resolve(
            key, resolution=resolution, external_id=external_id, who=who, why=why, wall_now=wall_now
        )
    )
    if isinstance(out, Err):
        if out.kind is ErrorKind.CONDITION_FAILED:
            if out.item is None:
                raise IntentNotFound(f"no intent {key!r}")
            current = ireq.parse(out.item)
            raise IntentError(
                f"intent {key!r} is {current.state}, not ambiguous: nothing to resolve"
            )
        raise _unknown(out, "resolve intent", key)
    intent = ireq.parse(out.response.get("Attributes", {}))
    yield from emit(
        "intent_resolved",
        key=key,
        job_id=intent.job_id,
        resolution=resolution.value,
        external_id=external_id,
        who=who,
        reason=why,
    )
    requeued = yield from resume_flow(
        jreq,
        queue_url=queue_url,
        job_id=intent.job_id,
        wall_now=wall_now,
    )
    return Resolved(intent, requeued is not None, requeued)


def resume_flow(
    jreq: JobRequests, *, queue_url: str, job_id: str, wall_now: float
) -> Flow[JobState | None]:
    """Parked -> queued, then send its message. Returns the state it left, or None."""
    out = yield from call(jreq.unpark(job_id, wall_now))
    if isinstance(out, Err):
        if out.kind is ErrorKind.CONDITION_FAILED:
            state = jreq.parse(out.item).state if out.item else None
            yield from emit(
                "job_resume_skipped", job_id=job_id, state=state.value if state else None
            )
            return None
        raise _unknown(out, "resume job", job_id)
    job = jreq.parse(out.response.get("Attributes", {}))
    body = message_body(job.job_id, job.job_class)
    sent = yield from call(Call("sqs", "SendMessage", {"QueueUrl": queue_url, "MessageBody": body}))
    if isinstance(sent, Err):
        # The record says message_sent = false, so resubmitting the job (same id,
        # class and payload) sends the message then.
        raise _unknown(sent, "re-enqueue job (record is queued; resubmit it to resend)", job_id)
    yield from call(jreq.mark_sent(job_id, wall_now))
    yield from emit("job_resumed", job_id=job_id)
    return JobState.PARKED
