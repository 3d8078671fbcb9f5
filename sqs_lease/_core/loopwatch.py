"""The async worker's watch on its event loop: when a job's step held the loop too
long, and what is journaled about it (``loop_blocked``, ``loop_unblocked``).

The shell times each step of a job's task on the loop with its lease clock and
passes its readings here; a watch thread looks at the running step while the loop is
held (the loop cannot say it is held), and the step's end (or a check within it)
judges the stall (``LeaseBook.loop_stalled``, :func:`~sqs_lease._core.timing.judge_stall`).
This module decides when a step is judged, when ``loop_blocked`` is told (once a
step, by whichever of the two sees it first) and what both events say; it reads no
clock and holds no lock (the shell guards a step shared with its watch thread).
"""

from __future__ import annotations

from dataclasses import dataclass

from .calls import Emit
from .timing import Stall

WATCH_PERIOD_FLOOR = 0.05
"""The watch thread looks at the running step at least this far apart (seconds)."""


def watch_period(tolerated: float) -> float:
    """How often the watch thread looks at the running step: twice per tolerated lag,
    so a stall is told at most half a tolerated lag after it passed it."""
    return max(WATCH_PERIOD_FLOOR, tolerated / 2)


def loop_blocked_event(
    job_id: str | None, token: int | None, blocked_for: float, tolerated: float, held: int
) -> Emit:
    """``loop_blocked``: job ``job_id``'s step (``token``: its lease's) has held the loop
    ``blocked_for`` seconds, past the ``tolerated`` lag, with ``held`` leases open."""
    return Emit(
        "loop_blocked",
        {
            "job_id": job_id,
            "token": token,
            "blocked_for": round(blocked_for, 3),
            "tolerated": tolerated,
            "held": held,
        },
    )


@dataclass
class LoopStep:
    """One step of a job's task on the event loop (``job_id`` None: no job's), begun at
    ``began`` on the lease clock, judged against the ``tolerated`` lag."""

    job_id: str | None
    began: float
    tolerated: float
    reported: bool = False  # loop_blocked told (by the watch, or at the judgement)
    judged: bool = False  # the stall judged (at the step's end, or a check within it)

    def overran(self, now: float) -> bool:
        """Whether the step, at ``now``, must be judged: it held the loop past the
        tolerated lag and was not judged yet. True once: it is then judged."""
        if self.judged or now - self.began <= self.tolerated:
            return False
        self.judged = True
        return True

    def watched(self, now: float) -> float | None:
        """The watch thread's look at the step still running at ``now``: how long it
        has held the loop, the first time that is past the tolerated lag (to tell in
        ``loop_blocked`` now: the loop cannot), else None."""
        held_for = now - self.began
        if held_for <= self.tolerated or self.reported:
            return None
        self.reported = True
        return held_for

    def unblocked(self, stall: Stall, held: int) -> list[Emit]:
        """The events of the step's stall once judged (``stall``, the book's verdict;
        ``held`` leases open): ``loop_blocked`` when the watch did not see it while it
        lasted (too short for its period), then ``loop_unblocked`` with the verdict.
        None for a stall within the tolerated lag."""
        if stall.event is None:
            return []
        told: list[Emit] = []
        if not self.reported:
            self.reported = True
            told.append(
                loop_blocked_event(
                    self.job_id, stall.token, stall.blocked_for, self.tolerated, held
                )
            )
        told.append(Emit("loop_unblocked", stall.event))
        return told


__all__ = [
    "WATCH_PERIOD_FLOOR",
    "LoopStep",
    "loop_blocked_event",
    "watch_period",
]
