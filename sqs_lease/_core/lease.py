"""The local lease's life: every state a held job's lease can be in, and every transition,
as one table.

A worker holds a job for one attempt. What it knows of that lease changes when a
heartbeat round answers, when the worker asks its attempts to stop, when the
handler returns, when the watchdog lets the message go, when a fenced write or a
heartbeat learns that another owner holds the job, and when the attempt hands the
job back itself. Each of those is a :class:`LeaseEvent`; :data:`TRANSITIONS` says,
for every state and every event, the next state and what the caller must do
(:class:`Action`). :meth:`LocalLease.process` is the only code that moves a lease's
state: the lease book, the heartbeat's verdicts and the attempt flow call it.

Three rules shape the table:

- **Only an open lease is extended, stopped or dropped.** ``ok`` and ``unknown``
  (and their *stopping* twins, told to stop while the worker shuts down) are open;
  a lease that ended (``done``, ``expired``, ``lost``, ``given_back``,
  ``cancelled``) ignores heartbeats, stop requests and the watchdog.
- **A loss is learned once.** Any state but a known loss (``lost``,
  ``given_back``, ``cancelled``) moves to ``lost``/``cancelled`` and the caller
  journals ``heartbeat_lost`` and tells the attempt; a second report changes
  nothing. A lease that ended or was dropped can still learn it (its late write
  found the token moved).
- **A hand-back is the attempt's own.** Once it gave the job back, nothing it
  learns later is a lost lease.

Nothing here reads a clock or does I/O; times are the caller's monotonic seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from .._errors import (
    AttemptTimedOut,
    JobCancelled,
    LeaseError,
    LeaseLost,
    OwnershipUnknown,
    WorkerShuttingDown,
)

__all__ = [
    "OPEN",
    "TRANSITIONS",
    "Action",
    "Drop",
    "LeaseEvent",
    "LeaseState",
    "LeaseStatus",
    "LocalLease",
    "Stop",
]


class LeaseStatus(StrEnum):
    """What a lease's holder may do: the view of :class:`LeaseState` the rules read."""

    OK = "ok"
    UNKNOWN = "unknown"  # last heartbeat round could not confirm ownership
    LOST = "lost"  # token moved on, job left running, or SQS says the lease is gone
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # the worker let the message go (``LocalLease.dropped`` says why)
    DONE = "done"  # handler returned; nothing more to extend


OPEN = frozenset({LeaseStatus.OK, LeaseStatus.UNKNOWN})
"""Statuses of an attempt the heartbeat may still extend."""


class Drop(StrEnum):
    """Why the worker stops extending a job (the watchdog's reasons, and shutdown)."""

    RESERVE_SPENT = "lease_reserve_spent"  # ownership went unconfirmed until the reserve ran out
    WORKER_LATE = "worker_late"  # confirmed, but this worker's own heartbeat came too late
    EFFECT_TIMEOUT = "effect_timeout"  # one effect call ran past its timeout + EFFECT_MARGIN
    NO_PROGRESS = "no_progress"
    STAGE_BUDGET = "stage_budget_exceeded"
    # The message's share of SQS's 12-hour visibility cap ran out (or SQS refused an
    # extension for it) before the class's own budget: not the job's fault; the job
    # goes on under a new message, uncharged (``rounds.watchdog_drops_flow``).
    MESSAGE_CAP = "message_cap"
    SHUTDOWN = "shutdown"  # the handler overran the worker's shutdown grace
    LOOP_BLOCKED = "loop_blocked"  # its handler held the event loop past the tolerated lag


class Stop(StrEnum):
    """Why an attempt was told to stop; decides how it ends (``endings.stopped_ending``)."""

    SHUTDOWN = "shutdown"  # the worker is stopping and still holds the job: give it back
    LEASE_LOST = "lease_lost"  # another claim moved the token on, or SQS took the message
    CANCELLED = "cancelled"  # an operator or the session cancelled the job
    LET_GO = "let_go"  # the worker let the message go (watchdog, reserve spent, shutdown)


class LeaseState(StrEnum):
    """Every state of a held job's lease."""

    OK = "ok"  # ownership confirmed by the last heartbeat round (or the claim)
    UNKNOWN = "unknown"  # the last round could not confirm it; retried while the reserve lasts
    STOPPING = "stopping"  # ok, and told to stop: the worker shuts down and still holds the job
    STOPPING_UNKNOWN = "stopping_unknown"  # unknown, and told to stop
    DONE = "done"  # the handler returned: nothing more to extend
    EXPIRED = "expired"  # the worker let the message go (``LocalLease.dropped`` says why)
    LOST = "lost"  # another owner holds the job (the token moved, SQS took the message)
    GIVEN_BACK = "given_back"  # the attempt handed its job back itself
    CANCELLED = "cancelled"  # an operator or the session cancelled the job


class LeaseEvent(StrEnum):
    """What can happen to a held lease."""

    CONFIRMED = "confirmed"  # a heartbeat round extended it: ownership confirmed
    UNCONFIRMED = "unconfirmed"  # a round could not confirm ownership (no answer, throttled)
    STOP_ASKED = "stop_asked"  # the worker shuts down while the attempt holds the job
    RETURNED = "returned"  # the handler returned
    DROPPED = "dropped"  # the worker lets the message go (a :class:`Drop` says why)
    LOST = "lost"  # another owner holds the job: a heartbeat, a refused write, a newer claim
    CANCELLED = "cancelled"  # an operator or the job's session cancelled it
    GAVE_BACK = "gave_back"  # the attempt handed its job back (a watchdog retry, a release)


class Action(StrEnum):
    """What the caller does after a transition (the table decides; callers only act)."""

    IGNORE = "ignore"  # the event changes nothing in this state
    EXTEND = "extend"  # take the round's deadline; next beat one interval on
    RETRY_SOON = "retry_soon"  # keep the deadline; beat again soon, while the reserve lasts
    TELL = "tell"  # wake the attempt: it must stop (``LocalLease.stop`` says why)
    TELL_LOSS = "tell_loss"  # journal ``heartbeat_lost`` once, and wake the attempt
    SETTLE = "settle"  # record the state; nothing to tell (the attempt itself moved it)


_S = LeaseState
_E = LeaseEvent
_A = Action


def _open_row(
    confirmed: LeaseState, unconfirmed: LeaseState, stop: LeaseState
) -> dict[LeaseEvent, tuple[LeaseState, Action]]:
    return {
        _E.CONFIRMED: (confirmed, _A.EXTEND),
        _E.UNCONFIRMED: (unconfirmed, _A.RETRY_SOON),
        _E.STOP_ASKED: (stop, _A.TELL),
        _E.RETURNED: (_S.DONE, _A.SETTLE),
        _E.DROPPED: (_S.EXPIRED, _A.TELL),
        _E.LOST: (_S.LOST, _A.TELL_LOSS),
        _E.CANCELLED: (_S.CANCELLED, _A.TELL_LOSS),
        _E.GAVE_BACK: (_S.GIVEN_BACK, _A.SETTLE),
    }


def _ended_row(state: LeaseState) -> dict[LeaseEvent, tuple[LeaseState, Action]]:
    """A lease that is no longer open: only a loss (learned late) or its own hand-back."""
    return {
        _E.CONFIRMED: (state, _A.IGNORE),
        _E.UNCONFIRMED: (state, _A.IGNORE),
        _E.STOP_ASKED: (state, _A.IGNORE),
        _E.RETURNED: (state, _A.IGNORE),
        _E.DROPPED: (state, _A.IGNORE),
        _E.LOST: (_S.LOST, _A.TELL_LOSS),
        _E.CANCELLED: (_S.CANCELLED, _A.TELL_LOSS),
        _E.GAVE_BACK: (_S.GIVEN_BACK, _A.SETTLE),
    }


def _final_row(state: LeaseState) -> dict[LeaseEvent, tuple[LeaseState, Action]]:
    """A known loss (or the attempt's own hand-back): nothing moves it again."""
    return {event: (state, _A.IGNORE) for event in LeaseEvent}


TRANSITIONS: dict[LeaseState, dict[LeaseEvent, tuple[LeaseState, Action]]] = {
    _S.OK: _open_row(_S.OK, _S.UNKNOWN, _S.STOPPING),
    _S.UNKNOWN: _open_row(_S.OK, _S.UNKNOWN, _S.STOPPING_UNKNOWN),
    _S.STOPPING: {
        **_open_row(_S.STOPPING, _S.STOPPING_UNKNOWN, _S.STOPPING),
        _E.STOP_ASKED: (_S.STOPPING, _A.IGNORE),  # told once
    },
    _S.STOPPING_UNKNOWN: {
        **_open_row(_S.STOPPING, _S.STOPPING_UNKNOWN, _S.STOPPING_UNKNOWN),
        _E.STOP_ASKED: (_S.STOPPING_UNKNOWN, _A.IGNORE),
    },
    _S.DONE: _ended_row(_S.DONE),
    _S.EXPIRED: _ended_row(_S.EXPIRED),
    _S.LOST: _final_row(_S.LOST),
    _S.GIVEN_BACK: _final_row(_S.GIVEN_BACK),
    _S.CANCELLED: _final_row(_S.CANCELLED),
}
"""state -> event -> (next state, what the caller does). Every state lists every event."""

_STATUS = {
    _S.OK: LeaseStatus.OK,
    _S.UNKNOWN: LeaseStatus.UNKNOWN,
    _S.STOPPING: LeaseStatus.OK,
    _S.STOPPING_UNKNOWN: LeaseStatus.UNKNOWN,
    _S.DONE: LeaseStatus.DONE,
    _S.EXPIRED: LeaseStatus.EXPIRED,
    _S.LOST: LeaseStatus.LOST,
    _S.GIVEN_BACK: LeaseStatus.LOST,
    _S.CANCELLED: LeaseStatus.CANCELLED,
}

_STOP = {
    _S.STOPPING: Stop.SHUTDOWN,
    _S.STOPPING_UNKNOWN: Stop.SHUTDOWN,
    _S.EXPIRED: Stop.LET_GO,
    _S.LOST: Stop.LEASE_LOST,
    _S.GIVEN_BACK: Stop.LEASE_LOST,
    _S.CANCELLED: Stop.CANCELLED,
}


@dataclass
class LocalLease:
    """One held job's lease as its worker sees it (mutable; owned by the worker shell).

    ``deadline`` is counted from *before* the request that granted it was sent.
    ``calls`` holds the deadline of every effect call in flight (start + its
    timeout), by a handle from :meth:`begin_call`. Its state moves only through
    :meth:`process` (:data:`TRANSITIONS`).
    """

    job_id: str
    token: int
    receipt_handle: str
    lease_seconds: int
    heartbeat_seconds: float
    jitter_seconds: float
    deadline: float
    started_at: float
    stage_deadline: float
    progress_timeout: float | None = None
    # The stage deadline is what was left of the message's 12-hour cap, shorter than
    # the class's budget: reaching it is Drop.MESSAGE_CAP, not Drop.STAGE_BUDGET.
    stage_capped: bool = False
    last_progress: float = 0.0
    next_beat: float = 0.0
    last_confirmed: float = 0.0
    # The handler's progress details (JSON, bounded) and the last the heartbeat saved:
    # a round writes them only when they differ (at most one write per heartbeat).
    progress: str | None = None
    progress_saved: str | None = None
    calls: dict[int, float] = field(default_factory=dict)
    _next_call: int = 0
    queue_url: str = ""  # the queue its message came from ("": the worker's one queue)
    # The attempt's nonce (``Claimed.nonce``): a record out of running under this
    # token is this attempt's own ending only when its write id carries it.
    nonce: str = ""
    _state: LeaseState = LeaseState.OK
    _reason: str = ""
    _dropped: Drop | None = None

    # ------------------------------------------------------------------ the one writer

    def process(self, event: LeaseEvent, reason: str = "", *, why: Drop | None = None) -> Action:
        """Apply ``event`` (:data:`TRANSITIONS`) and return what the caller must do.
        ``reason`` is kept when the event moves the state; ``why`` names a drop."""
        if event is LeaseEvent.DROPPED and why is None:
            raise ValueError("a drop names its reason (why=Drop...)")
        nxt, action = TRANSITIONS[self._state][event]
        if action is Action.IGNORE:
            return action
        self._state = nxt
        if event is LeaseEvent.DROPPED:
            assert why is not None
            self._dropped = why
            self._reason = why.value
        elif event is LeaseEvent.GAVE_BACK:
            self._reason = f"given back: {reason}"
        elif event in (LeaseEvent.LOST, LeaseEvent.CANCELLED, LeaseEvent.UNCONFIRMED):
            self._reason = reason
        return action

    # ------------------------------------------------------------------ views

    @property
    def state(self) -> LeaseState:
        return self._state

    @property
    def status(self) -> LeaseStatus:
        return _STATUS[self._state]

    @property
    def reason(self) -> str:
        return self._reason

    @property
    def dropped(self) -> Drop | None:
        """Why the worker let the message go (None: it did not)."""
        return self._dropped

    @property
    def shutdown(self) -> bool:
        """The worker asked this attempt to stop while it still held the job."""
        return self._state in (LeaseState.STOPPING, LeaseState.STOPPING_UNKNOWN)

    @property
    def given_back(self) -> bool:
        """It handed its job back itself (``heartbeats.gave_back``)."""
        return self._state is LeaseState.GIVEN_BACK

    @property
    def stop(self) -> Stop | None:
        """Why this attempt was told to stop, or None while it may go on."""
        return _STOP.get(self._state)

    @property
    def conservative_deadline(self) -> float:
        """Past this point no irreversible step may start, and the heartbeat stops."""
        return self.deadline - self.jitter_seconds

    def handle_ours(self, now: float) -> bool:
        """Whether a visibility change with this attempt's receipt handle can touch only
        its own receive. Past the conservative deadline SQS may have made the message
        visible and another receive may hold it: a change sent with the old handle
        would then move that receive's visibility (moto applies it; AWS does not
        promise to refuse it), handing the message to a third receiver under a live
        owner. So a lapsed attempt hands its message back by its record alone and lets
        the visibility it was given run out."""
        return now < self.conservative_deadline

    def begin_call(self, now: float, timeout: float) -> int:
        """An effect call starts now and may take ``timeout``; returns its handle."""
        self._next_call += 1
        self.calls[self._next_call] = now + timeout
        return self._next_call

    def end_call(self, handle: int, now: float) -> None:
        """The call ended (however): a finished call is progress."""
        self.calls.pop(handle, None)
        self.last_progress = now

    def drop(self, why: Drop) -> Action:
        """The worker lets the message go: nothing more is extended for this attempt."""
        return self.process(LeaseEvent.DROPPED, why=why)

    def may_record(self, now: float) -> bool:
        """Whether a write that records a fact (a confirm of a call that applied) may
        still be retried: the attempt is open (ownership confirmed or merely unknown)
        and its conservative deadline has not passed. Unlike :meth:`check`, an
        unanswered heartbeat does not end it: recording starts nothing irreversible."""
        return self.status in OPEN and now < self.conservative_deadline

    def stop_error(self) -> LeaseError | None:
        """The exception a handler's wait or check raises once the attempt was told to stop."""
        where = f"job {self.job_id} token {self.token}"
        stop = self.stop
        if stop is Stop.LEASE_LOST and self.given_back and self.dropped is not None:
            # Dropped, then handed back by its own ending: a handler still waking up
            # hears why it was dropped, however the two steps and its wake-up interleave.
            stop = Stop.LET_GO
        if stop is Stop.CANCELLED:
            return JobCancelled(f"job {self.job_id} was cancelled: {self.reason}")
        if stop is Stop.LEASE_LOST:
            return LeaseLost(f"{where}: lease lost ({self.reason})")
        if stop is Stop.SHUTDOWN or self.dropped is Drop.SHUTDOWN:
            return WorkerShuttingDown(
                f"{where}: the worker is shutting down; the job goes back to the queue"
            )
        if stop is Stop.LET_GO and self.dropped is Drop.MESSAGE_CAP:
            return OwnershipUnknown(
                f"{where}: its message reached SQS's 12-hour visibility cap; the job goes on "
                "under a new message (the attempt is not spent)"
            )
        if stop is Stop.LET_GO and self.dropped is Drop.WORKER_LATE:
            return OwnershipUnknown(
                f"{where}: the worker's heartbeat fell behind and let the lease go; the job "
                "was handed back (the attempt is not spent)"
            )
        if stop is Stop.LET_GO and self.dropped not in (None, Drop.RESERVE_SPENT):
            return AttemptTimedOut(
                f"{where}: stopped by the watchdog ({self.reason}); the job was given back "
                "for a counted retry"
            )
        if stop is Stop.LET_GO:
            return OwnershipUnknown(f"{where}: lease no longer held ({self.reason})")
        return None

    def check(self, now: float) -> None:
        """Raise unless a new irreversible step may start now."""
        error = self.stop_error()
        if error is not None:
            raise error
        if self.status is LeaseStatus.DONE:
            raise OwnershipUnknown(
                f"job {self.job_id} token {self.token}: lease no longer held ({self.status})"
            )
        if self.status is LeaseStatus.UNKNOWN:
            raise OwnershipUnknown(
                f"job {self.job_id} token {self.token}: ownership unconfirmed ({self.reason})"
            )
        if now >= self.conservative_deadline:
            raise OwnershipUnknown(
                f"job {self.job_id} token {self.token}: lease reserve spent "
                f"({self.conservative_deadline - now:.2f} s left)"
            )
