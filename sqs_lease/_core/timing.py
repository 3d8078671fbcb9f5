"""Lease arithmetic: timing rules, the local lease, the watchdog, backoff.

All times are seconds on the caller's monotonic clock; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .._errors import ConfigError, JobClassError
from .lease import OPEN, Drop, LeaseStatus, LocalLease

SQS_MAX_VISIBILITY = 43_200
"""SQS caps a receipt's total visibility at 12 h (AWS: from first receive; moto: from send)."""

CAP_MARGIN = 900.0
"""Distance kept from the 12-hour cap, covering the gap between send and our receive."""

EFFECT_MARGIN = 5.0
"""How long an effect call may run past its timeout before the watchdog stops the attempt.

The timeout is handed to the call (``EffectCall.timeout``, a socket timeout in
``effects.http_json``), which should give up first and say "outcome unknown"
itself; the watchdog is the backstop for a call that does not.
"""


def check_timing(
    name: str,
    lease: float,
    heartbeat: float,
    jitter: float,
    missed: int,
    stage_budget: float,
    *,
    effect_timeout: float | None = None,
    progress_timeout: float | None = None,
) -> None:
    """Refuse a job class whose timing cannot hold.

    The lease must survive its own heartbeat schedule; the three timeouts must
    fit each other: one effect call (``effect_timeout``, plus the watchdog's
    margin) and the no-progress limit (``progress_timeout``) each fit inside the
    attempt's budget (``stage_budget``), which holds at least one lease and stays
    under SQS's 12-hour cap less :data:`CAP_MARGIN`.
    """
    named = {
        "lease_seconds": lease,
        "heartbeat_seconds": heartbeat,
        "jitter_seconds": jitter,
        "stage_budget_seconds": stage_budget,
        "effect_timeout_seconds": effect_timeout,
        "progress_timeout_seconds": progress_timeout,
    }
    for field_name, value in named.items():
        if value is not None and not math.isfinite(value):
            raise JobClassError(
                f"job class {name!r}: {field_name}={value} must be a finite number of seconds"
            )
    if lease > SQS_MAX_VISIBILITY:
        raise JobClassError(
            f"job class {name!r}: lease_seconds={lease:g} exceeds SQS's 43200 s visibility cap; "
            "split the work into stages"
        )
    if lease != int(lease) or lease < 1:
        raise JobClassError(
            f"job class {name!r}: lease_seconds={lease:g} must be a whole number >= 1 "
            "(SQS visibility timeouts are whole seconds)"
        )
    if heartbeat <= 0 or jitter < 0 or missed < 0:
        raise JobClassError(
            f"job class {name!r}: heartbeat_seconds={heartbeat:g} must be > 0, "
            f"jitter_seconds={jitter:g} and missed_heartbeats={missed} must be >= 0"
        )
    if heartbeat > lease / 2:
        raise JobClassError(
            f"job class {name!r}: heartbeat_seconds={heartbeat:g} > lease_seconds/2={lease / 2:g}; "
            "beat at least twice per lease"
        )
    if lease <= missed * heartbeat + jitter:
        raise JobClassError(
            f"job class {name!r}: lease_seconds={lease:g} must exceed "
            f"missed_heartbeats x heartbeat_seconds + jitter_seconds = "
            f"{missed} x {heartbeat:g} + {jitter:g} = {missed * heartbeat + jitter:g}; "
            "raise the lease or beat more often"
        )
    check_beat_reserve(name, lease, heartbeat, jitter)
    if stage_budget > SQS_MAX_VISIBILITY - CAP_MARGIN:
        raise JobClassError(
            f"job class {name!r}: stage_budget_seconds={stage_budget:g} must stay under "
            f"{SQS_MAX_VISIBILITY - CAP_MARGIN:g} (12 h cap less {CAP_MARGIN:g} s); "
            "split into stages"
        )
    if stage_budget < lease:
        raise JobClassError(
            f"job class {name!r}: stage_budget_seconds={stage_budget:g} is below "
            f"lease_seconds={lease:g}; give the stage at least one lease"
        )
    if effect_timeout is not None:
        if effect_timeout <= 0:
            raise JobClassError(
                f"job class {name!r}: effect_timeout_seconds={effect_timeout:g} must be > 0 "
                "(the longest one effect call may take)"
            )
        if effect_timeout + EFFECT_MARGIN > stage_budget:
            raise JobClassError(
                f"job class {name!r}: effect_timeout_seconds={effect_timeout:g} + the watchdog's "
                f"margin {EFFECT_MARGIN:g} = {effect_timeout + EFFECT_MARGIN:g} exceeds "
                f"stage_budget_seconds={stage_budget:g}; one effect call must fit in the stage: "
                f"lower effect_timeout_seconds to at most {stage_budget - EFFECT_MARGIN:g} "
                "or raise stage_budget_seconds"
            )
    if progress_timeout is not None:
        if progress_timeout <= 0:
            raise JobClassError(
                f"job class {name!r}: progress_timeout_seconds={progress_timeout:g} must be > 0 "
                "(or None: no limit apart from the stage budget)"
            )
        if progress_timeout > stage_budget:
            raise JobClassError(
                f"job class {name!r}: progress_timeout_seconds={progress_timeout:g} exceeds "
                f"stage_budget_seconds={stage_budget:g}, so it could never fire; lower it to at "
                "most the stage budget, or leave it None"
            )


def check_beat_reserve(name: str, lease: float, heartbeat: float, jitter: float) -> None:
    """Refuse a class whose regular beat extends too late to survive one miss.

    A granted lease of ``lease`` seconds is next extended ``heartbeat`` seconds
    later, with ``lease - heartbeat`` left; if that beat is missed, the one after
    it comes another ``heartbeat`` later, and the watchdog lets the message go
    once only ``jitter`` is left (``now >= deadline - jitter``). So every
    extension must happen while *more than* one heartbeat interval plus the jitter
    budget remains: ``lease - heartbeat > heartbeat + jitter``. (``L > R x H + J``
    alone lets L = 3, H = 1.5, J = 0.4, R = 1 pass, extending with 1.5 s left:
    one missed beat and the lease lapses.)
    """
    reserve = heartbeat + jitter
    if lease - heartbeat > reserve:
        return
    # The fixes, in the class's own units: a whole-second lease just above
    # 2H + J, or a heartbeat just below (L - J) / 2.
    min_lease = math.floor(2 * heartbeat + jitter) + 1
    max_beat = (lease - jitter) / 2  # > 0: L > R x H + J >= J was checked first
    raise JobClassError(
        f"job class {name!r}: a beat extends the lease with lease_seconds - heartbeat_seconds "
        f"= {lease:g} - {heartbeat:g} = {lease - heartbeat:g} s left, which must exceed one "
        f"more heartbeat interval plus the jitter budget, heartbeat_seconds + jitter_seconds "
        f"= {heartbeat:g} + {jitter:g} = {reserve:g} s, or a single missed beat lets the lease "
        f"lapse (lease_seconds > 2 x heartbeat_seconds + jitter_seconds = "
        f"{2 * heartbeat + jitter:g}); raise lease_seconds to at least {min_lease} "
        f"or lower heartbeat_seconds below {max_beat:g}"
    )


def backoff_delay(attempt: int, base: float, cap: float, rand: float) -> int:
    """Full-jitter exponential backoff in whole seconds; ``rand`` in [0, 1) from the caller."""
    # Cap the exponent first: a huge attempt count must not overflow a float.
    ceiling = min(cap, base * (2.0 ** min(max(0, attempt - 1), 62)), SQS_MAX_VISIBILITY)
    return max(0, int(ceiling * rand))  # floor: never above the cap


@dataclass(frozen=True)
class BeatPlan:
    """One round's plan: the leases to extend (those due first, then ``early``, the
    ones joined to their group's shared round ahead of their own beat), the leases
    the watchdog lets go, and the shared rounds after this one (``rounds``: per
    heartbeat interval, when its group's next shared round is due)."""

    extend: tuple[LocalLease, ...]
    drop: tuple[tuple[LocalLease, Drop], ...]
    early: tuple[LocalLease, ...] = ()
    rounds: Mapping[float, float] = field(default_factory=dict)


def plan_heartbeat(
    leases: Iterable[LocalLease], now: float, rounds: Mapping[float, float] | None = None
) -> BeatPlan:
    """Pick the jobs due for extension now, and those the watchdog must let go.

    A finished, lost or cancelled job is never extended. The watchdog drops,
    never silently extends, a job that has spent its lease reserve, whose effect
    call ran past its timeout (plus :data:`EFFECT_MARGIN`), whose handler made no
    progress for ``progress_timeout`` (not counted while an effect call is in
    flight: the call's own timeout governs it), or whose next extension would
    cross the stage budget.

    ``rounds`` (the book's shared rounds, see :func:`shared_round`) turns on the
    alignment: a round that is a group's shared round also extends every open lease
    of that group that would come due before the group's next one, so the leases
    of one heartbeat interval converge onto one round per interval and its
    visibility batches and ownership reads fill. ``None``: the due leases only.
    """
    extend: list[LocalLease] = []
    drop: list[tuple[LocalLease, Drop]] = []
    waiting: list[LocalLease] = []
    for lease in leases:
        if lease.status not in OPEN:
            continue
        if now >= lease.conservative_deadline:
            # Confirmed at the last round and no call failed since: nobody but this
            # worker's own heartbeat (overloaded, paused, a held loop) let it run out.
            late = lease.status is LeaseStatus.OK
            drop.append((lease, Drop.WORKER_LATE if late else Drop.RESERVE_SPENT))
        elif lease.calls and now > min(lease.calls.values()) + EFFECT_MARGIN:
            drop.append((lease, Drop.EFFECT_TIMEOUT))
        elif (
            lease.progress_timeout is not None
            and not lease.calls
            and now - lease.last_progress > lease.progress_timeout
        ):
            drop.append((lease, Drop.NO_PROGRESS))
        elif now + lease.lease_seconds > lease.stage_deadline:
            drop.append((lease, Drop.MESSAGE_CAP if lease.stage_capped else Drop.STAGE_BUDGET))
        elif now >= lease.next_beat:
            extend.append(lease)
        else:
            # Open, passes every check above, not due: it may join a shared round.
            waiting.append(lease)
    if rounds is None:
        return BeatPlan(tuple(extend), tuple(drop))
    early, shared = shared_round(extend, waiting, now, rounds)
    return BeatPlan(tuple(extend + early), tuple(drop), tuple(early), shared)


def shared_round(
    due: Sequence[LocalLease],
    waiting: Sequence[LocalLease],
    now: float,
    rounds: Mapping[float, float],
) -> tuple[list[LocalLease], dict[float, float]]:
    """Which leases that are not due yet a round at ``now`` extends with the due
    ones, and the shared rounds after it.

    Leases are grouped by heartbeat interval ``H``; ``rounds[H]`` is when the
    group's next shared round is due (absent: the group has none yet). A round at
    which some lease of the group is due and that is at or past ``rounds[H]`` (or
    the group has none) is the group's shared round: it also extends every lease of
    the group that would come due before ``now + H``, the next shared round, which
    it sets. Those all get their next beat at ``now + H``: from then on they are
    due together, one round per ``H`` whose batches fill.

    A round before ``rounds[H]`` (a lease due off the schedule: a first beat
    sooner than ``H``, a retry after an unanswered round) extends the due leases
    and the others that would also come due before ``rounds[H]`` (they could not
    wait for it either), never the group itself; they all join the group at its
    next shared round. A few leases never pull the whole group ahead of its
    schedule, so no lease is renewed more than once per ``H`` by the schedule,
    plus once when it joins.

    Only leases that passed every watchdog check of :func:`plan_heartbeat` are
    offered (``waiting``): open, before the conservative deadline, within the stage
    budget for one more lease. Extending early never shortens a lease, and every
    extension still confirms ownership, so a lease is read at least as often as
    its own schedule asks.
    """
    present = {lease.heartbeat_seconds for lease in due} | {
        lease.heartbeat_seconds for lease in waiting
    }
    shared = {beat: at for beat, at in rounds.items() if beat in present}
    early: list[LocalLease] = []
    for beat in sorted({lease.heartbeat_seconds for lease in due}):
        at = shared.get(beat)
        if at is not None and now < at:
            # Off the group's schedule: only the leases that cannot wait for it either.
            horizon = at
        else:
            horizon = now + beat
            shared[beat] = horizon
        early += [w for w in waiting if w.heartbeat_seconds == beat and may_join(w, now, horizon)]
    return early, shared


def may_join(lease: LocalLease, now: float, horizon: float) -> bool:
    """Whether a lease that is not due may be extended at ``now`` with a shared round
    whose next one is at ``horizon``: it would come due before then, and an
    extension now stays within every bound a due one keeps. Its attempt is open;
    its handle is still its own (before the conservative deadline: past it no
    visibility change is sent with it, :meth:`LocalLease.handle_ours`); one more
    lease from now stays within the stage budget (the heartbeat never extends past
    it). Checked here again, whoever offers the lease."""
    return (
        lease.status in OPEN
        and now < lease.next_beat < horizon
        and lease.handle_ours(now)
        and now + lease.lease_seconds <= lease.stage_deadline
    )


# --------------------------------------------------------------------------- the event loop

DEFAULT_LOOP_LAG = 1.0
"""The async worker's default tolerated loop lag (seconds), lowered to fit short leases."""


def loop_lag_limit(lease_seconds: float, heartbeat_seconds: float, jitter_seconds: float) -> float:
    """The longest stall of the event loop a lease of this timing survives unobserved.

    The heartbeat runs on the loop: a lease extended (counted from the send) just
    before a stall is next due ``heartbeat_seconds`` later, and must go out before
    its conservative deadline (``lease - jitter``). So a stall shorter than
    ``lease - heartbeat - jitter`` costs no lease; a longer one may.
    """
    return lease_seconds - heartbeat_seconds - jitter_seconds


def tolerated_loop_lag(
    requested: float | None, timings: Iterable[tuple[str, float, float, float]]
) -> float:
    """The loop lag an async worker tolerates, for job classes given as
    ``(name, lease, heartbeat, jitter)``; raise ``ConfigError`` naming the numbers.

    A stall within the tolerated lag is attributed to nobody and costs no lease, so
    it must stay under every class's :func:`loop_lag_limit`. The default is
    :data:`DEFAULT_LOOP_LAG`, or half the tightest limit when that is smaller.
    """
    limits = {name: loop_lag_limit(lease, beat, jitter) for name, lease, beat, jitter in timings}
    if not limits:
        raise ConfigError("the app registers no job class; add one with @app.job(...)")
    tightest = min(limits, key=lambda n: limits[n])
    limit = limits[tightest]
    if requested is None:
        return min(DEFAULT_LOOP_LAG, limit / 2)
    if not (math.isfinite(requested) and 0 < requested < limit):
        raise ConfigError(
            f"max_loop_lag={requested!r}: give seconds > 0 and below {limit:g}, the longest "
            f"loop stall job class {tightest!r} survives (lease_seconds - heartbeat_seconds - "
            "jitter_seconds); a stall the worker tolerates must never cost a lease"
        )
    return requested


@dataclass(frozen=True)
class Stall:
    """What one stall of the event loop costs (see :func:`judge_stall`).

    ``drop`` is the blocker's lease when the worker must stop extending it (its
    handler held the loop past the tolerated lag: a loop it blocks cannot tell it
    from a hung handler); ``lapsed`` are the other leases whose reserve the stall
    spent (the heartbeat lets them go, journaled); ``event`` the ``loop_unblocked``
    fields to journal, or None for a stall within tolerance (``loopwatch``); ``token``
    the blocker's lease's token (None: no job's lease) and ``blocked_for`` the stall's
    length, as the event says them.
    """

    drop: LocalLease | None
    lapsed: tuple[LocalLease, ...]
    event: dict[str, object] | None
    token: int | None = None
    blocked_for: float = 0.0


def judge_stall(
    leases: Iterable[LocalLease],
    *,
    blocker: LocalLease | None,
    blocker_job: str | None,
    began: float,
    ended: float,
    tolerated: float,
) -> Stall:
    """Judge a stall of the event loop from ``began`` to ``ended`` (the lease clock).

    Within ``tolerated`` seconds nothing happens. Past it, the handler that held
    the loop (``blocker``, when a job's step did) loses its lease: the worker stops
    extending it and its attempt is given back for a counted retry; every other
    open lease whose conservative deadline the stall crossed is named as lapsed
    (nobody extended it while the loop was held), so no lease lapses unjournaled.
    """
    blocked_for = ended - began
    if blocked_for <= tolerated:
        return Stall(None, (), None)
    drop = blocker if blocker is not None and blocker.status in OPEN else None
    lapsed = tuple(
        lease
        for lease in leases
        if lease is not blocker and lease.status in OPEN and ended >= lease.conservative_deadline
    )
    token = blocker.token if blocker is not None else None
    event: dict[str, object] = {
        "job_id": blocker_job,
        "token": token,
        "blocked_for": round(blocked_for, 3),
        "tolerated": tolerated,
        "blocker_dropped": drop is not None,
        "lapsed": len(lapsed),
    }
    return Stall(drop, lapsed, event, token, round(blocked_for, 3))


# --------------------------------------------------------------------------- backpressure

PACE_SHARE = 0.5
"""The part of a lease's slack a heartbeat round may spend late before the worker
stops taking new work (the other half is left for what it cannot foresee)."""

PACE_START = 100
"""Leases a worker takes on before any heartbeat round has shown what one costs."""


def pace_budget(timings: Iterable[tuple[float, float, float]]) -> float:
    """How late (seconds) a heartbeat round may complete before the worker must stop
    taking work, for job classes given as ``(lease, heartbeat, jitter)``.

    A beat due at ``next_beat`` that completes more than ``lease - heartbeat -
    jitter`` late finds its lease past the conservative deadline (the slack,
    :func:`loop_lag_limit`); a round that runs longer than ``heartbeat`` makes the
    next one late as well. The budget is :data:`PACE_SHARE` of the smaller of the
    two, for the tightest class.
    """
    slack = min(min(beat, loop_lag_limit(lease, beat, jitter)) for lease, beat, jitter in timings)
    return PACE_SHARE * slack


LATE_HANDBACK_LIMIT = 3
"""Late hand-backs of one job at one stage, the last of them charged (see
:func:`late_charged`)."""


def late_charged(late_handbacks: int) -> bool:
    """Whether a late hand-back of a job already handed back late ``late_handbacks``
    times at its stage keeps (charges) the attempt.

    A worker whose own heartbeat let a lease run out (a suspended process, an
    overloaded host) hands the job back uncharged: the job did nothing wrong. But
    a handler that holds the GIL (a long C call: a regex, big-number arithmetic, an
    extension that keeps the lock) stops the heartbeat thread on every attempt, and
    so makes its worker late every time: uncharged, it would run until SQS moves its
    message to the DLQ, and its class's ``max_attempts`` would never end it. A worker
    pause that hits the same job at the same stage :data:`LATE_HANDBACK_LIMIT` times
    running is unlikely; a job that blocks its worker does it every time. So from the
    LATE_HANDBACK_LIMIT-th on, a late hand-back is charged, and ``max_attempts`` ends
    the job (``attempts_exhausted`` at its next claim), in a bounded number of receives.
    """
    return late_handbacks + 1 >= LATE_HANDBACK_LIMIT


def beat_due(lease: LocalLease) -> float:
    """When a lease's beat fell due, as the pace measures a round's lateness: its
    schedule (``next_beat``), or the moment this worker took the lease on, whichever
    is later. A receive that granted less than the class's L makes the first beat due
    before the lease began (brought to L at once: ``leasebook.new_lease``); that beat
    waited on no round of this worker before the worker held it, and counting from
    its schedule would read a round that ran at once as up to L late, stopping all
    new work after every such claim."""
    return max(lease.next_beat, lease.started_at)


@dataclass
class Pace:
    """How many leases this worker's heartbeat keeps on time (backpressure).

    Every round that extends leases is measured (:meth:`observe`): how late its
    most overdue extension completed against its schedule (``late``), and what one
    lease cost it (its duration over the leases it extended). From the cost the
    pace projects how many leases a round can extend within :attr:`budget`
    (``capacity``); :meth:`room` is how many more the worker may take on. A round
    that completed later than the budget stops all new work (``throttled``) until
    one completes within it again: the worker stops receiving *before* a round is
    late enough to cost a lease (at twice the budget).
    """

    budget: float
    start: int = PACE_START
    capacity: int | None = None  # None: no round measured yet
    proven: int = 0  # the largest round kept on time since the last late one
    late: float = 0.0
    throttled: bool = False

    def observe(self, *, extended: int, due: float, started: float, ended: float) -> bool:
        """A round that extended ``extended`` leases ran from ``started`` to ``ended``;
        the most overdue of them was due at ``due``. Returns True when this round
        turned backpressure on or off.

        On time (``late`` within the budget) the worker may hold twice the largest
        round it has kept on time since it was last late, or what the cost projects,
        whichever is more (a round of a few leases is all latency: its projection
        alone would starve a worker whose heartbeat keeps up). Late, it holds no
        more than the projection allows, and takes nothing new until a round is on
        time again.
        """
        if extended <= 0:
            return False
        self.late = max(0.0, ended - due)
        cost = max(ended - started, 1e-6) / extended
        projected = max(1, math.floor(self.budget / cost))
        was, self.throttled = self.throttled, self.late > self.budget
        if self.throttled:
            self.proven = 0
            self.capacity = min(projected, extended)
        else:
            self.proven = max(self.proven, extended)
            self.capacity = max(self.start, 2 * self.proven, projected)
        return was != self.throttled

    def room(self, held: int) -> int:
        """How many more leases the worker may take on while its heartbeat extends
        ``held`` (its open leases: what the throttle protects).

        Throttled, none while it extends any. With none left (all ended, or taken
        over during the pause that made a round late) there is no round that could
        be late, and none that would ever lift the throttle: it lets go (issue 26
        defect 11), and the next lease held is protected again."""
        if self.throttled and held > 0:
            return 0
        limit = self.capacity if self.capacity is not None else self.start
        return max(0, limit - held)
