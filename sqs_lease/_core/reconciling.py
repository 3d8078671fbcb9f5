"""An in-progress intent whose outcome is unknown, settled with the target's own
check: confirmed, repeated under the same key while the target still keeps it
(:mod:`.retention`), or marked ambiguous for an operator (the job parks).
"""

from __future__ import annotations

from dataclasses import replace

from .._errors import IntentAmbiguous, TransientError
from .calls import Err, ErrorKind, Flow, Invoke, Ok, call, emit
from .intents import (
    CheckAnswer,
    EffectResult,
    EffectSpec,
    IntentState,
    IntentView,
    Verdict,
    outcome_error,
    replay_or_refuse,
)
from .intentwrites import EffectCtx, confirm_intent, lease_confirmed, read_clocks, read_wall
from .retention import Unprotected, repeat_unprotected
from .texts import outside_text


def reconcile(
    ctx: EffectCtx,
    attempts: int,
    stored: IntentView | None,
    first_started: float | None,
    first_by: str | None = None,
    own_start: float | None = None,
) -> Flow[EffectResult | None]:
    """Ask the target what happened to an in-progress intent.

    Returns the confirmed result, or None when the call certainly did not apply and
    a repeat is still protected by the target's key (repeat it, same key and
    payload). Raises IntentAmbiguous after marking the intent when nobody can tell,
    or when a repeat would no longer be protected.
    """
    spec, token = ctx.spec, ctx.token
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
        first_started_at=first_started,
        first_started_by=first_by,
        success=spec.success,
    )
    if view.success is None:  # stored before the meaning was recorded: the target's own
        view = replace(view, success=spec.success)
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
            yield from confirm_intent(
                ctx, attempts, answer.response or {}, answer.external_id, reconciled=True
            )
        )
    if answer.verdict is Verdict.NOT_APPLIED:
        why = yield from _repeat_unprotected_now(ctx, first_started, first_by, own_start)
        if why is None:
            return None
        reason = (
            f"{spec.target} says {spec.action} did not apply, but no automatic repeat: {why}; "
            "make sure it did not apply, then resolve --retry"
        )
    else:
        detail = outside_text(answer.detail, spec.payload_json)
        reason = f"cannot tell whether {spec.action} at {spec.target} applied: {detail}"
    return (yield from _park(ctx, attempts, reason))


def repeat_still_protected(
    ctx: EffectCtx,
    attempts: int,
    first_started: float | None,
    first_by: str | None,
    own_start: float | None,
) -> Flow[EffectResult | None]:
    """The key's age again, once a repeat's start is written and just before its
    request goes out: the check's "not applied" was judged inside the retention, but
    the start write may have taken long (a paused process, a Lambda starved of CPU;
    soak seed 1593876), and the earlier request, late in the network, may still land.
    Only a repeat sent inside the retention is protected by the key. None: send it;
    otherwise the intent (``attempts``: the repeat's start, never sent) parks as
    ambiguous, or the result that settled it meanwhile is returned."""
    why = yield from _repeat_unprotected_now(ctx, first_started, first_by, own_start)
    if why is None:
        return None
    spec = ctx.spec
    reason = (
        f"{spec.target} said {spec.action} did not apply, and its repeat was started but "
        f"not sent: {why}; make sure it did not apply, then resolve --retry"
    )
    return (yield from _park(ctx, attempts, reason))


def _repeat_unprotected_now(
    ctx: EffectCtx, first_started: float | None, first_by: str | None, own_start: float | None
) -> Flow[str | None]:
    """Why a repeat sent now would not be protected by the target's key, or None."""
    now, _, mono_now = yield from read_clocks(ctx)
    age = mono_now - own_start if own_start is not None else None
    return _unprotected(ctx.spec, first_started, now, age=age, by=first_by, me=ctx.worker_id)


def _park(ctx: EffectCtx, attempts: int, reason: str) -> Flow[EffectResult]:
    """Mark the intent (at ``attempts``) ambiguous for an operator and raise
    IntentAmbiguous; if it moved meanwhile, act on what it is now."""
    spec, token = ctx.spec, ctx.token
    yield from lease_confirmed(ctx)
    out2 = yield from call(
        ctx.ireq.mark_ambiguous(
            spec.key, attempts=attempts, reason=reason, wall_now=(yield from read_wall(ctx))
        )
    )
    if isinstance(out2, Err):
        if out2.kind is not ErrorKind.CONDITION_FAILED or out2.item is None:
            raise outcome_error(out2, "mark intent ambiguous", spec.key)
        # The intent moved while the target was asked (e.g. the earlier owner's
        # late confirmation landed): act on what it is now, never park blindly.
        current = ctx.ireq.parse(out2.item)
        settled = yield from replay_or_refuse(current, spec, token)
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


def _unprotected(
    spec: EffectSpec,
    first_started: float | None,
    now: float,
    *,
    age: float | None,
    by: str | None,
    me: str,
) -> str | None:
    """Why a repeat with the same key would not be protected by the target, or None
    (``age``: the key's age on this process's lease clock, None when this process did
    not time the first start; ``by``: whose wall clock stamped ``first_started``;
    ``me``: this worker)."""
    retention = spec.key_retention_seconds
    why = repeat_unprotected(retention, first_started, now, own_age=age)
    if why is Unprotected.OTHER_CLOCK:
        whose = (
            "this worker before a restart"
            if by == me
            else (f"worker {by}" if by else "an unknown worker")
        )
        return (
            f"its first attempt was timed by {whose}, not on this process's lease clock, "
            f"and whether target {spec.target!r} still keeps the key ({retention:g} s) "
            "cannot be told without comparing two machines' clocks"
        )
    if why is Unprotected.NO_KEYS:
        return f"target {spec.target!r} keeps no idempotency keys"
    if why is Unprotected.EXPIRED:
        started = age if age is not None else now - (first_started or now)
        return (
            f"its first attempt started {started:.0f} s ago, past the "
            f"{retention:g} s target {spec.target!r} keeps keys"
        )
    return None
