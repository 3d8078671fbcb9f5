"""Simulated fenced receivers (the targets of side effects) and the ledger of applied effects.

A target keeps, per fence scope (the calling job's id: tokens are ordered per
job, so marks of different jobs are never compared), the highest token it saw
(lower is refused with 412, equal or higher accepted and raises the mark
whatever the answer: an effect, a replay or a 422) and, when it is *keyed*,
per idempotency key the stored response (a repeated key is replayed, not
applied again). An *unkeyed* target has only the token fence. Each job picks
one kind. The resource an effect touches is recorded but orders nothing.

Every effect a target *applies* is written to the ledger: intent key, resource,
scope, token, virtual time, target and worker; the invariant checker reads it
(I1, I2, I6). Every request the fence admits is told to ``admitted`` listeners, so
the checker knows the highest token each scope has shown (I1).

The reconciliation check knows the truth, as a good target-side lookup would:
applied (with its external id) or not. Two details keep a "not applied" answer
true for the future, not only for the instant of the check:

- the check is *fenced*: it carries the checker's scope and token and raises
  the scope's mark to it, so a request from an older owner (paused between its
  fenced start and its send) can no longer land afterwards;
- on an unkeyed target, a request with that key still in the network at the
  checker's token or above makes the truth undecided: the answer is CANNOT_TELL.

With probability ``cannot_tell`` (seeded) the check answers CANNOT_TELL anyway.
The ``naive`` check mode (used by the ``naive_check`` environment variant) drops
both details and answers from what has applied at that instant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..._core.intents import CheckAnswer, Verdict
from .chaos import Chaos


@dataclass(frozen=True)
class Applied:
    seq: int
    key: str
    resource: str
    scope: str
    token: int
    time: float
    target: str
    worker: str
    external_id: str


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]
    replayed: bool = False
    external_id: str | None = None


@dataclass
class SimTarget:
    name: str
    keyed: bool
    fences: dict[str, int] = field(default_factory=dict)  # scope -> mark
    stored: dict[str, tuple[str, Reply]] = field(default_factory=dict)
    applied: dict[str, Applied] = field(default_factory=dict)
    pending: dict[str, list[int]] = field(default_factory=dict)
    stored_at: dict[str, float] = field(default_factory=dict)  # key -> when it was stored


@dataclass
class TargetFaults:
    error_before: float = 0.0  # 503, nothing applied
    error_after: float = 0.0  # 500 after applying
    throttle: float = 0.0  # 429, nothing applied
    cannot_tell: float = 0.0  # the check cannot tell


class Receivers:
    default_check_mode = "fenced"  # "fenced" | "naive" (the naive_check variant)

    def __init__(self, chaos: Chaos, faults: TargetFaults | None = None) -> None:
        self.chaos = chaos
        self.faults = faults or TargetFaults()
        self.targets: dict[str, SimTarget] = {}
        self.ledger: list[Applied] = []
        self.check_mode = self.default_check_mode
        self.listeners: list[Any] = []  # callables (Applied) -> None
        self.admitted: list[Any] = []  # callables (target, scope, token) -> None
        self.rejected = 0
        self.replayed = 0
        # issue 26 (clocks): the targets keep intents' keys this long, then forget them
        # (None: for good); the check, a lookup by key, forgets them too. The retention
        # is drawn to a run's scale (minutes) to exercise the intent flow's rule; a
        # handler's own fenced calls (plain_calls, ``plain:`` keys) rely on the target
        # alone, whose real retention (a day) outlives their repeats: kept for good.
        self.retention: float | None = None

    def add(self, name: str, keyed: bool) -> SimTarget:
        t = SimTarget(name, keyed)
        self.targets[name] = t
        return t

    # ------------------------------------------------------------------ network bookkeeping

    def sent(self, target: str, key: str, token: int) -> None:
        self.targets[target].pending.setdefault(key, []).append(token)

    def arrived(self, target: str, key: str, token: int) -> None:
        pend = self.targets[target].pending.get(key, [])
        if token in pend:
            pend.remove(token)

    # ------------------------------------------------------------------ the effect

    def apply(
        self,
        target: str,
        *,
        key: str,
        resource: str,
        scope: str,
        token: int,
        payload_hash: str,
        worker: str,
        now: float,
    ) -> Reply:
        t = self.targets[target]
        self.arrived(target, key, token)
        if self.chaos.roll("target_throttle", self.faults.throttle):
            return Reply(429, {"error": "too_many_requests"})
        if self.chaos.roll("target_error_before", self.faults.error_before):
            return Reply(503, {"error": "unavailable"})
        if not self._fence(t, scope, token):
            self.rejected += 1
            return Reply(412, {"error": "stale_token", "highest": t.fences[scope]})
        self._passed(t, scope, token)
        if t.keyed and key in t.stored and self._forgot(key, t.stored_at.get(key, now), now):
            del t.stored[key]
            self.chaos.count("key_forgotten")
        if t.keyed and key in t.stored:
            stored_hash, reply = t.stored[key]
            if stored_hash != payload_hash:
                return Reply(422, {"error": "payload_mismatch"})
            self.replayed += 1
            return Reply(reply.status, reply.body, True, reply.external_id)
        entry = Applied(
            seq=len(self.ledger) + 1,
            key=key,
            resource=resource,
            scope=scope,
            token=token,
            time=now,
            target=target,
            worker=worker,
            external_id=f"{target}-x{len(self.ledger) + 1}",
        )
        self.ledger.append(entry)
        t.applied.setdefault(key, entry)
        reply = Reply(
            200,
            {"id": entry.external_id, "resource": resource, "token": token},
            False,
            entry.external_id,
        )
        if t.keyed:
            t.stored[key] = (payload_hash, reply)
            t.stored_at[key] = now
        for listener in self.listeners:
            listener(entry)
        if self.chaos.roll("target_error_after", self.faults.error_after):
            return Reply(500, {"error": "internal"})
        return reply

    def _fence(self, t: SimTarget, scope: str, token: int) -> bool:
        """Admit ``token`` for ``scope`` (raising its mark) unless it is lower than the mark."""
        mark = t.fences.get(scope, 0)
        if token < mark:
            return False
        t.fences[scope] = token
        return True

    def _forgot(self, key: str, since: float, now: float) -> bool:
        """Whether ``key`` stored at ``since`` is forgotten at ``now`` (issue 26, clocks)."""
        if self.retention is None or key.startswith("plain:"):
            return False
        return now - since > self.retention

    def _passed(self, t: SimTarget, scope: str, token: int) -> None:
        # Told apart from _fence so the checker learns what passed even if the mark
        # keeping were broken: it keeps its own high-water marks from these.
        for listener in self.admitted:
            listener(t.name, scope, token)

    # ------------------------------------------------------------------ the check

    def check(self, target: str, *, key: str, resource: str, scope: str, token: int) -> CheckAnswer:
        t = self.targets[target]
        done = t.applied.get(key)
        if done is not None and self._forgot(key, done.time, self.chaos.now):
            done = None  # the lookup by key forgot it with the key
        if self.check_mode == "fenced" and self._fence(t, scope, token):
            self._passed(t, scope, token)
        if self.chaos.roll("check_cannot_tell", self.faults.cannot_tell):
            return CheckAnswer(Verdict.CANNOT_TELL, detail="the target cannot tell (seeded)")
        if done is not None:
            return CheckAnswer(
                Verdict.CONFIRMED,
                external_id=done.external_id,
                response={"id": done.external_id, "resource": done.resource, "token": done.token},
                detail="applied",
            )
        if (
            self.check_mode == "fenced"
            and not t.keyed
            and any(p >= token for p in t.pending.get(key, []))
        ):
            return CheckAnswer(Verdict.CANNOT_TELL, detail="a request with this key is in flight")
        return CheckAnswer(Verdict.NOT_APPLIED, detail="no effect under this key")
