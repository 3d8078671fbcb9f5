"""Side effects as intents: what an intent is, and how a stored one is read.

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

This module holds the vocabulary (states, the record as the core reads it, the
effect's spec, the target's check verdicts, the store's requests) and the reading
of a stored intent (replay or refuse). The life of one effect is
:mod:`.effectflow`; its writes :mod:`.intentwrites`; an unknown outcome
:mod:`.reconciling`; whether a repeat is safe :mod:`.retention`; an operator's
decision :mod:`.resolving`; a parked job's resume :mod:`.resuming`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol

from .._errors import IntentAmbiguous, OwnershipUnknown, PermanentError
from .calls import Call, Err, ErrorKind, Flow, call, emit
from .inputs import loads as _loads
from .messages import fail_call
from .records import JobRequests

RESPONSE_LIMIT = 16_000


LOG_LIMIT = 2_000


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
    # The open state its attempt's own late answer found when it confirmed it
    # (``ambiguous``, or ``prepared`` after an operator's retry); None: not late.
    confirmed_late: str | None = None
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
        seen: IntentState = IntentState.IN_PROGRESS,
    ) -> Call: ...

    def applied_late(
        self,
        key: str,
        *,
        attempt: int,
        external_id: str | None,
        wall_now: float,
        log_response: str,
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


def replay_or_refuse(
    existing: IntentView, spec: EffectSpec, token: int
) -> Flow[EffectResult | None]:
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


def read_intent(ireq: IntentRequests, key: str) -> Flow[IntentView | None]:
    """The intent as stored now (None: absent, or the read got no answer)."""
    out = yield from call(ireq.get(key))
    if isinstance(out, Err):
        return None
    item = out.response.get("Item")
    return ireq.parse(item) if item else None


def outcome_error(out: Err, what: str, key: str) -> BaseException:
    """What an intent's or job's write (or read) that failed without a verdict raises:
    a missing table is a failed call; anything else leaves ownership unknown."""
    if out.kind is ErrorKind.NOT_FOUND:
        return fail_call(f"{what} {key!r}", out)
    return OwnershipUnknown(f"{what} {key!r}: {out.code or out.kind}: {out.message}")
