"""A job's timeline: the ownership events kept on its record, and how to read them back.

Each event is appended to the job record's ``timeline`` list **in the same
conditional write that makes the change** (``_schema.job_requests.JobTable`` adds
the append to the claim, commit, stage checkpoint, retry, park, fail, release,
cancel, resume and resolve writes), so keeping it costs no request. Three kinds of
event cannot ride on their own write:

- a *refused commit*: the refused write changed nothing, so it cannot append. The
  stale attempt already sends one unfenced write after the refusal (``keep_rejected``,
  which records the refused result's hash for people); the event rides on that one.
- *lease lost* and *ownership unknown*: the losing worker learns them from a read
  (the heartbeat) or from no answer at all, and an unreachable worker cannot write.
  The record shows the loss where it happened: the next claim of a running job
  names the owner it took the job from (``reclaimed``). A worker's journal
  (``heartbeat_lost``, ``ownership_unknown``) adds what that worker saw; the
  timeline command merges journal lines given to it.

A claim's token is computed by DynamoDB in the claim (``token + 1``), so the claim's
event cannot hold it: :func:`with_tokens` numbers the token-moving events backwards
from the record's current token (every write that moves the token appends one).

The list is bounded: at :data:`TIMELINE_LIMIT` events the owner that claimed the job
trims the oldest (:func:`trim_count`) in one fenced write, once per
:data:`TIMELINE_TRIM` events: the only write the timeline adds.

A job's **intent transitions** (prepared, started, confirmed, outcome unknown, not
applied, reconciled, ambiguous) are not copied onto the job record: the intent and
its attempt log already hold each of them, written by the transition itself (the
start in the same transaction as the job's fence check). :func:`from_intents` reads
them from there (the key, the tool and its action; never a payload or a response),
so they cost no write and do not crowd the record's bounded list. A transition that
does not name its worker (a preparation, a reconciliation) is drawn in the lane of
the job's owner at that moment (:func:`attributed`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from .inputs import loads as _loads

TIMELINE_LIMIT = 64
"""Events kept on a job record; at this length the next owner trims the oldest."""

TIMELINE_TRIM = 16
"""Events dropped at once by a trim (so a trim is one write per this many events)."""

DETAIL_LIMIT = 120
"""Characters of an event's detail (a reason, an error code) kept on the record."""

OWNER_LIMIT = 64
"""Characters of a worker id kept in an event."""

EVENT_BYTES = 1024
"""The most UTF-8 bytes one stored event takes (limits.TIMELINE_ROOM counts on it)."""


class TimelineKind(StrEnum):
    """What happened to the job's ownership (stable names, stored on the record)."""

    SUBMITTED = "submitted"
    CLAIMED = "claimed"  # moves the token
    COMMITTED = "committed"
    STAGE_DONE = "stage_done"  # a stage's checkpoint: the job moves to its next stage
    REFUSED = "refused"  # a stale owner's write the fence refused
    RETRY = "retry"
    PARKED = "parked"
    UNDELIVERABLE = "undeliverable"  # parked by a worker that could not run it; moves the token
    DEAD_LETTERED = "dead_lettered"  # parked: SQS moved its message to the DLQ; moves the token
    FAILED = "failed"
    RELEASED = "released"
    CANCELLED = "cancelled"  # moves the token
    RESUMED = "resumed"
    RESOLVED = "resolved"
    # From a worker's journal, never stored on the record (see the module's doc).
    LEASE_LOST = "lease_lost"
    OWNERSHIP_UNKNOWN = "ownership_unknown"
    LEASE_DROPPED = "lease_dropped"  # the worker let the message go (deadline, watchdog)
    # From the job's intents and their attempt log (from_intents), never on the record.
    INTENT_PREPARED = "intent_prepared"
    INTENT_STARTED = "intent_started"
    INTENT_CONFIRMED = "intent_confirmed"
    INTENT_UNKNOWN = "intent_unknown"  # the call's outcome unknown: left to reconciliation
    INTENT_NOT_APPLIED = "intent_not_applied"  # the tool said it certainly did not apply
    INTENT_RECONCILED = "intent_reconciled"  # the target's check answered for the call
    INTENT_AMBIGUOUS = "intent_ambiguous"  # nobody can tell: the job parks

    @property
    def is_intent(self) -> bool:
        return self.value.startswith("intent_")

    @property
    def moves_token(self) -> bool:
        return self in (
            TimelineKind.CLAIMED,
            TimelineKind.UNDELIVERABLE,
            TimelineKind.DEAD_LETTERED,
            TimelineKind.CANCELLED,
        )


@dataclass(frozen=True)
class TimelineEvent:
    """One ownership event of a job. ``token`` is the token the event happened under
    (``None`` until :func:`with_tokens` numbers a claim); ``source`` says where it was
    read: ``record`` (the job record) or ``journal`` (a worker's journal line)."""

    kind: TimelineKind
    at: float
    owner: str | None = None
    token: int | None = None
    detail: str | None = None
    stage: str | None = None
    source: str = "record"

    def encode(self) -> str:
        """The compact JSON text stored in the record's ``timeline`` list."""
        out: dict[str, Any] = {"k": self.kind.value, "at": round(self.at, 3)}
        if self.owner is not None:
            out["o"] = self.owner[:OWNER_LIMIT]
        if self.token is not None:
            out["t"] = self.token
        if self.detail:
            out["d"] = self.detail[:DETAIL_LIMIT]
        if self.stage:
            out["s"] = self.stage[:OWNER_LIMIT]
        return json.dumps(out, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def decode(text: str) -> TimelineEvent | None:
    """One stored event (None: a kind this version does not know, or not an event)."""
    try:
        raw = _loads(text)
        kind = TimelineKind(raw["k"])
        at = float(raw["at"])
    except (ValueError, KeyError, TypeError):
        return None
    token = raw.get("t")
    return TimelineEvent(
        kind=kind,
        at=at,
        owner=raw.get("o"),
        token=int(token) if isinstance(token, int) else None,
        detail=raw.get("d"),
        stage=raw.get("s"),
    )


def event(
    kind: TimelineKind,
    at: float,
    *,
    owner: str | None = None,
    token: int | None = None,
    detail: str | None = None,
    stage: str | None = None,
) -> str:
    """Encode one event for a write (what ``_schema`` appends)."""
    return TimelineEvent(kind, at, owner, token, detail, stage).encode()


def trim_count(length: int) -> int:
    """How many of the oldest events a new owner drops, seeing ``length`` stored."""
    if length < TIMELINE_LIMIT:
        return 0
    return length - TIMELINE_LIMIT + TIMELINE_TRIM


def with_tokens(events: Sequence[TimelineEvent], current_token: int) -> list[TimelineEvent]:
    """Number every event with the token it happened under, from the record's token.

    Walks backwards: the newest token-moving event holds ``current_token``, the one
    before it one less, and so on; an event between two token moves holds the token
    of the move before it. An event that carries its own token (an end write, a
    refused write) keeps it.
    """
    out: list[TimelineEvent] = []
    token = current_token
    for ev in reversed(events):
        if ev.kind.moves_token:
            out.append(replace(ev, token=token))
            token -= 1
        elif ev.token is None:
            out.append(replace(ev, token=token))
        else:
            out.append(ev)
    out.reverse()
    return out


def from_record(stored: Iterable[str], current_token: int) -> list[TimelineEvent]:
    """The record's ``timeline`` list, decoded and numbered."""
    events = [ev for ev in (decode(text) for text in stored) if ev is not None]
    return with_tokens(events, current_token)


_JOURNAL_KINDS = {
    "heartbeat_lost": TimelineKind.LEASE_LOST,
    "ownership_unknown": TimelineKind.OWNERSHIP_UNKNOWN,
    "lease_dropped": TimelineKind.LEASE_DROPPED,
    "result_rejected": TimelineKind.REFUSED,
}


def from_journal(
    job_id: str, lines: Iterable[Mapping[str, Any]], owner: str | None = None
) -> list[TimelineEvent]:
    """A worker's journal events about one job that the record cannot hold (lease
    lost, ownership unknown, a lease let go, a refused retry, park or fail write), as
    timeline events (``source="journal"``)."""
    out: list[TimelineEvent] = []
    for line in lines:
        kind = _JOURNAL_KINDS.get(str(line.get("event")))
        if kind is None or line.get("job_id") != job_id:
            continue
        if kind is TimelineKind.REFUSED and line.get("stage") == "commit":
            continue  # the record holds it already (see the module's doc)
        at = line.get("ts")
        token = line.get("token")
        reason = line.get("reason")
        out.append(
            TimelineEvent(
                kind=kind,
                at=float(at) if isinstance(at, (int, float)) else 0.0,
                owner=str(line.get("worker") or owner or "") or None,
                token=token if isinstance(token, int) else None,
                detail=str(reason)[:DETAIL_LIMIT] if reason else None,
                stage=str(line.get("stage")) if line.get("stage") else None,
                source="journal",
            )
        )
    return out


def merged(
    record: Sequence[TimelineEvent], journal: Sequence[TimelineEvent]
) -> list[TimelineEvent]:
    """Journal events placed among the record's by time; the record's own order (the
    order DynamoDB applied its writes) is kept as it is, whatever its wall clocks say."""
    pending = sorted(journal, key=lambda ev: ev.at)
    out: list[TimelineEvent] = []
    j = 0
    for ev in record:
        while j < len(pending) and pending[j].at < ev.at:
            out.append(pending[j])
            j += 1
        out.append(ev)
    out.extend(pending[j:])
    return out


@dataclass(frozen=True)
class IntentAttemptFacts:
    """One row of an intent's attempt log, as the timeline needs it (no bodies)."""

    attempt: int
    job_id: str
    token: int
    worker: str
    started_at: float
    ended_at: float | None
    outcome: str  # started | ok | ok_late | not_applied | unknown | confirmed_by_check | ...


@dataclass(frozen=True)
class IntentFacts:
    """One intent of a job, as the timeline needs it: its key, tool (target) and
    action, state and times; never its payload or response."""

    key: str
    target: str
    action: str
    state: str
    created_at: float
    updated_at: float
    confirmed_at: float | None = None
    reconciled: bool = False
    attempts: tuple[IntentAttemptFacts, ...] = ()


_ENDED = {
    "ok": TimelineKind.INTENT_CONFIRMED,
    "ok_late": TimelineKind.INTENT_CONFIRMED,  # applied; told after the intent moved on
    "unknown": TimelineKind.INTENT_UNKNOWN,
    "not_applied": TimelineKind.INTENT_NOT_APPLIED,
    "failed": TimelineKind.INTENT_NOT_APPLIED,  # the name versions before the rule wrote
    "confirmed_by_check": TimelineKind.INTENT_RECONCILED,
    "not_applied_by_check": TimelineKind.INTENT_RECONCILED,
}


def from_intents(job_id: str, intents: Iterable[IntentFacts]) -> list[TimelineEvent]:
    """The intent transitions of ``job_id``'s intents, in time order (``source="intent"``).

    The detail names the key, the tool and its action (``KEY (target.action)``); an
    attempt's events carry its worker and token; another job's attempts under a
    shared key are left out.
    """
    out: list[TimelineEvent] = []
    for it in intents:
        out.extend(_intent_events(job_id, it))
    out.sort(key=lambda ev: ev.at)
    return out


def _intent_events(job_id: str, it: IntentFacts) -> Iterator[TimelineEvent]:
    name = f"{it.key} ({it.target}.{it.action})"

    def ev(
        kind: TimelineKind, at: float, owner: str | None, token: int | None, why: str
    ) -> TimelineEvent:
        detail = f"{name}: {why}" if why else name
        return TimelineEvent(kind, at, owner, token, detail[:DETAIL_LIMIT], source="intent")

    yield ev(TimelineKind.INTENT_PREPARED, it.created_at, None, None, "")
    for a in it.attempts:
        if a.job_id != job_id:
            continue
        attempt = f"attempt {a.attempt}"
        yield ev(TimelineKind.INTENT_STARTED, a.started_at, a.worker, a.token, attempt)
        ended = _ENDED.get(a.outcome)
        if ended is None or a.ended_at is None:
            continue
        if ended is TimelineKind.INTENT_RECONCILED:
            # A reconciling owner closes the attempt it found: the attempt keeps its
            # first end, the intent the moment the check answered.
            applied = a.outcome == "confirmed_by_check"
            at = it.confirmed_at if applied and it.confirmed_at else a.ended_at
            why = "applied" if applied else "not applied"
            yield ev(ended, at, None, None, f"{why}, the target's check says")
        elif a.outcome == "ok_late":
            why = f"{attempt} applied, told after the intent had moved on"
            yield ev(ended, a.ended_at, a.worker, a.token, why)
        else:
            yield ev(ended, a.ended_at, a.worker, a.token, attempt)
    if it.state == "ambiguous":
        yield ev(TimelineKind.INTENT_AMBIGUOUS, it.updated_at, None, None, "nobody can tell")


def attributed(events: Sequence[TimelineEvent]) -> list[TimelineEvent]:
    """Intent events that name no worker, given the lane and token of the job's owner
    at that moment (the last claim before them); others unchanged."""
    out: list[TimelineEvent] = []
    holder: TimelineEvent | None = None
    for ev in events:
        if ev.kind is TimelineKind.CLAIMED:
            holder = ev
        if ev.kind.is_intent and ev.owner is None and holder is not None:
            ev = replace(ev, owner=holder.owner, token=ev.token or holder.token)
        out.append(ev)
    return out
