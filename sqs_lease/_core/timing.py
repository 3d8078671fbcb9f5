"""Lease arithmetic: timing rules, the local lease, the watchdog, backoff.

All times are seconds on the caller's monotonic clock; nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from .._errors import JobCancelled, JobClassError, LeaseLost, OwnershipUnknown

SQS_MAX_VISIBILITY = 43_200
"""SQS caps a receipt's total visibility at 12 h (AWS: from first receive; moto: from send)."""

CAP_MARGIN = 900.0
"""Distance kept from the 12-hour cap, covering the gap between send and our receive."""


def check_timing(
    name: str,
    lease: float,
    heartbeat: float,
    jitter: float,
    missed: int,
    stage_budget: float,
) -> None:
    """Refuse a job class whose lease cannot survive its own heartbeat schedule."""
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


def backoff_delay(attempt: int, base: float, cap: float, rand: float) -> int:
    """Full-jitter exponential backoff in whole seconds; ``rand`` in [0, 1) from the caller."""
    # Cap the exponent first: a huge attempt count must not overflow a float.
    ceiling = min(cap, base * (2.0 ** min(max(0, attempt - 1), 62)), SQS_MAX_VISIBILITY)
    return max(0, int(ceiling * rand))  # floor: never above the cap


class LeaseStatus(StrEnum):
    OK = "ok"
    UNKNOWN = "unknown"  # last heartbeat round could not confirm ownership
    LOST = "lost"  # token moved on, job left running, or SQS says the lease is gone
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # conservative deadline passed; the worker let the message go
    DONE = "done"  # handler returned; nothing more to extend


OPEN = frozenset({LeaseStatus.OK, LeaseStatus.UNKNOWN})
"""Statuses of an attempt the heartbeat may still extend."""


@dataclass
class LocalLease:
    """One held job's lease as its worker sees it (mutable; owned by the worker shell).

    ``deadline`` is counted from *before* the request that granted it was sent.
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
    tool_timeout: float
    progress_timeout: float | None = None
    last_progress: float = 0.0
    next_beat: float = 0.0
    status: LeaseStatus = LeaseStatus.OK
    reason: str = ""
    last_confirmed: float = 0.0
    advised_at: float = 0.0

    @property
    def conservative_deadline(self) -> float:
        """Past this point no irreversible step may start, and the heartbeat stops."""
        return self.deadline - self.jitter_seconds

    def check(self, now: float) -> None:
        """Raise unless a new irreversible step may start now."""
        if self.status is LeaseStatus.CANCELLED:
            raise JobCancelled(f"job {self.job_id} was cancelled: {self.reason}")
        if self.status is LeaseStatus.LOST:
            raise LeaseLost(f"job {self.job_id} token {self.token}: lease lost ({self.reason})")
        if self.status in (LeaseStatus.EXPIRED, LeaseStatus.DONE):
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


class Drop(StrEnum):
    """Why the watchdog stops extending a job."""

    RESERVE_SPENT = "lease_reserve_spent"
    TOOL_TIMEOUT = "tool_timeout"
    NO_PROGRESS = "no_progress"
    STAGE_BUDGET = "stage_budget_exceeded"


@dataclass(frozen=True)
class BeatPlan:
    extend: tuple[LocalLease, ...]
    drop: tuple[tuple[LocalLease, Drop], ...]
    advise: frozenset[str] = frozenset()


def plan_heartbeat(leases: Iterable[LocalLease], now: float) -> BeatPlan:
    """Pick the jobs due for extension now, and those the watchdog must let go.

    A finished, lost or cancelled job is never extended; one whose handler overran
    its tool timeout, stopped making progress, or whose next extension would cross
    the stage budget is dropped, never silently extended.
    """
    extend: list[LocalLease] = []
    drop: list[tuple[LocalLease, Drop]] = []
    for lease in leases:
        if lease.status not in OPEN:
            continue
        if now >= lease.conservative_deadline:
            drop.append((lease, Drop.RESERVE_SPENT))
        elif now - lease.started_at > lease.tool_timeout:
            drop.append((lease, Drop.TOOL_TIMEOUT))
        elif (
            lease.progress_timeout is not None
            and now - lease.last_progress > lease.progress_timeout
        ):
            drop.append((lease, Drop.NO_PROGRESS))
        elif now + lease.lease_seconds > lease.stage_deadline:
            drop.append((lease, Drop.STAGE_BUDGET))
        elif now >= lease.next_beat:
            extend.append(lease)
    # The advisory deadline in the record is for people; refresh it about twice a
    # lease, not every beat, to keep the call count near the protocol's floor.
    advise = frozenset(
        lease.job_id for lease in extend if now - lease.advised_at >= lease.lease_seconds / 2
    )
    return BeatPlan(tuple(extend), tuple(drop), advise)
