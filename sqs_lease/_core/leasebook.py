"""The lease book: the leases one worker holds, and every transition of a local lease.

One book per worker process, shared by its attempts (``attempt_flow``) and its
heartbeat round (``heartbeat_round_flow``). It owns what used to live in each
worker shell: holding a claimed lease (with the stage deadline), telling an
attempt to stop, marking its end, the loss a rejected write or a refused intent
start reveals, the watchdog's drops, applying a heartbeat round's verdicts, the
shutdown hand-back, and forgetting an attempt when it ends.

The book is pure: no I/O, no clock (times are passed in). Two things come from
the shell that runs it:

- ``lock``: a context manager guarding the book's state. The thread worker gives
  a ``threading.Lock`` (job threads and the heartbeat thread share the book); a
  single-threaded shell (asyncio, the simulator) gives nothing.
- each held attempt's ``cancelled`` :class:`Signal` (``set()``/``is_set()``): a
  ``threading.Event`` wakes a job thread's ``ctx.wait()``, an ``asyncio.Event`` a
  task, a :class:`Flag` the simulator's scripted handler. The book sets it with
  every stop it tells an attempt (never clears it).

Methods take the lock themselves and never call back into the shell while holding
it (``on_hold`` runs after it is released).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .calls import Emit
from .claiming import Claimed
from .fencing import Finish
from .heartbeats import (
    BeatOutcome,
    HeartbeatReport,
    LossSource,
    apply_beats,
    gave_back,
    lose,
    lost_event,
    rejected_loss,
)
from .lease import OPEN, Action, Drop, LeaseEvent, LeaseStatus, LocalLease, Stop
from .messages import Delivery
from .records import JobView
from .stages import stage_log
from .timing import BeatPlan, Pace, Stall, judge_stall, plan_heartbeat


class Signal(Protocol):
    """How a running attempt is told to stop (a ``threading.Event``, an ``asyncio.Event``)."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...


class Flag:
    """A plain :class:`Signal` for a shell whose handlers look at a flag (the simulator)."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class Guard(Protocol):
    """The book's lock: any context manager (``threading.Lock``, or :class:`NoLock`)."""

    def __enter__(self) -> Any: ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any, /) -> Any: ...


class NoLock:
    """The lock of a book used by one thread only (asyncio, the simulator)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any, /) -> None:
        return None


class LeaseRules(Protocol):
    """What the book and the attempt flow read of a job class (``JobClass`` has it all)."""

    @property
    def lease_seconds(self) -> int: ...
    @property
    def heartbeat_seconds(self) -> float: ...
    @property
    def jitter_seconds(self) -> float: ...
    @property
    def stage_budget_seconds(self) -> float: ...
    @property
    def progress_timeout_seconds(self) -> float | None: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def backoff_base_seconds(self) -> float: ...
    @property
    def backoff_max_seconds(self) -> float: ...


HAND_BACK_STALE = 60.0
"""Seconds a claim waits for this worker's hand-back of the same job's lapsed attempt
(one fenced write, its retries bounded by the driver's timeouts) before it no longer
counts it as under way."""


@dataclass(eq=False)
class Held:
    """One attempt the worker holds: its lease, the record as claimed, its message."""

    lease: LocalLease
    job: JobView
    delivery: Delivery
    cancelled: Signal
    tag: Any = None  # the shell's own (the simulator keeps the job task's origin here)


def new_lease(claim: Claimed, rules: LeaseRules, now: float) -> LocalLease:
    """The local lease of a fresh claim, at monotonic ``now``.

    The stage deadline counts from the receive (``received_at``), not the claim:
    the time a message waited in this worker before its claim is the stage's too.
    The first beat comes when a lease of L granted at the deadline's start would
    be due (``deadline - L + H``), or ``H`` from now if that is sooner: a lease the
    receive granted shorter than the class's L (its VisibilityTimeout is the
    shortest lease of the worker's classes) is brought to L at once.
    """
    return LocalLease(
        job_id=claim.job.job_id,
        token=claim.token,
        receipt_handle=claim.delivery.receipt_handle,
        lease_seconds=rules.lease_seconds,
        heartbeat_seconds=rules.heartbeat_seconds,
        jitter_seconds=rules.jitter_seconds,
        deadline=claim.deadline,
        started_at=now,
        stage_deadline=claim.delivery.received_at + rules.stage_budget_seconds,
        # A budget cut to what is left of the message's 12-hour cap (stages.CappedRules).
        stage_capped=bool(getattr(rules, "capped", False)),
        progress_timeout=rules.progress_timeout_seconds,
        last_progress=now,
        next_beat=min(
            now + rules.heartbeat_seconds,
            claim.deadline - rules.lease_seconds + rules.heartbeat_seconds,
        ),
        last_confirmed=now,
        queue_url=claim.delivery.queue_url,
        nonce=claim.nonce,
    )


def handed_on(earlier: Held, claim: Claimed) -> bool:
    """Whether ``earlier``'s own stage ending moved the job to the stage ``claim`` holds.

    Its checkpoint, written under its token, is in the claimed record's stage log:
    the next stage's message it sent can reach this worker while it is still
    finishing (queueing its delete), and that claim takes nothing from it. A
    checkpoint names the one token that wrote it, so another owner's takeover of the
    stage (a newer token in the log, or none) still counts as a loss.
    """
    stage, token = earlier.job.stage, earlier.lease.token
    return stage is not None and any(
        e.stage == stage and e.token == token for e in stage_log(claim.job)
    )


@dataclass(eq=False)
class Claiming:
    """One attempt's claim of a job, from its write until the book holds it (or the
    attempt ends without): its token is None while the write is under way, then the
    claimed token, live until ``deadline`` (the claim's conservative deadline, lease
    clock). The attempt runs all that time (validating, taking its slots) though the
    book holds no lease of it yet: a copy of the job is a duplicate to a live owner."""

    job_id: str
    token: int | None = None
    deadline: float = 0.0


@dataclass(frozen=True)
class Holding:
    """What :meth:`LeaseBook.hold` did: the new entry, and the earlier attempt of the
    same job it superseded (its loss event to journal, if any)."""

    held: Held
    superseded: bool
    event: Emit | None


class LeaseBook:
    """The leases one worker holds (see the module doc)."""

    def __init__(
        self,
        lock: Guard | None = None,
        on_hold: Callable[[], None] | None = None,
        pace: Pace | None = None,
    ) -> None:
        self.lock: Guard = lock if lock is not None else NoLock()
        # What the heartbeat keeps on time (None: no backpressure, the simulator's
        # scripted worlds and hand-driven tests).
        self.pace = pace
        self._held: dict[str, Held] = {}
        # Set without the lock (a signal handler may set it): every lease held from
        # now on is told to stop as it is held.
        self.stopping = False
        self._on_hold = on_hold  # a shell whose heartbeat sleeps until due wakes it
        # When the heartbeat last wrote the worker's liveness record (lease clock).
        self.liveness_at: float | None = None
        # How many liveness records it wrote: the counter a claimer watches move.
        self.liveness_beats = 0
        # Per heartbeat interval, when its leases' next shared round is due
        # (``timing.shared_round``): the leases of one interval beat together.
        self.rounds: dict[float, float] = {}
        # Leases dropped because this worker's own heartbeat came late, by job, until
        # their hand-back (which gives back the attempt) has landed: a claim of the
        # same job must not overtake it (:meth:`before_claim`).
        # The drop's time (lease clock) bounds the wait: HAND_BACK_STALE.
        self._handing_back: dict[str, tuple[LocalLease, float]] = {}
        # Claims not yet held, by the attempt's nonce (:class:`Claiming`).
        self._claims: dict[str, Claiming] = {}

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        with self.lock:
            return len(self._held)

    def entries(self) -> list[Held]:
        """A snapshot of the held attempts."""
        with self.lock:
            return list(self._held.values())

    def get(self, job_id: str) -> Held | None:
        with self.lock:
            return self._held.get(job_id)

    def room(self, free: int) -> int:
        """How many new messages the worker may take on now, of ``free`` open slots:
        no more than its heartbeat keeps on time (:class:`~sqs_lease._core.timing.Pace`).

        The pace counts the leases the heartbeat still extends (open), not every
        attempt held: a handler fenced out (its lease lost, dropped or done) may run
        on for long, and no round of its would ever lift a throttle it kept on."""
        if self.pace is None:
            return free
        with self.lock:
            extended = sum(1 for h in self._held.values() if h.lease.status in OPEN)
            return max(0, min(free, self.pace.room(extended)))

    def ending(self) -> int:
        """Attempts whose handler ended and whose end write is still under way (their
        entries go when the attempt is over): a shell waits for them at shutdown."""
        with self.lock:
            return sum(1 for h in self._held.values() if h.lease.status is LeaseStatus.DONE)

    # ------------------------------------------------------------------ one attempt

    def hold(
        self, claim: Claimed, rules: LeaseRules, now: float, cancelled: Signal, tag: Any = None
    ) -> Holding:
        """Hold a fresh claim's lease. An earlier attempt of the same job in this book
        lost its lease to this claim (our own claim moved the token): it is told,
        unless it handed the job on itself (:func:`handed_on`)."""
        held = Held(new_lease(claim, rules, now), claim.job, claim.delivery, cancelled, tag)
        ev: Emit | None = None
        with self.lock:
            earlier = self._held.get(claim.job.job_id)
            if earlier is not None and (earlier.lease.given_back or handed_on(earlier, claim)):
                # It handed the job back itself (a late drop's release, a watchdog
                # retry), or a stage boundary: nothing was superseded, nothing is lost.
                earlier = None
            if earlier is not None:
                # A retry or a duplicate delivery reached this worker: that attempt is lost.
                ev = lose(
                    earlier.lease,
                    LossSource.OWN_CLAIM,
                    f"token moved to {claim.token} by this worker",
                )
                earlier.cancelled.set()
            if self.stopping:
                # Claimed while the worker stops: the attempt is told at once.
                held.lease.process(LeaseEvent.STOP_ASKED)
                held.cancelled.set()
            self._held[claim.job.job_id] = held
        if self._on_hold is not None:
            self._on_hold()
        return Holding(held, earlier is not None, ev)

    def told(self, held: Held) -> Stop | None:
        """The stop this attempt was told so far (None: it may go on)."""
        with self.lock:
            return held.lease.stop

    def mark(self, held: Held) -> Stop | None:
        """Mark the attempt's end (its handler returned); return the stop it was told
        before (None: none). A lease that ended is never extended again."""
        with self.lock:
            stop = held.lease.stop
            held.lease.process(LeaseEvent.RETURNED)
            return stop

    def forget(self, held: Held, end: Finish | None) -> None:
        """The attempt is over (``end``: its end write, if any): drop its entry, not a
        newer attempt's. Every attempt goes, however it ended."""
        with self.lock:
            if self._held.get(held.job.job_id) is held:
                del self._held[held.job.job_id]

    def rejected(
        self, held: Held | None, claim: Claimed, fin: Finish, source: LossSource
    ) -> Emit | None:
        """A fenced end write of this attempt was (maybe) rejected: its lease is gone.
        The loss event to journal, once per attempt (None: nothing new)."""
        loss = rejected_loss(fin)
        if loss is None:
            return None
        reason, cancelled = loss
        if held is None:  # a write right after the claim, before the lease was held
            return lost_event(claim.job.job_id, claim.token, LossSource.CLAIM, reason, cancelled)
        with self.lock:
            ev = lose(held.lease, source, reason, cancelled=cancelled)
            held.cancelled.set()
        return ev

    def intent_refused(
        self, held: Held, reason: str, source: LossSource = LossSource.INTENT_START
    ) -> Emit | None:
        """A refusal that proves another owner: the fenced intent start found the
        token moved, or a fenced receiver refused the call (``LeaseLost``). It is the
        news of the loss: tell the attempt, return the event (once per attempt).

        Also for a lease the watchdog let go without a write (its reserve spent: the
        before-send pause, issue 26): nothing of this worker moved the record, so the
        attempt ends told ``LeaseLost``, not ``OwnershipUnknown``. A lease handed back
        (a retry, a release, a resend) stays quiet: its own write may be the refusal's
        cause, and its ``lease_dropped`` already told it."""
        with self.lock:
            lease = held.lease
            if lease.status not in OPEN and lease.dropped is not Drop.RESERVE_SPENT:
                return None
            ev = lose(lease, source, reason)
            if ev is not None:
                held.cancelled.set()
        return ev

    def gave_back(self, helds: Sequence[Held], reason: str) -> None:
        """These attempts handed their jobs back (a watchdog retry, a shutdown release):
        a late end write of theirs reports no second loss."""
        with self.lock:
            for h in helds:
                gave_back(h.lease, reason)
                marked = self._handing_back.get(h.lease.job_id)
                if marked is not None and marked[0] is h.lease:
                    del self._handing_back[h.lease.job_id]

    def before_claim(self, job_id: str, now: float) -> tuple[Held | None, float | None]:
        """A new delivery names ``job_id``: what of it this worker must settle first.

        After the worker's own heartbeat fell behind (a held loop, an overloaded or
        suspended process), SQS can deliver a job's message again while this book
        still holds the attempt whose lease lapsed. Its hand-back (``WORKER_LATE``:
        the fenced release that gives back the attempt its claim counted) must land
        before a new claim: a claim that lands first takes the job over from the
        lapsed attempt, the release then finds the token moved, and the job is
        charged an attempt for the worker's own lateness.

        Returns ``(held, 0.0)`` when such a lease was still open: it is dropped now
        (the next round would have dropped it the same way) and the caller hands it
        back before it claims. ``(None, age)``: a hand-back of the job has been under
        way elsewhere (a heartbeat round dropped it) for ``age`` seconds: the caller
        leaves the delivery for a while. ``(None, None)``: nothing to settle; claim
        as usual.
        """
        with self.lock:
            marked = self._handing_back.get(job_id)
            if marked is not None and now - marked[1] < HAND_BACK_STALE:
                return None, max(0.0, now - marked[1])
            # A hand-back that never said it ended (its flow raised) holds nothing.
            self._handing_back.pop(job_id, None)
            h = self._held.get(job_id)
            if h is None or not self._drop_late(h, now):
                return None, None
        return h, 0.0

    def lapsed_before_start(self, held: Held, now: float) -> bool:
        """The attempt's handler is about to start: whether its lease already ran out
        (the claim, the first lease's extension or the slots took longer than the
        receive's visibility left; a paused process). Then no handler may start (a
        tool under a limit would run beside the slot's next holder, and its effects
        would be fenced out anyway): the lease is dropped ``WORKER_LATE`` and the
        caller hands the job back, uncharged, as the heartbeat would have."""
        with self.lock:
            return self._held.get(held.job.job_id) is held and self._drop_late(held, now)

    def _drop_late(self, h: Held, now: float) -> bool:
        # Confirmed, then run out: the verdict plan_heartbeat gives WORKER_LATE.
        if h.lease.status is not LeaseStatus.OK or now < h.lease.conservative_deadline:
            return False
        h.lease.drop(Drop.WORKER_LATE)
        h.cancelled.set()
        self._handing_back[h.lease.job_id] = (h.lease, now)
        return True

    def holds_open(self, job_id: str, token: int, now: float) -> bool:
        """This worker holds ``job_id`` at ``token`` with a lease it may still extend
        and has not let run past its conservative deadline: a delivery of the job to
        another of its attempts is a duplicate to a live owner (``_core/duplicates``)."""
        with self.lock:
            h = self._held.get(job_id)
            return (
                h is not None
                and h.lease.token == token
                and is_open(h)
                and now < h.lease.conservative_deadline
            )

    def claiming(self, nonce: str, job_id: str) -> None:
        """The attempt ``nonce`` sends a claim of ``job_id`` (its first, or a take-over)."""
        with self.lock:
            self._claims[nonce] = Claiming(job_id)

    def claimed(self, nonce: str, token: int, deadline: float) -> None:
        """Its claim landed at ``token``: the attempt owns the job until it holds it."""
        with self.lock:
            c = self._claims.get(nonce)
            if c is not None:
                c.token, c.deadline = token, deadline

    def unclaim(self, nonce: str) -> None:
        """The attempt's claim is settled: refused, held (the book's entry says the
        rest), or the attempt ended before its hold. Idempotent."""
        with self.lock:
            self._claims.pop(nonce, None)

    def claim_pending(self, job_id: str, token: int, now: float) -> bool:
        """An attempt of this worker claimed ``job_id`` at ``token`` and has not held
        it yet (nor let its claim run past its conservative deadline)."""
        with self.lock:
            return any(
                c.job_id == job_id and c.token == token and now < c.deadline
                for c in self._claims.values()
            )

    def pending_claims(self, now: float) -> list[Claiming]:
        """The landed claims not yet held, live (the liveness record lists them)."""
        with self.lock:
            return [c for c in self._claims.values() if c.token is not None and now < c.deadline]

    def owns(self, job_id: str, token: int, now: float) -> bool:
        """A delivery of ``job_id`` found its record running under this worker at
        ``token``: is that a live attempt of this worker (``_core/duplicates.py``)?
        Yes, inside the attempt's conservative deadline, from its claim's write to its
        end write: when an attempt claimed it and holds it not yet, holds it open, or
        its handler returned and its end write is under way (a take-over would refuse
        that write and throw the work away); and when another claim of the job is
        under way here (its answer, not this delivery's, settles the job: the record
        may be at that claim's token)."""
        if self.claim_pending(job_id, token, now):
            return True
        with self.lock:
            h = self._held.get(job_id)
            if (
                h is not None
                and h.lease.token == token
                and (is_open(h) or h.lease.status is LeaseStatus.DONE)
                and now < h.lease.conservative_deadline
            ):
                return True
            return any(c.job_id == job_id and c.token is None for c in self._claims.values())

    # ------------------------------------------------------------------ the worker

    def request_stop(self) -> None:
        """Tell every attempt still held to stop (the worker shuts down; idempotent)."""
        self.stopping = True
        with self.lock:
            for h in self._held.values():
                if h.lease.process(LeaseEvent.STOP_ASKED) is Action.TELL:
                    h.cancelled.set()

    def let_go(self) -> list[Held]:
        """The shutdown grace is over: drop every lease still open and return them,
        for the release that hands their jobs back."""
        with self.lock:
            left = [h for h in self._held.values() if h.lease.status in OPEN]
            for h in left:
                h.lease.drop(Drop.SHUTDOWN)
                h.cancelled.set()
        return left

    # ------------------------------------------------------------------ the heartbeat

    def plan_round(self, now: float) -> tuple[BeatPlan, list[tuple[Held, Drop]]]:
        """Plan a heartbeat round at ``now``; the watchdog's drops are applied (their
        attempts told) and returned with their reasons. The round also extends, with
        the due leases, those that join their group's shared round (``plan.early``:
        :func:`~sqs_lease._core.timing.shared_round`), and moves the book's
        schedule of shared rounds on."""
        with self.lock:
            plan = plan_heartbeat([h.lease for h in self._held.values()], now, self.rounds)
            self.rounds = dict(plan.rounds)
            dropped = [(self._held[lease.job_id], why) for lease, why in plan.drop]
            for held, why in dropped:
                held.lease.drop(why)
                held.cancelled.set()
                if why is Drop.WORKER_LATE:
                    self._handing_back[held.lease.job_id] = (held.lease, now)
        return plan, dropped

    def loop_stalled(
        self,
        job_id: str | None,
        *,
        began: float,
        ended: float,
        tolerated: float,
    ) -> tuple[Stall, list[tuple[Held, Drop]]]:
        """The event loop was held from ``began`` to ``ended`` (by job ``job_id``'s step,
        if known): the core's verdict (:func:`~sqs_lease._core.timing.judge_stall`).
        The blocker's lease is dropped and its attempt told; it is returned, like the
        watchdog's drops, for its hand-back (``watchdog_drops_flow``). The leases the
        stall let lapse are named in the verdict; the next round drops them."""
        with self.lock:
            blocker = self._held.get(job_id) if job_id is not None else None
            stall = judge_stall(
                [h.lease for h in self._held.values()],
                blocker=blocker.lease if blocker is not None else None,
                blocker_job=job_id,
                began=began,
                ended=ended,
                tolerated=tolerated,
            )
            dropped: list[tuple[Held, Drop]] = []
            if stall.drop is not None and blocker is not None:
                blocker.lease.drop(Drop.LOOP_BLOCKED)
                blocker.cancelled.set()
                dropped.append((blocker, Drop.LOOP_BLOCKED))
        return stall, dropped

    def paced(
        self, leases: Sequence[LocalLease], *, due: float, started: float, ended: float
    ) -> Emit | None:
        """Measure a round that extended ``leases`` (the most overdue due at ``due``)
        against the pace; the ``backpressure_on``/``backpressure_off`` event when it
        turned backpressure on or off."""
        if self.pace is None or not leases:
            return None
        with self.lock:
            pace = self.pace
            changed = pace.observe(extended=len(leases), due=due, started=started, ended=ended)
            held = len(self._held)
        if not changed:
            return None
        return Emit(
            "backpressure_on" if pace.throttled else "backpressure_off",
            {
                "held": held,
                "capacity": pace.capacity,
                "round_late": round(pace.late, 3),
                "budget": round(pace.budget, 3),
                "round_seconds": round(ended - started, 3),
            },
        )

    def still_open(self, leases: Sequence[LocalLease]) -> list[LocalLease]:
        """The planned leases still open: the drops' writes can take long (a partition),
        and a handler that ended meanwhile must not get its visibility extended."""
        with self.lock:
            return [lease for lease in leases if lease.status in OPEN]

    def still_holds(self, lease: LocalLease) -> bool:
        """Whether this very lease is still held, and open (not dropped, ended or
        superseded by a newer own claim of its job)."""
        with self.lock:
            h = self._held.get(lease.job_id)
            return h is not None and h.lease is lease and lease.status in OPEN

    def held_of(self, lease: LocalLease) -> Held | None:
        """The entry holding this very lease (None: it was forgotten or superseded)."""
        with self.lock:
            h = self._held.get(lease.job_id)
            return h if h is not None and h.lease is lease else None

    def apply_round(
        self,
        leases: Sequence[LocalLease],
        report: HeartbeatReport,
        *,
        started: float,
    ) -> tuple[BeatOutcome, int]:
        """Move the leases this worker still holds by the round's verdicts, and tell the
        attempts that lost theirs. Returns the changes and how many verdicts were for
        an attempt a newer own claim had replaced while the round was in flight."""
        with self.lock:
            current: list[LocalLease] = []
            superseded = 0
            for lease in leases:
                h = self._held.get(lease.job_id)
                if h is not None and h.lease is lease:
                    current.append(lease)
                elif h is not None:
                    superseded += 1
            changed = apply_beats(current, report, started=started)
            for lease in changed.cancel:
                self._held[lease.job_id].cancelled.set()
        return changed, superseded


def is_open(held: Held) -> bool:
    """True while the attempt's lease may still be extended."""
    return held.lease.status in OPEN


__all__ = [
    "Claiming",
    "Flag",
    "Guard",
    "Held",
    "Holding",
    "LeaseBook",
    "LeaseRules",
    "NoLock",
    "Signal",
    "is_open",
    "new_lease",
]
