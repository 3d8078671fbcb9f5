"""A delivery of a job that runs under a live owner defers; a dead owner's is taken over.

SQS delivers at least once: a copy of a message (or the same message in two
concurrent Lambda invocations) can reach a second worker while the first runs the
job and its heartbeat lands. Taking it over is safe (the token fences the owner
out) but throws the owner's work away. So a claim only takes a ``queued`` record;
one that finds the record ``running`` under another token (:func:`claiming.claim_flow`
answers ``running``) asks whether that owner still beats:

- the owner is this worker: its own book knows (:meth:`LeaseBook.owns`): an
  attempt of it holds the job open, or claimed it and holds it not yet, or has a
  claim of it under way (from the claim's write to its hold the attempt runs,
  validating and taking its slots, with no lease in the book);
- another worker: its liveness record (``_core/liveness.py``, one write per round)
  is read twice, a window of :func:`owner_window` apart on the claimer's own lease
  clock. The owner is alive when the second read lists the job at the record's
  token (it lists claims not yet held too) and the record's write counter
  (``beats``) moved between the reads. Only
  the owner's own counter is compared with itself: no two machines' clocks meet.

Alive: the delivery is left unclaimed (``claim_deferred``, reason ``owner_alive``)
with a visibility of :func:`duplicate_defer`; it is never deleted (when the owner
ends, the copy comes back, meets the ended record and is deleted then; when the
owner dies, whichever copy comes back next is taken over). Not alive: the claim is
made again, conditioned on the token seen (``take_from``), so it takes over only
the owner it judged dead; a newer claim meanwhile is a live owner too.

A death is taken over within ``L + 2H`` of the owner's last beat: its message
comes back at most ``L`` after it, and the window is ``2H`` (a live owner writes
its liveness record at every round, one per ``H``; the window leaves a whole round
of lateness). A liveness record that cannot be read proves nothing: the claim
takes over, as before this rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .calls import Err, Flow, Sleep, call
from .liveness import Liveness, liveness_key, liveness_of
from .records import JobRequests

DUPLICATE_DEFER_CAP = 1800
"""The longest visibility (seconds) a deferred delivery is given, unless the class's
lease is longer: its receives stay few over a long job (see :func:`duplicate_defer`)."""

LIVENESS_PARTS_READ = 20
"""Parts of an owner's liveness record read at most (500 jobs each)."""


@dataclass(frozen=True)
class OwnerSeen:
    """One read of an owner's liveness record, as the duplicate rule needs it."""

    beats: int | None  # the record's write counter (None: no readable record)
    holds: bool  # it lists the job at the record's token


def owner_window(heartbeat_seconds: float) -> float:
    """Seconds between the two reads of an owner's liveness record: a live owner
    writes one per round, a round per ``H``; two ``H`` leave it a late round."""
    return 2.0 * heartbeat_seconds


def owner_alive(first: OwnerSeen, second: OwnerSeen) -> bool:
    """The owner beat between the two reads, and still holds the job at its token."""
    return second.beats is not None and second.holds and second.beats != first.beats


def duplicate_defer(lease_seconds: int, receive_count: int) -> int:
    """Visibility for a delivery left to a live owner.

    At least the class's lease ``L`` (the owner's lease would have lapsed by then,
    were it to die now), doubling with the message's receives after the second (a
    live owner's job does not walk into the DLQ: SQS counts every receive toward
    ``maxReceiveCount``), at most :data:`DUPLICATE_DEFER_CAP` or ``L``. With L = 60 s,
    the first hour of the owner's work costs the copy 6 receives (60, 120, 240, 480,
    960, 1800 s), and 2 an hour after that: a stage of 11.75 hours (the longest a
    class may have) about 28, under the redrive's 50 even with L = 30 s (29).
    """
    cap = max(lease_seconds, DUPLICATE_DEFER_CAP)
    doublings = min(max(0, receive_count - 2), 20)
    return max(1, min(cap, lease_seconds << doublings))


def seen(parts: list[Liveness], job_id: str, token: int) -> OwnerSeen:
    """What the parts read say (no part: no record)."""
    if not parts:
        return OwnerSeen(None, False)
    holds = any((h := p.find(job_id)) is not None and h.token == token for p in parts)
    return OwnerSeen(parts[0].beats, holds)


def _read_part(req: JobRequests, owner: str, part: int) -> Flow[Liveness | None]:
    out = yield from call(req.get(liveness_key(owner, part)))
    if isinstance(out, Err):
        return None
    item: Mapping[str, Any] = out.response.get("Item") or {}
    live = liveness_of(item)
    return live if live is not None and live.worker_id == owner else None


def read_owner_flow(req: JobRequests, owner: str, job_id: str, token: int) -> Flow[OwnerSeen]:
    """Read the owner's liveness record (consistent), its further parts only while
    the job is not found in those read."""
    first = yield from _read_part(req, owner, 0)
    if first is None:
        return OwnerSeen(None, False)
    parts = [first]
    for n in range(1, min(first.parts, LIVENESS_PARTS_READ)):
        if first.find(job_id) is not None:
            break
        more = yield from _read_part(req, owner, n)
        if more is None or more.beats != first.beats:
            break  # another round's part: it says nothing of this read
        parts.append(more)
        if more.find(job_id) is not None:
            break
    return seen(parts, job_id, token)


def owner_alive_flow(
    req: JobRequests, *, owner: str, job_id: str, token: int, window: float
) -> Flow[bool]:
    """Read, wait ``window`` on this worker's own clock, read again: did the owner beat?"""
    first = yield from read_owner_flow(req, owner, job_id, token)
    yield Sleep(window)
    second = yield from read_owner_flow(req, owner, job_id, token)
    return owner_alive(first, second)


__all__ = [
    "DUPLICATE_DEFER_CAP",
    "LIVENESS_PARTS_READ",
    "OwnerSeen",
    "duplicate_defer",
    "owner_alive",
    "owner_alive_flow",
    "owner_window",
    "read_owner_flow",
    "seen",
]
