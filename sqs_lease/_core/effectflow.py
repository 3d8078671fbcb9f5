"""The whole life of one side effect: prepare its intent, wait for (or take over
from) another job holding its key, start it fenced, call the tool, then confirm the
outcome or reconcile an unknown one; repeats of an effect the target's check says
did not apply.

The writes are :mod:`.intentwrites`; the reconciling :mod:`.reconciling`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from .._errors import (
    FenceRefused,
    IntentBusy,
    IntentPayloadMismatch,
    LeaseError,
    PermanentError,
    RecordUnreadable,
    ToolNotApplied,
    TransientError,
)
from .calls import Err, ErrorKind, Flow, Invoke, Ok, Sleep, call, emit
from .intents import (
    EffectResult,
    EffectSpec,
    IntentRequests,
    IntentState,
    IntentView,
    ToolResult,
    outcome_error,
    replay_or_refuse,
)
from .intentwrites import (
    RETRY_WAITS,
    EffectCtx,
    confirm_intent,
    lease_confirmed,
    read_wall,
    record_failed,
    record_stopped,
    start_intent,
)
from .reconciling import reconcile, repeat_still_protected
from .records import JobRequests
from .retention import OwnStarts
from .texts import message_of

MAX_REPEATS = 3
"""Repeats of one effect (same key, same payload) inside one attempt, after the
target's check said the call certainly did not apply."""


HELD_WAITS: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
"""Waits (seconds) for an intent that another job holds (prepared or in progress)
before this job parks with ``IntentBusy``. Re-reading spends no attempt."""


MAX_SUCCESSORS = 50
"""Hang guard on following successor keys from one effect call."""


def effect_flow(
    ireq: IntentRequests,
    jreq: JobRequests,
    *,
    spec: EffectSpec,
    token: int,
    worker_id: str,
    wall_clock: Callable[[], float],
    flow_id: str = "",
    held_waits: tuple[float, ...] = HELD_WAITS,
    retry_waits: tuple[float, ...] = RETRY_WAITS,
    own_starts: OwnStarts | None = None,
) -> Flow[EffectResult]:
    """The whole life of one side effect, from intent to confirmation.

    ``wall_clock`` is read (through the driver, as an ``Invoke("wall_clock")``)
    before every write, so each write carries its own time; ``flow_id`` must be
    fresh per effect call (the drivers pass a random id; see ``start_id_for``).
    ``own_starts``: this worker process's lease-clock readings of the first starts
    it made (see :class:`OwnStarts`); None: only this call's own start is known.
    """
    ctx = EffectCtx(
        ireq, jreq, spec, token, worker_id, wall_clock, flow_id, tuple(retry_waits), own_starts
    )
    key = spec.key
    held = iter(held_waits)
    existing: IntentView | None = None
    hops = 0
    while True:
        # Nothing from a dropped attempt: every intent write checks the local lease
        # first; an unconfirmed one is waited for, not given up.
        yield from lease_confirmed(ctx)
        out = yield from call(ireq.prepare(spec, (yield from read_wall(ctx))))
        if isinstance(out, Ok):
            existing = None
            yield from emit(
                "intent_prepared",
                job_id=spec.job_id,
                key=key,
                action=spec.action,
                target=spec.target,
                payload_hash=spec.payload_hash,
                token=token,
            )
            break
        if out.kind is not ErrorKind.CONDITION_FAILED or out.item is None:
            raise outcome_error(out, "prepare intent", key)
        existing = ireq.parse(out.item)
        if existing.state is IntentState.SUPERSEDED and existing.successor:
            # An operator approved a new operation in its place: go on under its key
            # (same payload), recorded as the old one's successor.
            if hops >= MAX_SUCCESSORS or spec.rekey is None:
                raise PermanentError(
                    f"intent {key!r} was superseded by {existing.successor!r}, which this "
                    "effect call cannot follow",
                    code="intent_superseded",
                )
            hops += 1
            yield from emit(
                "intent_successor_followed",
                job_id=spec.job_id,
                key=key,
                successor=existing.successor,
                token=token,
            )
            spec = replace(
                spec,
                key=existing.successor,
                predecessor=key,
                tool=spec.rekey(existing.successor),
            )
            ctx = replace(ctx, spec=spec)
            key = spec.key
            continue
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
        settled = yield from replay_or_refuse(existing, spec, token)
        if settled is not None:
            return settled
        if existing.job_id == spec.job_id:
            break
        if existing.state is IntentState.PREPARED:
            taken = yield from _take_over(ctx, existing)
            if taken is not None:
                existing = taken
                break
        # Another job holds the key (a shared business key) and has not finished:
        # its call may be in flight, so this job neither calls the target nor asks
        # the check. It waits and reads again, spending no attempt.
        wait = next(held, None)
        yield from emit(
            "intent_held_elsewhere",
            job_id=spec.job_id,
            key=key,
            holder=existing.job_id,
            holder_state=existing.state.value,
            holder_attempt=existing.attempts,
            token=token,
            wait=wait,
        )
        if wait is None:
            raise IntentBusy(
                f"intent {key!r} is held by job {existing.job_id} ({existing.state.value}, "
                f"attempt {existing.attempts}) and did not finish while this job waited "
                f"{sum(held_waits):g} s; resume this job once {existing.job_id} has ended",
                holder=existing.job_id,
            )
        yield from call(Sleep(wait))

    expected = existing.state if existing is not None else IntentState.PREPARED
    attempts = existing.attempts if existing is not None else 0
    first_started = existing.first_started_at if existing is not None else None
    first_by = existing.first_started_by if existing is not None else None
    # This process's lease-clock reading taken before the start that stamped
    # ``first_started`` (None: another process stamped it, or this one forgot):
    # the only age of the key a repeat may be decided on (``repeat_unprotected``).
    own_start = _own_start(ctx, first_started, first_by)
    reconcile_first = expected is IntentState.IN_PROGRESS
    stored = existing
    repeats = 0
    while True:
        repeating = reconcile_first
        if reconcile_first:
            decision = yield from reconcile(
                ctx, attempts, stored, first_started, first_by, own_start
            )
            if isinstance(decision, EffectResult):
                return decision
            expected = IntentState.IN_PROGRESS
            stored = None
            repeats += 1
            if repeats > MAX_REPEATS:
                raise TransientError(
                    f"intent {key!r}: not applied after {MAX_REPEATS} repeats", code="repeats"
                )
        started = yield from start_intent(ctx, expected, attempts)
        if isinstance(started, EffectResult):
            return started
        attempts += 1
        if first_started is None:  # this start stamped it, on this worker's clocks
            first_started, first_by, own_start = started.wall, ctx.worker_id, started.mono
            if ctx.own_starts is not None:
                ctx.own_starts.remember(key, started.wall, started.mono)
        elif repeating:
            # The retention is judged at the send, not only at the check before it.
            settled = yield from repeat_still_protected(
                ctx, attempts, first_started, first_by, own_start
            )
            if settled is not None:
                return settled
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
        # What the finished and the failed call's events both say.
        ended: dict[str, Any] = {
            "job_id": spec.job_id,
            "key": key,
            "tool": spec.target,
            "attempt": attempts,
            "token": token,
            "duration": round(res.received_at - res.sent_at, 3),
        }
        if isinstance(res, Ok):
            value = res.response.get("value")
            result = (
                value
                if isinstance(value, ToolResult)
                else ToolResult(dict(value) if isinstance(value, Mapping) else {"value": value})
            )
            yield from emit(
                "tool_request_finished",
                **ended,
                external_id=result.external_id,
                request_id=result.request_id,
            )
            return (
                yield from confirm_intent(
                    ctx, attempts, result.response, result.external_id, reconciled=False
                )
            )
        exc = res.exc
        assert exc is not None
        # Only a typed "not applied" (never sent, or refused by the target) may
        # reopen the intent: anything else, a response cut in half or a bug in the
        # code that read a success, may have applied, and goes to reconciliation.
        not_applied = isinstance(exc, ToolNotApplied)
        # A fence refusal (412) proves the call was not applied, though it ends the
        # attempt as a lease loss below: the event must not tell it as unknown.
        refused = isinstance(exc, FenceRefused)
        yield from emit(
            "tool_request_failed",
            **ended,
            error_code=res.code,
            outcome_unknown=not (not_applied or refused),
        )
        error = f"{res.code}: {message_of(exc, spec.payload_json)}"
        if isinstance(exc, LeaseError):
            # A tool that stopped on the lease leaves the intent in progress: the
            # next owner reconciles it (this one may no longer act). The attempt ends
            # with the tool's own signal: a fence refusal (``LeaseLost``) proves
            # another owner, and must not be told as ``OwnershipUnknown`` because the
            # lease lapsed meanwhile (the before-send pause, issue 26).
            yield from record_stopped(ctx, attempts, error=error)
            raise exc
        yield from record_failed(ctx, attempts, not_applied=not_applied, error=error)
        if not_applied:
            raise exc
        reconcile_first = True


def _take_over(ctx: EffectCtx, existing: IntentView) -> Flow[IntentView | None]:
    """Take a *prepared* intent over from a holder job that has ended for good.

    Prepared means no call of it can be in flight (never started, or reopened after
    a provable "not applied"), and a holder that succeeded or failed can never start
    it (its start is fenced on its own record being ``running``), so the key is free.
    A holder that is queued, running or parked may still act: None, and the caller
    waits. ``in_progress`` is never taken over (the call may have applied: the
    holder's next owner, or an operator, reconciles it).
    """
    spec = ctx.spec
    out = yield from call(ctx.jreq.get(existing.job_id))
    if isinstance(out, Err):
        return None
    item = out.response.get("Item")
    try:
        holder = ctx.jreq.parse(item) if item else None
    except RecordUnreadable:
        return None
    if holder is not None and not holder.state.terminal:
        return None
    holder_state = holder.state.value if holder is not None else "missing"
    yield from lease_confirmed(ctx)
    taken = yield from call(
        ctx.ireq.take_over(
            spec.key,
            holder=existing.job_id,
            job_id=spec.job_id,
            attempts=existing.attempts,
            reason=f"taken over from job {existing.job_id} ({holder_state})",
            wall_now=(yield from read_wall(ctx)),
        )
    )
    if isinstance(taken, Err):
        return None  # moved meanwhile, or no answer: read again after the wait
    yield from emit(
        "intent_taken_over",
        job_id=spec.job_id,
        key=spec.key,
        holder=existing.job_id,
        holder_state=holder_state,
        attempts=existing.attempts,
        token=ctx.token,
    )
    return ctx.ireq.parse(taken.response.get("Attributes", {}))


def _own_start(ctx: EffectCtx, first_started: float | None, first_by: str | None) -> float | None:
    """The lease-clock reading before the first start, when this process made it."""
    if ctx.own_starts is None or first_by is None or first_by != ctx.worker_id:
        return None
    return ctx.own_starts.mono_of(ctx.spec.key, first_started)
