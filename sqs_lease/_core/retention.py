"""Key retention: may a repeat of an effect's key go ahead, still protected by a
target that keeps idempotency keys for a while? The one rule
(:func:`repeat_unprotected`, for the effect flow and the operator's ``intents
retry``), the first start's stamp (its wall time and whose clock read it), and one
worker process's own first starts, timed on its lease clock (:class:`OwnStarts`).
"""

from __future__ import annotations

from collections import OrderedDict
from enum import StrEnum


class Unprotected(StrEnum):
    """Why a repeat with the same key is not protected by the target."""

    NO_KEYS = "no_keys"  # the target keeps no idempotency keys
    EXPIRED = "expired"  # the first attempt is older than the target keeps keys
    # The first start was timed by another machine's (or process's) wall clock: its age
    # cannot be known without comparing two clocks, so the repeat is not proven safe.
    OTHER_CLOCK = "other_clock"


def first_start_stamp(wall_now: float, worker_id: str) -> str:
    """The intent's ``first_start``: the first start's wall time and whose clock read it."""
    return f"{wall_now!r}|{worker_id}"


def first_started_by(stamp: str | None, first_started_at: float | None) -> str | None:
    """Whose clock stamped ``first_started_at``, from the ``first_start`` written in the
    same write (None: unknown, or the two were not written together: an older record)."""
    if not stamp or first_started_at is None or "|" not in stamp:
        return None
    at, _, worker = stamp.partition("|")
    try:
        same = float(at) == first_started_at
    except ValueError:
        return None
    return worker if same and worker else None


def repeat_unprotected(
    retention: float | None,
    first_started: float | None,
    now: float,
    *,
    own_age: float | None = None,
) -> Unprotected | None:
    """Key retention, the one rule (the effect flow and the operator's ``intents
    retry``): whether a repeat of a key is still protected by a target that keeps
    keys for ``retention`` seconds (None: not at all). None: protected.

    ``own_age``: the key's age read on one clock, the lease clock (monotonic) of the
    worker process that made the first start, from a reading before that start to
    now. Only that proves a repeat safe. Wall times prove nothing: ``first_started``
    (stamped by the starter's wall clock) against ``now`` (the reader's) compares two
    machines' clocks, or one machine's wall clock across a step or a drift (NTP): a
    lagging reading would call a key the target already forgot protected and repeat
    the effect. Without ``own_age`` the walls only word a refusal (:attr:`EXPIRED`
    when they say the window has passed); otherwise the rule decides conservatively
    (:attr:`Unprotected.OTHER_CLOCK`: the effect flow parks the job as ambiguous; the
    operator's ``--retry`` is the operator's word that they checked the target)."""
    if retention is None:
        return Unprotected.NO_KEYS
    if own_age is not None:
        return Unprotected.EXPIRED if own_age > retention else None
    if first_started is not None and now > first_started + retention:
        return Unprotected.EXPIRED
    return Unprotected.OTHER_CLOCK


OWN_STARTS_KEPT = 10_000
"""First starts one worker process remembers (the oldest forgotten first): forgetting
one only makes a later repeat of its key park instead of going ahead."""


class OwnStarts:
    """One worker process's first starts of intents: key -> (the wall time the start
    wrote as ``first_started_at``, the lease clock read before it).

    Lives as long as the process, never stored: a restarted process (same worker id,
    a new lease clock) remembers nothing, and its repeats park. The wall time only
    tells that the stored first start is the one remembered (one write, exact)."""

    def __init__(self, kept: int = OWN_STARTS_KEPT) -> None:
        # OrderedDict: set and popitem are each one step under the GIL, so threads
        # sharing one process's memory need no lock.
        self._starts: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._kept = kept

    def remember(self, key: str, wall: float, mono: float) -> None:
        self._starts[key] = (wall, mono)
        for _ in range(len(self._starts) - self._kept):
            try:
                self._starts.popitem(last=False)
            except KeyError:
                return

    def mono_of(self, key: str, first_started: float | None) -> float | None:
        """The lease-clock reading before this process's first start of ``key``, if
        the stored first start (``first_started``) is the one it made."""
        known = self._starts.get(key)
        if known is None or first_started is None or known[0] != first_started:
            return None
        return known[1]
