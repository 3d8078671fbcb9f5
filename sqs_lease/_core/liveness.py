"""A worker's liveness record: one write per heartbeat round, for people and metrics.

What people want to see of a running job (how much lease is left, how long ago
its worker beat) need not cost a write per job: after each heartbeat round the
worker writes one item (per :data:`LIVENESS_PART` jobs) naming itself, the
round's wall time and length, and every job it holds with its token and lease
deadline (wall clock). ``jobs show`` reads it by the job record's owner.

No condition and no fence reads it. One decision does: a claim that finds a job
running under another worker reads the owner's record twice, two heartbeat
intervals apart, and leaves the job to it when ``beats`` (the count of its writes)
moved and the job is still listed (``_core/duplicates.py``). A failed write is
journaled (``liveness_failed``); the worst it causes is a take-over of a live
owner, as every take-over was before that rule. The item lives in the
job table under a key no job uses (``worker#<id>``, then ``worker#<id>#<n>``
for further parts), carries no ``state`` (so no job index holds it) and a
``gc_expires_at`` (the tables' garbage-collection TTL attribute,
``deploy.GC_TTL_ATTRIBUTE``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .inputs import loads as _loads

LIVENESS_PREFIX = "worker#"
"""Key prefix of liveness items in the job table (job ids must not start with it)."""

LIVENESS_PART = 500
"""Jobs per liveness item: about 60 bytes each, so a part stays near 30 KB, far under
DynamoDB's 400 KB item limit (and a write costs about 30 WCU, not 400)."""

LIVENESS_KEEP_SECONDS = 86_400.0
"""How long after its round a liveness item may be removed by TTL (``gc_expires_at``)."""


@dataclass(frozen=True)
class HeldJob:
    """One job a worker holds, as its liveness record tells it."""

    job_id: str
    token: int
    lease_deadline: float  # wall-clock seconds


@dataclass(frozen=True)
class Liveness:
    """One part of a worker's liveness record."""

    worker_id: str
    beat_at: float  # wall-clock time of the round
    round_seconds: float  # how long the round took (the worker's own lateness shows here)
    part: int
    parts: int
    held: tuple[HeldJob, ...]
    # The writer's count of its liveness writes (1, 2, ...): a claimer that reads it
    # twice, a window apart on its own clock, sees the owner's heartbeat land
    # without comparing two machines' clocks (``_core/duplicates.py``).
    beats: int = 0

    def find(self, job_id: str) -> HeldJob | None:
        """The job's entry in this part (None: not in it)."""
        return next((h for h in self.held if h.job_id == job_id), None)


def liveness_key(worker_id: str, part: int = 0) -> str:
    """The job-table key of part ``part`` of a worker's liveness record."""
    base = f"{LIVENESS_PREFIX}{worker_id}"
    return base if part == 0 else f"{base}#{part}"


def liveness_parts(
    worker_id: str,
    beat_at: float,
    round_seconds: float,
    held: Sequence[HeldJob],
    beats: int = 0,
) -> list[Liveness]:
    """Split what a worker holds into the parts written this round (one at least, so
    a worker that holds nothing says so)."""
    chunks = [held[i : i + LIVENESS_PART] for i in range(0, len(held), LIVENESS_PART)] or [[]]
    return [
        Liveness(worker_id, beat_at, round_seconds, n, len(chunks), tuple(chunk), beats)
        for n, chunk in enumerate(chunks)
    ]


def held_json(held: Sequence[HeldJob]) -> str:
    """The compact form stored in the item: ``[[job_id, token, deadline], ...]``."""
    rows = [[h.job_id, h.token, round(h.lease_deadline, 3)] for h in held]
    return json.dumps(rows, separators=(",", ":"))


def liveness_of(item: Mapping[str, Any]) -> Liveness | None:
    """Read a stored liveness item (None: not one, or not readable by this version)."""

    def s(name: str) -> str | None:
        v = item.get(name)
        return v.get("S") if isinstance(v, Mapping) else None

    def n(name: str) -> float | None:
        v = item.get(name)
        raw = v.get("N") if isinstance(v, Mapping) else None
        try:
            value = float(raw) if raw is not None else None
        except (ValueError, TypeError):
            return None
        return value if value is None or math.isfinite(value) else None

    worker, beat_at, text = s("owner"), n("beat_at"), s("held")
    if s("kind") != "liveness" or worker is None or beat_at is None or text is None:
        return None
    try:
        rows = _loads(text)
        held = tuple(HeldJob(str(r[0]), int(r[1]), float(r[2])) for r in rows)
    except (ValueError, TypeError, IndexError, KeyError, OverflowError):
        return None
    return Liveness(
        worker,
        beat_at,
        n("round_seconds") or 0.0,
        int(n("part") or 0),
        int(n("parts") or 1),
        held,
        int(n("beats") or 0),
    )


__all__ = [
    "LIVENESS_KEEP_SECONDS",
    "LIVENESS_PART",
    "LIVENESS_PREFIX",
    "HeldJob",
    "Liveness",
    "held_json",
    "liveness_key",
    "liveness_of",
    "liveness_parts",
]
