"""Groups (agent sessions): cancelling every job of one, found by its index.

A producer puts a job in a group when it submits it (never a payload: the
producer's own argument). The group's marker record counts its jobs, written in
the same transaction as each job record and conditioned on the group not being
cancelled (``submit_flow``). A cancel therefore goes in this order:

1. mark the group cancelled: from then on every submit to it is refused, and
   the marker says how many job records the group holds (``jobs``);
2. read the group's jobs from the ``group`` index and cancel each one not yet
   terminal (the per-job cancel moves its token on, so its owner's next
   heartbeat sees ``cancelled`` and stops);
3. the index is eventually consistent: until it has shown as many jobs as the
   marker counts, read it again after a pause (bounded); what it never showed is
   reported as ``missing`` (run the cancel again: it is idempotent).

A submit racing the cancel is ordered by DynamoDB on the marker: it commits
before step 1 (then it is counted, and step 3 waits until the index shows it) or
it is refused with :class:`~sqs_lease.GroupCancelled`. It never runs unnoticed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .calls import Err, Flow, Sleep, call, emit
from .cancelling import cancel_one
from .messages import fail_call
from .records import (
    CANCELLED_CODE,
    GroupRequests,
    GroupView,
    JobRequests,
    JobView,
    is_cancelled,
)

GROUP_ROUNDS = 10
"""How many times a group cancel reads the index while it shows fewer jobs than counted."""

GROUP_PAUSE = 1.0
"""Seconds between those reads (a GSI usually catches up within a second)."""


@dataclass(frozen=True)
class GroupReport:
    """What a group cancel did.

    ``jobs``: job records the group's marker counts; ``cancelled``: the jobs this
    cancel ended; ``finished``: the jobs already terminal, with how they ended
    (``succeeded``, ``failed`` or ``cancelled`` by an earlier cancel);
    ``missing``: counted jobs the index did not show within the rounds (cancel
    again to reach them). ``reason``/``cancelled_at``: the group's first cancel.
    """

    group: str
    reason: str
    cancelled_at: float | None
    jobs: int
    cancelled: tuple[str, ...]
    finished: tuple[tuple[str, str], ...]
    missing: int

    @property
    def complete(self) -> bool:
        """Every job the group counts was seen and is now terminal."""
        return self.missing == 0


def _ended_as(view: JobView) -> str:
    return CANCELLED_CODE if is_cancelled(view) else view.state.value


def job_reason(group: str, reason: str) -> str:
    """The reason a job of a cancelled group is ended with."""
    return f"group {group}: {reason}"


def cancelled_group_flow(groups: GroupRequests | None, job: JobView) -> Flow[GroupView | None]:
    """The cancelled group (agent session) ``job`` belongs to; None: it has no group, or
    its group is not cancelled.

    The rule for every operator command that would run a job again (``jobs retry``):
    a cancelled session's work stays cancelled, whether the cancel ended the job or
    found it already failed. The group's marker decides (read strongly consistent:
    a cancel that returned is seen), never the job's own record, which a cancel that
    found it terminal does not touch.
    """
    if job.group is None:
        return None
    if groups is None:
        raise ValueError(f"job {job.job_id!r} is in group {job.group!r}: pass its GroupRequests")
    got = yield from call(groups.get(job.group))
    if isinstance(got, Err):
        raise fail_call(f"read group {job.group!r} of job {job.job_id!r}", got)
    item = got.response.get("Item")
    marker = groups.parse(item) if item else None
    return marker if marker is not None and marker.cancelled_at is not None else None


def cancel_group_flow(
    req: JobRequests,
    groups: GroupRequests,
    *,
    group: str,
    reason: str,
    wall_now: float,
    rounds: int = GROUP_ROUNDS,
    pause: float = GROUP_PAUSE,
) -> Flow[GroupReport]:
    """Cancel the group, then every job of it not yet terminal (see the module)."""
    marked = yield from call(groups.cancel(group, reason, wall_now))
    if isinstance(marked, Err):
        raise fail_call(f"cancel group {group}", marked)
    marker = groups.parse(marked.response.get("Attributes", {}))
    why = marker.reason or reason
    seen: set[str] = set()
    cancelled: list[str] = []
    finished: list[tuple[str, str]] = []
    for round_no in range(max(1, rounds)):
        start: Mapping[str, Any] | None = None
        while True:
            page = yield from call(req.group_query(group, start))
            if isinstance(page, Err):
                raise fail_call(f"cancel group {group}: read its jobs", page)
            for item in page.response.get("Items", []):
                view = req.parse(item)
                if view.job_id in seen:
                    continue
                seen.add(view.job_id)
                if view.state.terminal:
                    finished.append((view.job_id, _ended_as(view)))
                    continue
                now, ended = yield from cancel_one(
                    req, job_id=view.job_id, reason=job_reason(group, why), wall_now=wall_now
                )
                if ended:
                    cancelled.append(view.job_id)
                else:
                    finished.append((view.job_id, _ended_as(now)))
            start = page.response.get("LastEvaluatedKey")
            if not start:
                break
        if len(seen) >= marker.jobs:
            break
        if round_no + 1 < rounds:
            yield Sleep(pause)
    missing = max(0, marker.jobs - len(seen))
    yield from emit(
        "group_cancelled",
        group=group,
        reason=why,
        jobs=marker.jobs,
        cancelled=len(cancelled),
        finished=len(finished),
        missing=missing,
    )
    return GroupReport(
        group, why, marker.cancelled_at, marker.jobs, tuple(cancelled), tuple(finished), missing
    )
