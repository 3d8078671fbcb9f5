"""Side effects as intents: prepare, start (fenced), call, confirm, reconcile.

An intent is written *before* a call that changes the outside world, under a
stable key built in code. It moves ``prepared -> in_progress`` only in a
transaction that also checks the job's token, so a worker that lost its lease
cannot start an effect. The attempt log, apart from the intent, records what
each attempt observed. An intent found ``in_progress`` (after a takeover, a
restart or a timeout) is reconciled with the target's own answer, never retried
blindly; when nobody can tell, it turns ``ambiguous`` and the job is parked.

A key may be shared by jobs (one invoice, one capture): only the job that wrote
the intent calls the target under it, and a start is recognised as one's own
only by the start id it wrote. A tool error reopens the intent only when it is a
typed ``ToolNotApplied``; anything else may have applied and is reconciled.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Literal, Protocol

from .._errors import (
    FenceRefused,
    IntentAmbiguous,
    IntentBusy,
    IntentPayloadMismatch,
    LeaseError,
    LeaseLost,
    OwnershipUnknown,
    PermanentError,
    RecordUnreadable,
    ToolNotApplied,
    TransientError,
)
from .calls import Call, Err, ErrorKind, Flow, Invoke, Ok, Sleep, call, emit
from .inputs import loads as _loads
from .messages import UNSENT_GRACE_SECONDS, fail_call
from .records import JobRequests, JobState, JobView
from .sending import SendOutcome, send_record_message
from .sweeping import home_queue
from .texts import message_of, outside_text

MAX_REPEATS = 3
"""Repeats of one effect (same key, same payload) inside one attempt, after the
target's check said the call certainly did not apply."""

HELD_WAITS: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
"""Waits (seconds) for an intent that another job holds (prepared or in progress)
before this job parks with ``IntentBusy``. Re-reading spends no attempt."""

RETRY_WAITS: tuple[float, ...] = (0.05, 0.2, 0.5, 1.0, 2.0, 4.0)
"""Waits before repeating an intent transaction that DynamoDB cancelled for a
transient reason (throttling, a conflicting transaction); past them the start is
ownership unknown and the confirm is left to reconciliation."""

_CONDITION_FAILED = "ConditionalCheckFailed"


class IntentState(StrEnum):
    PREPARED = "prepared"
    IN_PROGRESS = "in_progress"
    CONFIRMED = "confirmed"
    AMBIGUOUS = "ambiguous"
    ABANDONED = "abandoned"
    SUPERSEDED = "superseded"  # an operator approved a new, separate operation (``successor``)


@dataclass(frozen=True)
class IntentView:
    """An intent as the core (and a target's check) reads it. ``success`` is what the
    target's success means for it (``accepted``/``completed``/``delivered``; None for
    an intent stored before the meaning was recorded)."""

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
    start_id: str | None = None  # who wrote the current start (see ``start_id_for``)
    first_started_at: float | None = None  # wall time of the first start
    # The worker whose wall clock stamped ``first_started_at`` (None: not known, an
    # older record): key retention compares that time only with the same clock.
    first_started_by: str | None = None
    resolution: str | None = None  # an operator's decision, once made
    resolved_by: str | None = None
    success: SuccessMeaning | None = None
    successor: str | None = None  # the new operation's key, once an operator approved one
    predecessor: str | None = None  # the superseded intent this operation replaces


SuccessMeaning = Literal["accepted", "completed", "delivered"]
"""What a target's success means: ``accepted`` (queued on its side, may still fail
there), ``completed`` (applied) or ``delivered`` (reached its final recipient)."""

SUCCESS_MEANINGS: tuple[SuccessMeaning, ...] = ("accepted", "completed", "delivered")


def success_meaning(value: str | None) -> SuccessMeaning | None:
    """A stored meaning read back (None: absent or one this version does not know)."""
    for meaning in SUCCESS_MEANINGS:
        if value == meaning:
            return meaning
    return None


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
    request_id: str | None = None  # the target's id of this request (for its operators)


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
    # True while a retry of a fact-recording write (a confirm) may go on: the attempt
    # is open and its lease has time left, even if the last heartbeat went unanswered.
    may_record: Callable[[], bool] | None = None
    log_bodies: bool = False
    key_retention_seconds: float | None = None  # how long the target keeps keys; None: not at all
    success: SuccessMeaning = "completed"  # what the target's success means (Target.success)
    predecessor: str | None = None  # set when following a superseded intent to its successor
    # The tool for another key (the successor's): its call must carry that key.
    rekey: Callable[[str], Callable[[], Any]] | None = None


def default_key(job_id: str, stage: str, action: str, target: str, version: str | None) -> str:
    """The default intent key: source event (job id), stage, action, target (+ version)."""
    key = f"{job_id}:{stage}:{action}:{target}"
    return f"{key}:v{version}" if version else key


def start_id_for(job_id: str, token: int, attempt: int, worker_id: str, flow_id: str) -> str:
    """The identity of one start of an intent, stored in it by the start transaction.

    Only this tells a start of our own (an SDK retry whose first try applied) from
    another's: attempt numbers and tokens repeat across jobs (every job's first
    token is 1), so the job id is part of it, and ``flow_id`` (fresh per effect
    call, chosen by the driver) tells apart two effect calls of one owner.
    """
    return f"{job_id}|{token}|{attempt}|{worker_id}|{flow_id}"


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
        start_id: str = "",
        try_no: int = 0,
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
        job_id: str = "",
        token: int = 0,
        try_no: int = 0,
    ) -> Call: ...

    def attempt_failed(
        self, key: str, *, attempt: int, outcome: str, error: str, wall_now: float, reopen: bool
    ) -> Call: ...

    def take_over(
        self, key: str, *, holder: str, job_id: str, attempts: int, reason: str, wall_now: float
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


@dataclass(frozen=True)
class _Ctx:
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
    ctx = _Ctx(
        ireq, jreq, spec, token, worker_id, wall_clock, flow_id, tuple(retry_waits), own_starts
    )
    key = spec.key
    held = iter(held_waits)
    existing: IntentView | None = None
    hops = 0
    while True:
        # Nothing from a dropped attempt: every intent write checks the local lease
        # first; an unconfirmed one is waited for, not given up.
        yield from _lease_confirmed(ctx)
        out = yield from call(ireq.prepare(spec, (yield from _wall(ctx))))
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
            raise _unknown(out, "prepare intent", key)
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
        settled = yield from _settled(existing, spec, token)
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
        if reconcile_first:
            decision = yield from _reconcile(
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
        started = yield from _start(ctx, expected, attempts)
        if isinstance(started, EffectResult):
            return started
        attempts += 1
        if first_started is None:  # this start stamped it, on this worker's clocks
            first_started, first_by, own_start = started.wall, ctx.worker_id, started.mono
            if ctx.own_starts is not None:
                ctx.own_starts.remember(key, started.wall, started.mono)
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
                request_id=result.request_id,
            )
            return (
                yield from _confirm(
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
            job_id=spec.job_id,
            key=key,
            tool=spec.target,
            attempt=attempts,
            token=token,
            duration=duration,
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
            yield from _record_stopped(ctx, attempts, error=error)
            raise exc
        yield from _record_failed(ctx, attempts, not_applied=not_applied, error=error)
        if not_applied:
            raise exc
        reconcile_first = True


def _take_over(ctx: _Ctx, existing: IntentView) -> Flow[IntentView | None]:
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
    yield from _lease_confirmed(ctx)
    taken = yield from call(
        ctx.ireq.take_over(
            spec.key,
            holder=existing.job_id,
            job_id=spec.job_id,
            attempts=existing.attempts,
            reason=f"taken over from job {existing.job_id} ({holder_state})",
            wall_now=(yield from _wall(ctx)),
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


def _record_failed(ctx: _Ctx, attempt: int, *, not_applied: bool, error: str) -> Flow[None]:
    """Record a failed call in the attempt log and, when it certainly did not apply,
    reopen the intent (``prepared``), so the next try repeats it without asking.

    Nothing depends on this write but the record itself: an unanswered or refused one
    is left (the intent stays ``in_progress`` and the check decides). A transient
    cancel applied nothing, so it is retried while the lease holds, as a start's is:
    a dropped reopen would make the next owner ask the check what this one knew."""
    spec = ctx.spec
    waits = iter(ctx.retry_waits)
    for try_no in range(TRANSIENT_TRIES):
        yield from _lease_confirmed(ctx)
        out = yield from call(
            ctx.ireq.attempt_failed(
                spec.key,
                attempt=attempt,
                outcome="not_applied" if not_applied else "unknown",
                error=error[:LOG_LIMIT],
                wall_now=(yield from _wall(ctx)),
                reopen=not_applied,
            )
        )
        if not (isinstance(out, Err) and _transient_cancel(out)):
            return
        wait = _next_wait(ctx, waits, try_no)
        yield from emit(
            "intent_write_retried",
            job_id=spec.job_id,
            key=spec.key,
            op="attempt_failed",
            reasons=_cancel_codes(out),
            token=ctx.token,
            wait=wait,
        )
        if wait is None:
            return
        yield from call(Sleep(wait))


def _record_stopped(ctx: _Ctx, attempt: int, *, error: str) -> Flow[None]:
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
            wall_now=(yield from _wall(ctx)),
            reopen=False,
        )
    )


def _lease_check(spec: EffectSpec) -> Flow[None]:
    if spec.lease_check is None:
        return
    lc = yield from call(Invoke("lease_check", spec.lease_check))
    if isinstance(lc, Err):
        raise lc.exc if lc.exc is not None else OwnershipUnknown(f"lease check: {lc.message}")


UNCONFIRMED_POLL_MAX = 1.0
"""Longest pause between looks at a lease whose ownership is unconfirmed (seconds)."""


def _lease_confirmed(ctx: _Ctx) -> Flow[None]:
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


def _wall(ctx: _Ctx) -> Flow[float]:
    """The wall time for the next write, read by the driver (the simulator's is virtual)."""
    wall, _, _ = yield from _clocks(ctx)
    return wall


def _clocks(ctx: _Ctx) -> Flow[tuple[float, float, float]]:
    """The wall time, with the driver's lease-clock stamps of the reading (before and
    after it: every outcome carries them), so a duration can be read on one clock."""
    out = yield from call(Invoke("wall_clock", ctx.wall_clock))
    if isinstance(out, Err):
        raise out.exc if out.exc is not None else RuntimeError(f"wall clock: {out.message}")
    value = out.response.get("value")
    if not isinstance(value, (int, float)):
        raise TypeError(f"wall clock returned {type(value).__name__}, not a number")
    return float(value), out.sent_at, out.received_at


def _cancel_codes(err: Err) -> list[str]:
    return [str(r.get("Code") or "None") for r in err.reasons]


TRANSIENT_TRIES = 200
"""Hang guard on retries of one transiently cancelled intent write; the local lease
is what really bounds them (a lease that is not confirmed ends the retries)."""


def _next_wait(ctx: _Ctx, waits: Iterator[float], try_no: int) -> float | None:
    """The pause before the next try of a transiently cancelled write: the schedule's
    next step, then its last step again, until the hang guard (None: give up)."""
    if try_no + 1 >= TRANSIENT_TRIES or not ctx.retry_waits:
        return None
    return next(waits, ctx.retry_waits[-1])


def _transient_cancel(err: Err) -> bool:
    """A cancelled transaction whose reasons name no failed condition but something
    transient (throttling, a conflicting transaction, capacity): nothing applied."""
    if err.kind is not ErrorKind.TRANSACTION_CANCELLED:
        return False
    codes = _cancel_codes(err)
    return _CONDITION_FAILED not in codes and any(c != "None" for c in codes)


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
            intent_job=existing.job_id,
        )
        return EffectResult(
            _loads(existing.response_json or "{}"), existing.external_id, True, False, key
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
        return fail_call(f"{what} {key!r}", out)
    return OwnershipUnknown(f"{what} {key!r}: {out.code or out.kind}: {out.message}")


def _read_intent(ireq: IntentRequests, key: str) -> Flow[IntentView | None]:
    out = yield from call(ireq.get(key))
    if isinstance(out, Err):
        return None
    item = out.response.get("Item")
    return ireq.parse(item) if item else None


@dataclass(frozen=True)
class _Started:
    wall: float  # the wall time the start wrote
    mono: float  # the lease clock before the first try of the start (an upper bound of age)


def _start(ctx: _Ctx, expected: IntentState, attempts: int) -> Flow[_Started | EffectResult]:
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
        yield from _lease_confirmed(ctx)
        now, mono, _ = yield from _clocks(ctx)
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
            return _Started(now, first_mono)
        if _transient_cancel(out):
            # Throttled or in conflict: nothing applied, the lease is not lost and
            # no attempt is spent. Try again after a pause while the local lease
            # holds (the lease check above ends it); the cap is only a hang guard.
            wait = _next_wait(ctx, waits, try_no)
            yield from emit(
                "intent_write_retried",
                job_id=spec.job_id,
                key=spec.key,
                op="start",
                reasons=_cancel_codes(out),
                token=ctx.token,
                wait=wait,
            )
            if wait is None:
                raise OwnershipUnknown(
                    f"start intent {spec.key!r}: DynamoDB cancelled it {try_no + 1} times "
                    f"({', '.join(_cancel_codes(out))}); nothing was started"
                )
            yield from call(Sleep(wait))
            try_no += 1
            continue
        mine = yield from _refused_start(ctx, out, start_id)
        return _Started(now, first_mono) if mine is None else mine


def _refused_start(ctx: _Ctx, err: Err, start_id: str) -> Flow[EffectResult | None]:
    """Why did the start transaction fail? Returns None only if it was our own start
    after all (an SDK retry whose first try applied), or the result to replay."""
    spec, token = ctx.spec, ctx.token
    if err.kind is ErrorKind.TRANSACTION_CANCELLED:
        codes = _cancel_codes(err)
        job_failed = not codes or codes[0] == _CONDITION_FAILED
        if not job_failed:
            # The job is still ours; the intent is not as we saw it. Ours only if it
            # carries this very start's id: attempt numbers and tokens repeat across
            # jobs that share a key, so they prove nothing.
            now = yield from _read_intent(ctx.ireq, spec.key)
            if now is None:
                pass
            elif now.state is IntentState.IN_PROGRESS and now.start_id == start_id:
                return None
            elif now.payload_hash == spec.payload_hash:
                settled = yield from _settled(now, spec, token)
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
    raise _unknown(err, "start intent", spec.key)


def _confirm(
    ctx: _Ctx,
    attempt: int,
    response: Mapping[str, Any],
    external_id: str | None,
    *,
    reconciled: bool,
) -> Flow[EffectResult]:
    """Record the known outcome. No lease check before the first try, on purpose:
    the effect happened, and the confirm writes a true fact (condition: the intent
    is still this attempt's, in progress; no job condition). Dropping it would only
    leave the next owner to ask the target again, or park the job for nothing."""
    spec = ctx.spec
    waits = iter(ctx.retry_waits)
    try_no = 0
    while True:
        out = yield from call(
            ctx.ireq.confirm(
                spec.key,
                attempt=attempt,
                response_json=_bounded(dict(response), RESPONSE_LIMIT),
                external_id=external_id,
                wall_now=(yield from _wall(ctx)),
                log_response=_bounded(dict(response), LOG_LIMIT) if spec.log_bodies else "",
                reconciled=reconciled,
                job_id=spec.job_id,
                token=ctx.token,
                try_no=try_no,
            )
        )
        if isinstance(out, Ok):
            break
        if _transient_cancel(out):
            # Throttled or in conflict: retry (the confirm is idempotent) while the
            # local lease lasts; after that the next owner reconciles.
            wait = _next_wait(ctx, waits, try_no)
            holds = wait is not None and (yield from _lease_holds(spec))
            yield from emit(
                "intent_write_retried",
                job_id=spec.job_id,
                key=spec.key,
                op="confirm",
                reasons=_cancel_codes(out),
                token=ctx.token,
                wait=wait if holds else None,
            )
            if holds and wait is not None:
                yield from call(Sleep(wait))
                try_no += 1
                continue
        elif out.kind is ErrorKind.TRANSACTION_CANCELLED:
            # A retried confirm whose first try applied (or another owner's reconcile)
            # finds the intent confirmed already: that is the outcome we wanted.
            now = yield from _read_intent(ctx.ireq, spec.key)
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
                    _loads(now.response_json or "{}"),
                    now.external_id,
                    False,
                    reconciled,
                    spec.key,
                )
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


class Unprotected(StrEnum):
    """Why a repeat with the same key is not protected by the target."""

    NO_KEYS = "no_keys"  # the target keeps no idempotency keys
    EXPIRED = "expired"  # the first attempt is older than the target keeps keys
    # The first start was timed by another machine's (or process's) wall clock: its age
    # cannot be known without comparing two clocks, so the repeat is not proven safe.
    OTHER_CLOCK = "other_clock"


def first_start_stamp(wall_now: float, worker_id: str) -> str:
    """The intent's ``first_start``: the first start's wall time and whose clock read it."""
    return f"{wall_now!r}|{worker_id}"


def first_started_by(stamp: str | None, first_started_at: float | None) -> str | None:
    """Whose clock stamped ``first_started_at``, from the ``first_start`` written in the
    same write (None: unknown, or the two were not written together: an older record)."""
    if not stamp or first_started_at is None or "|" not in stamp:
        return None
    at, _, worker = stamp.partition("|")
    try:
        same = float(at) == first_started_at
    except ValueError:
        return None
    return worker if same and worker else None


def repeat_unprotected(
    retention: float | None,
    first_started: float | None,
    now: float,
    *,
    own_age: float | None = None,
) -> Unprotected | None:
    """Key retention, the one rule (the effect flow and the operator's ``intents
    retry``): whether a repeat of a key is still protected by a target that keeps
    keys for ``retention`` seconds (None: not at all). None: protected.

    ``own_age``: the key's age read on one clock, the lease clock (monotonic) of the
    worker process that made the first start, from a reading before that start to
    now. Only that proves a repeat safe. Wall times prove nothing: ``first_started``
    (stamped by the starter's wall clock) against ``now`` (the reader's) compares two
    machines' clocks, or one machine's wall clock across a step or a drift (NTP): a
    lagging reading would call a key the target already forgot protected and repeat
    the effect. Without ``own_age`` the walls only word a refusal (:attr:`EXPIRED`
    when they say the window has passed); otherwise the rule decides conservatively
    (:attr:`Unprotected.OTHER_CLOCK`: the effect flow parks the job as ambiguous; the
    operator's ``--retry`` is the operator's word that they checked the target)."""
    if retention is None:
        return Unprotected.NO_KEYS
    if own_age is not None:
        return Unprotected.EXPIRED if own_age > retention else None
    if first_started is not None and now > first_started + retention:
        return Unprotected.EXPIRED
    return Unprotected.OTHER_CLOCK


OWN_STARTS_KEPT = 10_000
"""First starts one worker process remembers (the oldest forgotten first): forgetting
one only makes a later repeat of its key park instead of going ahead."""


class OwnStarts:
    """One worker process's first starts of intents: key -> (the wall time the start
    wrote as ``first_started_at``, the lease clock read before it).

    Lives as long as the process, never stored: a restarted process (same worker id,
    a new lease clock) remembers nothing, and its repeats park. The wall time only
    tells that the stored first start is the one remembered (one write, exact)."""

    def __init__(self, kept: int = OWN_STARTS_KEPT) -> None:
        # OrderedDict: set and popitem are each one step under the GIL, so threads
        # sharing one process's memory need no lock.
        self._starts: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._kept = kept

    def remember(self, key: str, wall: float, mono: float) -> None:
        self._starts[key] = (wall, mono)
        for _ in range(len(self._starts) - self._kept):
            try:
                self._starts.popitem(last=False)
            except KeyError:
                return

    def mono_of(self, key: str, first_started: float | None) -> float | None:
        """The lease-clock reading before this process's first start of ``key``, if
        the stored first start (``first_started``) is the one it made."""
        known = self._starts.get(key)
        if known is None or first_started is None or known[0] != first_started:
            return None
        return known[1]


def _own_start(ctx: _Ctx, first_started: float | None, first_by: str | None) -> float | None:
    """The lease-clock reading before the first start, when this process made it."""
    if ctx.own_starts is None or first_by is None or first_by != ctx.worker_id:
        return None
    return ctx.own_starts.mono_of(ctx.spec.key, first_started)


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


def _reconcile(
    ctx: _Ctx,
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
            yield from _confirm(
                ctx, attempts, answer.response or {}, answer.external_id, reconciled=True
            )
        )
    if answer.verdict is Verdict.NOT_APPLIED:
        now, _, mono_now = yield from _clocks(ctx)
        age = mono_now - own_start if own_start is not None else None
        why = _unprotected(spec, first_started, now, age=age, by=first_by, me=ctx.worker_id)
        if why is None:
            return None
        reason = (
            f"{spec.target} says {spec.action} did not apply, but no automatic repeat: {why}; "
            "make sure it did not apply, then resolve --retry"
        )
    else:
        detail = outside_text(answer.detail, spec.payload_json)
        reason = f"cannot tell whether {spec.action} at {spec.target} applied: {detail}"
    yield from _lease_confirmed(ctx)
    out2 = yield from call(
        ctx.ireq.mark_ambiguous(
            spec.key, attempts=attempts, reason=reason, wall_now=(yield from _wall(ctx))
        )
    )
    if isinstance(out2, Err):
        if out2.kind is not ErrorKind.CONDITION_FAILED or out2.item is None:
            raise _unknown(out2, "mark intent ambiguous", spec.key)
        # The intent moved while the target was asked (e.g. the earlier owner's
        # late confirmation landed): act on what it is now, never park blindly.
        current = ctx.ireq.parse(out2.item)
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
    NEW_OPERATION = "new_operation"  # approve a new, separate operation under a derived key


SUCCESSOR_MARK = "~op"
MAX_SUCCESSORS = 50
"""Hang guard on following successor keys from one effect call."""


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
        attempt: int | None = None,
    ) -> Call: ...

    def resolve_and_unpark(
        self,
        key: str,
        *,
        resolution: Resolution,
        external_id: str | None,
        who: str,
        why: str,
        wall_now: float,
        jobs: JobRequests,
        job_id: str,
        send_id: str,
        attempt: int | None = None,
    ) -> Call: ...

    def get(self, key: str) -> Call: ...

    def parse(self, item: Mapping[str, Any]) -> IntentView: ...


ResumeVerdict = Literal["resumed", "resent", "not_parked"]


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


@dataclass(frozen=True)
class Resolved:
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
        raise _unknown(got, "read intent", key)
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
    if intent.state is not IntentState.AMBIGUOUS:
        if intent.resolution is not None:
            finished = yield from _finish_earlier(
                jreq,
                intent,
                queue_url=queue_url,
                wall_now=wall_now,
                send_id=send_id,
                interactive_url=interactive_url,
            )
            if finished is not None:
                return finished
        raise IntentNotAmbiguous(
            f"intent {key!r} is {intent.state}, not ambiguous: nothing to resolve",
            state=intent.state.value,
            final=intent.state
            in (IntentState.CONFIRMED, IntentState.ABANDONED, IntentState.SUPERSEDED),
        )
    waits = iter(RETRY_WAITS)
    while True:
        out = yield from call(
            ireq.resolve_and_unpark(
                key,
                resolution=resolution,
                external_id=external_id,
                who=who,
                why=why,
                wall_now=wall_now,
                jobs=jreq,
                job_id=intent.job_id,
                send_id=send_id,
                attempt=judged,
            )
        )
        if not (isinstance(out, Err) and _transient_cancel(out)):
            break
        # Throttled or in conflict: nothing applied, and it says nothing about the
        # job (taking it for "not parked" settled the intent alone, leaving the job
        # parked: soak seed 300478). Try the one decision again.
        wait = next(waits, None)
        if wait is None:
            raise OwnershipUnknown(
                f"resolve intent {key!r}: DynamoDB cancelled it for a transient reason "
                f"({', '.join(_cancel_codes(out))}); nothing was resolved: run the same "
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
            state = now.state.value if now else "gone"
            by = f" by {now.resolved_by}" if now is not None and now.resolved_by else ""
            raise IntentError(
                f"intent {key!r} changed meanwhile (now {state}{by}): nothing resolved; "
                "look at `sqs-lease intents show` and decide again"
            )
        # The intent is ambiguous but its job is not parked (cancelled, failed, or
        # still on its way to parking): settle the intent alone, and say so.
        return (
            yield from _resolve_intent_only(
                ireq,
                jreq,
                out,
                key=key,
                resolution=resolution,
                external_id=external_id,
                who=who,
                why=why,
                wall_now=wall_now,
                job_id=intent.job_id,
                attempt=judged,
            )
        )
    resolved = _as_resolved(intent, resolution, external_id, who)
    yield from emit(
        "intent_resolved",
        key=key,
        job_id=intent.job_id,
        resolution=resolution.value,
        external_id=external_id,
        who=who,
        reason=why,
    )
    yield from emit("job_resumed", job_id=intent.job_id, send_id=send_id, by="resolve")
    sent = yield from _send_resumed(
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
        _sent_note(sent, "re-enqueued (one attempt granted)"),
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


def _sent_note(sent: SendOutcome, done: str) -> str:
    if sent.verdict == "superseded":
        return f"{done}; another sender sent its message meanwhile"
    return done


def _resolve_intent_only(
    ireq: ResolveRequests,
    jreq: JobRequests,
    cancelled: Err,
    *,
    key: str,
    resolution: Resolution,
    external_id: str | None,
    who: str,
    why: str,
    wall_now: float,
    job_id: str,
    attempt: int,
) -> Flow[Resolved]:
    from .._errors import IntentError

    job_item = cancelled.reasons[1].get("Item") if len(cancelled.reasons) > 1 else None
    job: JobView | None = jreq.parse(job_item) if job_item else None
    if job is None:
        read = yield from call(jreq.get(job_id))
        if isinstance(read, Ok) and read.response.get("Item"):
            job = jreq.parse(read.response["Item"])
    out = yield from call(
        ireq.resolve(
            key,
            resolution=resolution,
            external_id=external_id,
            who=who,
            why=why,
            wall_now=wall_now,
            attempt=attempt,
        )
    )
    if isinstance(out, Err):
        if out.kind is ErrorKind.CONDITION_FAILED:
            raise IntentError(f"intent {key!r} changed meanwhile: nothing resolved; decide again")
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
    resumed = yield from _resume(
        jreq,
        queue_url=queue_url,
        job_id=intent.job_id,
        wall_now=wall_now,
        send_id=send_id,
        interactive_url=interactive_url,
    )
    if resumed.verdict == "not_parked":
        return None  # nothing half done: the caller says there is nothing to resolve
    yield from emit(
        "intent_resolution_finished",
        key=intent.key,
        job_id=intent.job_id,
        resolution=intent.resolution,
        verdict=resumed.verdict,
    )
    note = (
        f"the intent was already resolved ({intent.resolution}"
        f"{' by ' + intent.resolved_by if intent.resolved_by else ''}); its job was "
        + ("still parked: " if resumed.verdict == "resumed" else "queued without a message: ")
        + resumed.note
    )
    return Resolved(intent, True, resumed.state, note, finished_earlier=True)


def _send_resumed(
    jreq: JobRequests,
    *,
    queue_url: str,
    job_id: str,
    send_id: str,
    wall_now: float,
    what: str,
    interactive_url: str | None = None,
) -> Flow[SendOutcome]:
    got = yield from call(jreq.get(job_id))
    if isinstance(got, Err) or not got.response.get("Item"):
        # The unpark is applied (it carries our send id); the sweep or a resume sends it.
        raise OwnershipUnknown(
            f"job {job_id!r} {what}, but it could not be read to send its message: run "
            f"`sqs-lease jobs resume {job_id}`, or a worker's stranded sweep sends it after "
            f"{UNSENT_GRACE_SECONDS:g} s"
        )
    job = jreq.parse(got.response["Item"])
    sent = yield from send_record_message(
        jreq,
        job,
        queue_url=home_queue(job, queue_url, interactive_url),
        send_id=send_id,
        wall_now=wall_now,
    )
    _raise_unsent(sent, job_id, what)
    return sent


def resume_flow(
    jreq: JobRequests,
    *,
    queue_url: str,
    job_id: str,
    wall_now: float,
    send_id: str,
    interactive_url: str | None = None,
) -> Flow[Resumed]:
    """Parked -> queued with one attempt granted, then send its message.

    Retryable: a record that is queued without a sent message (an earlier resume
    or submit whose send failed, a producer that died) is sent again now, under a
    new send id that retires any older message. ``send_id`` is unique to this call.
    """
    resumed = yield from _resume(
        jreq,
        queue_url=queue_url,
        job_id=job_id,
        wall_now=wall_now,
        send_id=send_id,
        interactive_url=interactive_url,
    )
    if resumed.verdict == "not_parked":
        yield from emit("job_resume_skipped", job_id=job_id, state=resumed.state.value)
    return resumed


def _resume(
    jreq: JobRequests,
    *,
    queue_url: str,
    job_id: str,
    wall_now: float,
    send_id: str,
    interactive_url: str | None = None,
) -> Flow[Resumed]:
    out = yield from call(jreq.unpark(job_id, send_id, wall_now))
    if isinstance(out, Ok):
        job = jreq.parse(out.response.get("Attributes", {}))
        yield from emit("job_resumed", job_id=job_id, send_id=send_id, by="resume")
        sent = yield from send_record_message(
            jreq,
            job,
            queue_url=home_queue(job, queue_url, interactive_url),
            send_id=send_id,
            wall_now=wall_now,
        )
        _raise_unsent(sent, job_id, "resumed (one attempt granted)")
        note = _sent_note(sent, "re-enqueued (one attempt granted)")
        return Resumed(job_id, "resumed", JobState.PARKED, note, send_id, sent.message_id)
    if out.kind is not ErrorKind.CONDITION_FAILED:
        raise _unknown(out, "resume job", job_id)
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
            sent = yield from send_record_message(
                jreq,
                job,
                queue_url=home_queue(job, queue_url, interactive_url),
                send_id=send_id,
                wall_now=wall_now,
            )
            _raise_unsent(sent, job_id, "queued")
            note = _sent_note(sent, "it was queued without a message: message sent")
            return Resumed(job_id, "resent", JobState.QUEUED, note, send_id, sent.message_id)
        if took.kind is not ErrorKind.CONDITION_FAILED:
            raise _unknown(took, "resume job (take over the send)", job_id)
        if took.item is not None:
            current = jreq.parse(took.item)
    return Resumed(job_id, "not_parked", current.state, f"job is {current.state.value}, not parked")


def _raise_unsent(sent: SendOutcome, job_id: str, what: str) -> None:
    if sent.verdict == "failed":
        assert sent.error is not None
        raise fail_call(
            f"job {job_id!r} {what}, but its message was not sent: run `sqs-lease jobs resume "
            f"{job_id}` again, or a worker's stranded sweep sends it after "
            f"{UNSENT_GRACE_SECONDS:g} s; send",
            sent.error,
        )
