"""The intent writes of one effect: lease first, a fenced start, the confirm, the
failed call's record, and the retries of a transiently cancelled write.

Every write of an attempt but the confirm checks the local lease first
(:func:`lease_confirmed`): nothing from a dropped attempt. A transaction DynamoDB
cancelled for a transient reason applied nothing and is tried again while the
lease holds. The confirm writes a fact (the effect happened) and is retried while
the attempt may still record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import LeaseError, LeaseLost, OwnershipUnknown
from .calls import Err, ErrorKind, Flow, Invoke, Ok, Sleep, call, emit
from .inputs import loads as _loads
from .intents import (
    LOG_LIMIT,
    RESPONSE_LIMIT,
    EffectResult,
    EffectSpec,
    IntentRequests,
    IntentState,
    IntentView,
    outcome_error,
    read_intent,
    replay_or_refuse,
    start_id_for,
)
from .records import JobRequests
from .retention import OwnStarts

RETRY_WAITS: tuple[float, ...] = (0.05, 0.2, 0.5, 1.0, 2.0, 4.0)
"""Waits before repeating an intent transaction that DynamoDB cancelled for a
transient reason (throttling, a conflicting transaction); past them the start is
ownership unknown and the confirm is left to reconciliation."""


TRANSIENT_TRIES = 200
"""Hang guard on retries of one transiently cancelled intent write; the local lease
is what really bounds them (a lease that is not confirmed ends the retries)."""


UNCONFIRMED_POLL_MAX = 1.0
"""Longest pause between looks at a lease whose ownership is unconfirmed (seconds)."""


_CONDITION_FAILED = "ConditionalCheckFailed"


@dataclass(frozen=True)
class EffectCtx:
    """What every step of one effect flow needs besides the spec."""

    ireq: IntentRequests
    jreq: JobRequests
    spec: EffectSpec
    token: int
    worker_id: str
    wall_clock: Callable[[], float]
    flow_id: str
    retry_waits: tuple[float, ...]
    own_starts: OwnStarts | None = None


def _bounded(value: Any, limit: int) -> str:
    text = json.dumps(value, default=str, sort_keys=True, separators=(",", ":"))
    if len(text) <= limit:
        return text
    return json.dumps({"truncated": True, "bytes": len(text), "head": text[: limit - 60]})


def _lease_check(spec: EffectSpec) -> Flow[None]:
    if spec.lease_check is None:
        return
    lc = yield from call(Invoke("lease_check", spec.lease_check))
    if isinstance(lc, Err):
        raise lc.exc if lc.exc is not None else OwnershipUnknown(f"lease check: {lc.message}")


def lease_confirmed(ctx: EffectCtx) -> Flow[None]:
    """Before every intent write of an attempt but the confirm (prepare, take-over,
    start, the failed call's record, the ambiguous mark): the lease must be confirmed.

    While ownership is merely unconfirmed (the last heartbeat got no answer) and the
    lease still has reserve, nothing is sent and nothing is given up: the flow waits
    for the next round's verdict (DESIGN: start no new irreversible step; keep trying
    while the local lease has reserve). A lost, cancelled, let-go or spent lease
    raises at once, as :func:`_lease_check` does. One rule for every such write: a
    write that gave up at once instead was how soak seed 777674 lost an attempt."""
    spec = ctx.spec
    waits = iter(ctx.retry_waits)
    for try_no in range(TRANSIENT_TRIES):
        try:
            yield from _lease_check(spec)
            return
        except OwnershipUnknown:
            # ``may_record`` holds for an open lease with time left: the check failed
            # only because the heartbeat could not confirm ownership. Else it ends here.
            if spec.may_record is None or not (yield from _lease_holds(spec)):
                raise
        if try_no == 0:
            yield from emit("ownership_wait", job_id=spec.job_id, key=spec.key, token=ctx.token)
        yield from call(Sleep(min(next(waits, UNCONFIRMED_POLL_MAX), UNCONFIRMED_POLL_MAX)))
    raise OwnershipUnknown(
        f"intent {spec.key!r}: ownership stayed unconfirmed through {TRANSIENT_TRIES} looks"
    )


def _lease_holds(spec: EffectSpec) -> Flow[bool]:
    """May a confirm be retried? By the lease's time (``may_record``) where the shell
    gives it, else by the ordinary lease check."""
    if spec.may_record is not None:
        out = yield from call(Invoke("may_record", spec.may_record))
        return isinstance(out, Ok) and out.response.get("value") is True
    if spec.lease_check is None:
        return True
    lc = yield from call(Invoke("lease_check", spec.lease_check))
    return isinstance(lc, Ok)


def read_wall(ctx: EffectCtx) -> Flow[float]:
    """The wall time for the next write, read by the driver (the simulator's is virtual)."""
    wall, _, _ = yield from read_clocks(ctx)
    return wall


def read_clocks(ctx: EffectCtx) -> Flow[tuple[float, float, float]]:
    """The wall time, with the driver's lease-clock stamps of the reading (before and
    after it: every outcome carries them), so a duration can be read on one clock."""
    out = yield from call(Invoke("wall_clock", ctx.wall_clock))
    if isinstance(out, Err):
        raise out.exc if out.exc is not None else RuntimeError(f"wall clock: {out.message}")
    value = out.response.get("value")
    if not isinstance(value, (int, float)):
        raise TypeError(f"wall clock returned {type(value).__name__}, not a number")
    return float(value), out.sent_at, out.received_at


def cancel_codes(err: Err) -> list[str]:
    """A cancelled transaction's reason codes, one per item (``None`` where it passed)."""
    return [str(r.get("Code") or "None") for r in err.reasons]


def _retried(ctx: EffectCtx, op: str, err: Err, wait: float | None) -> Flow[None]:
    """The event of a transiently cancelled write (``wait``: the pause before the next
    try; None: no more tries)."""
    spec = ctx.spec
    yield from emit(
        "intent_write_retried",
        job_id=spec.job_id,
        key=spec.key,
        op=op,
        reasons=cancel_codes(err),
        token=ctx.token,
        wait=wait,
    )


def _next_wait(ctx: EffectCtx, waits: Iterator[float], try_no: int) -> float | None:
    """The pause before the next try of a transiently cancelled write: the schedule's
    next step, then its last step again, until the hang guard (None: give up)."""
    if try_no + 1 >= TRANSIENT_TRIES or not ctx.retry_waits:
        return None
    return next(waits, ctx.retry_waits[-1])


def transient_cancel(err: Err) -> bool:
    """A cancelled transaction whose reasons name no failed condition but something
    transient (throttling, a conflicting transaction, capacity): nothing applied."""
    if err.kind is not ErrorKind.TRANSACTION_CANCELLED:
        return False
    codes = cancel_codes(err)
    return _CONDITION_FAILED not in codes and any(c != "None" for c in codes)


@dataclass(frozen=True)
class Started:
    """A start written: when, on both clocks."""

    wall: float  # the wall time the start wrote
    mono: float  # the lease clock before the first try of the start (an upper bound of age)


def start_intent(
    ctx: EffectCtx, expected: IntentState, attempts: int
) -> Flow[Started | EffectResult]:
    """Move the intent to in_progress, fenced on the job's token.

    Returns the wall time written (with the lease clock read before the first try),
    or the result when the intent turned out to be confirmed meanwhile (the earlier
    owner's late confirmation: replay it).
    """
    spec = ctx.spec
    start_id = start_id_for(spec.job_id, ctx.token, attempts + 1, ctx.worker_id, ctx.flow_id)
    waits = iter(ctx.retry_waits)
    try_no = 0
    first_mono: float | None = None
    while True:
        yield from lease_confirmed(ctx)
        now, mono, _ = yield from read_clocks(ctx)
        first_mono = mono if first_mono is None else first_mono
        out = yield from call(
            ctx.ireq.start(
                spec,
                jobs=ctx.jreq,
                token=ctx.token,
                worker_id=ctx.worker_id,
                expected=expected,
                attempts=attempts,
                wall_now=now,
                start_id=start_id,
                try_no=try_no,
            )
        )
        if isinstance(out, Ok):
            return Started(now, first_mono)
        if transient_cancel(out):
            # Throttled or in conflict: nothing applied, the lease is not lost and
            # no attempt is spent. Try again after a pause while the local lease
            # holds (the lease check above ends it); the cap is only a hang guard.
            wait = _next_wait(ctx, waits, try_no)
            yield from _retried(ctx, "start", out, wait)
            if wait is None:
                raise OwnershipUnknown(
                    f"start intent {spec.key!r}: DynamoDB cancelled it {try_no + 1} times "
                    f"({', '.join(cancel_codes(out))}); nothing was started"
                )
            yield from call(Sleep(wait))
            try_no += 1
            continue
        mine = yield from _refused_start(ctx, out, start_id)
        return Started(now, first_mono) if mine is None else mine


def _refused_start(ctx: EffectCtx, err: Err, start_id: str) -> Flow[EffectResult | None]:
    """Why did the start transaction fail? Returns None only if it was our own start
    after all (an SDK retry whose first try applied), or the result to replay."""
    spec, token = ctx.spec, ctx.token
    if err.kind is ErrorKind.TRANSACTION_CANCELLED:
        codes = cancel_codes(err)
        job_failed = not codes or codes[0] == _CONDITION_FAILED
        if not job_failed:
            # The job is still ours; the intent is not as we saw it. Ours only if it
            # carries this very start's id: attempt numbers and tokens repeat across
            # jobs that share a key, so they prove nothing.
            now = yield from read_intent(ctx.ireq, spec.key)
            if now is None:
                pass
            elif now.state is IntentState.IN_PROGRESS and now.start_id == start_id:
                return None
            elif now.payload_hash == spec.payload_hash:
                settled = yield from replay_or_refuse(now, spec, token)
                if settled is not None:
                    return settled
        yield from emit(
            "intent_start_refused",
            job_id=spec.job_id,
            key=spec.key,
            token=token,
            reason="token_moved" if job_failed else "intent_moved",
        )
        if job_failed:
            raise LeaseLost(
                f"intent {spec.key!r} not started: job {spec.job_id} token {token} is no "
                "longer current"
            )
        raise LeaseLost(f"intent {spec.key!r} changed under us; another attempt owns it")
    raise outcome_error(err, "start intent", spec.key)


def confirm_intent(
    ctx: EffectCtx,
    attempt: int,
    response: Mapping[str, Any],
    external_id: str | None,
    *,
    reconciled: bool,
) -> Flow[EffectResult]:
    """Record the known outcome. No lease check before the first try, on purpose:
    the effect happened, and the confirm writes a true fact (condition: the intent
    is still this attempt's, in progress; no job condition). Dropping it would only
    leave the next owner to ask the target again, or park the job for nothing.

    An outcome that arrives after the intent left ``in_progress`` is still recorded
    (:func:`_late_outcome`): a paused attempt's call may apply after the next owner
    parked it ambiguous, and after an operator judged it "not applied"."""
    spec = ctx.spec
    waits = iter(ctx.retry_waits)
    try_no = 0
    while True:
        out = yield from _confirm_write(
            ctx, attempt, response, external_id, reconciled, IntentState.IN_PROGRESS, try_no
        )
        if isinstance(out, Ok):
            break
        if transient_cancel(out):
            # Throttled or in conflict: retry (the confirm is idempotent) while the
            # local lease lasts; after that the next owner reconciles.
            wait = _next_wait(ctx, waits, try_no)
            holds = wait is not None and (yield from _lease_holds(spec))
            yield from _retried(ctx, "confirm", out, wait if holds else None)
            if holds and wait is not None:
                yield from call(Sleep(wait))
                try_no += 1
                continue
        elif out.kind is ErrorKind.TRANSACTION_CANCELLED:
            # A retried confirm whose first try applied (or another owner's reconcile)
            # finds the intent confirmed already: that is the outcome we wanted. One
            # that left in_progress otherwise gets this outcome as a late fact.
            now = yield from _read_answered(ctx)
            if now is not None:
                late = yield from _late_outcome(
                    ctx, now, attempt, response, external_id, reconciled
                )
                if late is not None:
                    return late
        # The effect happened but is not recorded: the intent stays in_progress and
        # the next owner reconciles it with the target. Nothing more may run now.
        yield from emit(
            "ownership_unknown",
            job_id=spec.job_id,
            key=spec.key,
            stage="intent_confirm",
            error_code=out.code or out.kind.value,
            token=ctx.token,
            request_id=out.request_id or None,
        )
        raise outcome_error(out, "confirm intent", spec.key)
    return (yield from _confirmed(ctx, attempt, response, external_id, reconciled))


def _confirmed(
    ctx: EffectCtx,
    attempt: int,
    response: Mapping[str, Any],
    external_id: str | None,
    reconciled: bool,
    **said: Any,
) -> Flow[EffectResult]:
    """The outcome recorded (by this write, or found recorded: ``said`` tells which)."""
    spec = ctx.spec
    yield from emit(
        "intent_confirmed",
        job_id=spec.job_id,
        key=spec.key,
        external_id=external_id,
        attempt=attempt,
        reconciled=reconciled,
        **said,
    )
    return EffectResult(dict(response), external_id, False, reconciled, spec.key)


def _confirm_write(
    ctx: EffectCtx,
    attempt: int,
    response: Mapping[str, Any],
    external_id: str | None,
    reconciled: bool,
    seen: IntentState,
    try_no: int,
) -> Flow[Ok | Err]:
    spec = ctx.spec
    out = yield from call(
        ctx.ireq.confirm(
            spec.key,
            attempt=attempt,
            response_json=_bounded(dict(response), RESPONSE_LIMIT),
            external_id=external_id,
            wall_now=(yield from read_wall(ctx)),
            log_response=_bounded(dict(response), LOG_LIMIT) if spec.log_bodies else "",
            reconciled=reconciled,
            job_id=spec.job_id,
            token=ctx.token,
            try_no=try_no,
            seen=seen,
        )
    )
    return out


def _read_answered(ctx: EffectCtx) -> Flow[IntentView | None]:
    """The intent as stored now, read again after a pause while a read goes
    unanswered (a known outcome must not be dropped for one lost answer); None: it
    is gone, or no read was answered."""
    waits = iter(ctx.retry_waits)
    while True:
        out = yield from call(ctx.ireq.get(ctx.spec.key))
        if isinstance(out, Ok):
            item = out.response.get("Item")
            return ctx.ireq.parse(item) if item else None
        wait = next(waits, None)
        if wait is None or out.kind is ErrorKind.NOT_FOUND:
            return None
        yield from call(Sleep(wait))


LATE_STATES = (IntentState.AMBIGUOUS, IntentState.PREPARED)
"""The states a confirm refused for being late may still settle, at the attempt's own
number: parked ambiguous by the next owner, or reopened by an operator's retry. No
later attempt has started, so no other call of the key can be in flight."""


LATE_ROUNDS = 4
"""Re-reads of an intent that moved again while its late outcome was being written."""


def _late_outcome(
    ctx: EffectCtx,
    now: IntentView,
    attempt: int,
    response: Mapping[str, Any],
    external_id: str | None,
    reconciled: bool,
) -> Flow[EffectResult | None]:
    """A confirm refused because the intent left ``in_progress``: what the known
    outcome still settles. Returns the result once the intent is confirmed (by this
    write or another), else None (the attempt then ends as ownership unknown).

    - Confirmed already: the outcome we wanted (a retried confirm, a reconcile).
    - Ambiguous or prepared at this attempt's number (:data:`LATE_STATES`): the call
      applied after the next owner parked it, or after an operator judged "not
      applied" and reopened it, and no later attempt started. The outcome confirms
      it, conditioned on exactly that state: the job's next attempt replays it, and
      an operator's decision judged before it is refused (soak seed 1808311: the
      outcome was dropped, and the operator's retry paid a second time).
    - Anything else (a later attempt started; an operator abandoned it or approved a
      new operation): the fact goes to this attempt's own log (``ok_late``) and out
      as ``effect_applied_late``, for an operator; the intent is left as decided.
    """
    spec = ctx.spec
    waits = iter(ctx.retry_waits)
    for try_no in range(LATE_ROUNDS + len(ctx.retry_waits)):
        if now.state is IntentState.CONFIRMED:
            stored = _loads(now.response_json or "{}")
            return (
                yield from _confirmed(
                    ctx, attempt, stored, now.external_id, reconciled, already=True
                )
            )
        if now.attempts != attempt or now.state not in LATE_STATES:
            break
        out = yield from _confirm_write(
            ctx, attempt, response, external_id, reconciled, now.state, try_no
        )
        if isinstance(out, Ok):
            return (
                yield from _confirmed(
                    ctx,
                    attempt,
                    response,
                    external_id,
                    reconciled,
                    late=now.state.value,
                    token=ctx.token,
                )
            )
        if transient_cancel(out):
            wait = next(waits, None)
            yield from _retried(ctx, "confirm_late", out, wait)
            if wait is None:
                return None
            yield from call(Sleep(wait))
        elif out.kind is not ErrorKind.TRANSACTION_CANCELLED:
            return None  # no answer: the intent is as it was, or confirmed; nobody knows
        reread = yield from _read_answered(ctx)
        if reread is None:
            return None
        now = reread
    settled_otherwise = now.state in (IntentState.ABANDONED, IntentState.SUPERSEDED)
    if attempt <= 0 or not (now.attempts > attempt or settled_otherwise):
        return None
    yield from call(
        ctx.ireq.applied_late(
            spec.key,
            attempt=attempt,
            external_id=external_id,
            wall_now=(yield from read_wall(ctx)),
            log_response=_bounded(dict(response), LOG_LIMIT) if spec.log_bodies else "",
        )
    )
    yield from emit(
        "effect_applied_late",
        job_id=spec.job_id,
        key=spec.key,
        attempt=attempt,
        token=ctx.token,
        external_id=external_id,
        intent_state=now.state.value,
        intent_attempts=now.attempts,
        resolution=now.resolution,
    )
    return None


def record_failed(ctx: EffectCtx, attempt: int, *, not_applied: bool, error: str) -> Flow[None]:
    """Record a failed call in the attempt log and, when it certainly did not apply,
    reopen the intent (``prepared``), so the next try repeats it without asking.

    Nothing depends on this write but the record itself: an unanswered or refused one
    is left (the intent stays ``in_progress`` and the check decides). A transient
    cancel applied nothing, so it is retried while the lease holds, as a start's is:
    a dropped reopen would make the next owner ask the check what this one knew."""
    spec = ctx.spec
    waits = iter(ctx.retry_waits)
    for try_no in range(TRANSIENT_TRIES):
        yield from lease_confirmed(ctx)
        out = yield from call(
            ctx.ireq.attempt_failed(
                spec.key,
                attempt=attempt,
                outcome="not_applied" if not_applied else "unknown",
                error=error[:LOG_LIMIT],
                wall_now=(yield from read_wall(ctx)),
                reopen=not_applied,
            )
        )
        if not (isinstance(out, Err) and transient_cancel(out)):
            return
        wait = _next_wait(ctx, waits, try_no)
        yield from _retried(ctx, "attempt_failed", out, wait)
        if wait is None:
            return
        yield from call(Sleep(wait))


def record_stopped(ctx: EffectCtx, attempt: int, *, error: str) -> Flow[None]:
    """The failed call's record when the tool stopped on the lease: written only if
    the lease still holds now, never waited for (the attempt is over) and never
    raising. What the attempt ends with is the tool's own ``LeaseError``."""
    try:
        yield from _lease_check(ctx.spec)
    except LeaseError:
        return
    yield from call(
        ctx.ireq.attempt_failed(
            ctx.spec.key,
            attempt=attempt,
            outcome="unknown",
            error=error[:LOG_LIMIT],
            wall_now=(yield from read_wall(ctx)),
            reopen=False,
        )
    )
