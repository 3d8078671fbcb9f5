"""Cancelling a job: the cancel marker on its record and the per-job cancel flow."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .._errors import (
    JobNotFound,
)
from .calls import Err, ErrorKind, Flow, call, emit
from .messages import fail_call
from .records import (
    JobRequests,
    JobView,
)


def cancel_flow(req: JobRequests, *, job_id: str, reason: str, wall_now: float) -> Flow[JobView]:
    """End a job ``failed`` (cancelled) and move its token on, fencing out its owner."""
    view, _ = yield from cancel_one(req, job_id=job_id, reason=reason, wall_now=wall_now)
    return view


def cancel_one(
    req: JobRequests, *, job_id: str, reason: str, wall_now: float
) -> Flow[tuple[JobView, bool]]:
    """:func:`cancel_flow`, also saying whether this call ended the job (False: it
    was already terminal, and the view is what it found)."""
    out = yield from call(req.cancel(job_id, reason, wall_now))
    if isinstance(out, Err):
        if out.kind is ErrorKind.CONDITION_FAILED:
            if out.item is None:
                raise JobNotFound(f"no job {job_id!r}")
            current = req.parse(out.item)
            yield from emit("job_cancel_noop", job_id=job_id, state=current.state.value)
            return current, False
        raise fail_call(f"cancel {job_id}", out)
    view = req.parse(out.response.get("Attributes", {}))
    yield from emit("job_cancelled", job_id=job_id, token=view.token, reason=reason)
    return view, True


class CancelVerdict(StrEnum):
    """What a cancel did (``sqs-lease jobs cancel --json`` prints the value)."""

    CANCELLED = "cancelled"  # this call ended the job
    ALREADY_FINAL = "already_final"  # it had ended before: nothing changed


@dataclass(frozen=True)
class Cancelled:
    """What a cancel did: ``cancelled`` (this call ended the job), or
    ``already_final`` (it had ended before: nothing changed). ``job`` is the record
    after the call."""

    job: JobView
    verdict: CancelVerdict


def cancel_job_flow(
    req: JobRequests, *, job_id: str, reason: str, wall_now: float
) -> Flow[Cancelled]:
    """:func:`cancel_flow` with a typed verdict (what ``sqs-lease jobs cancel`` says)."""
    view, ended = yield from cancel_one(req, job_id=job_id, reason=reason, wall_now=wall_now)
    return Cancelled(view, CancelVerdict.CANCELLED if ended else CancelVerdict.ALREADY_FINAL)
