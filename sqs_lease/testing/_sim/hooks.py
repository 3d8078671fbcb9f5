"""What the world tells the checker as the run goes: the writes, the effects, the
redrives, and the workers' journal events some invariants read."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..._core.lease import LeaseStatus
from .resources import JOBS

if TYPE_CHECKING:
    from .sqs import Message
    from .world import World


class Hooks:
    """The world's listeners: the simulated services and the checker call them."""

    def __init__(self, world: World) -> None:
        self.world = world
        # I20: (worker, job, token) of attempts a refusal proved superseded
        self.refused_attempts: set[tuple[str, str, Any]] = set()

    def journal(self) -> dict[str, Callable[[str, Any], None]]:
        """The hooks on a worker's journal events, by event name."""
        return {
            "intent_confirmed": self.effect_reported,
            "intent_replayed": self.effect_reported,
            "job_abandoned": self.attempt_abandoned,
            "ownership_unknown": self.ownership_unknown,
            "tool_request_failed": self.refused,
            "intent_start_refused": self.refused,
        }

    def on_write(
        self,
        table: str,
        key: Any,
        old: Mapping[str, Any] | None,
        new: Mapping[str, Any] | None,
        origin: Any,
    ) -> None:
        if table == JOBS and self.world.clocks.outside(new, old):
            return  # dead_entries: an older version's record, not a job of the run
        self.world.checker.now = self.world.now
        self.world.checker.item_written(table, old, new, origin)
        if table == JOBS and self.world.fifo is not None:
            self.world.fifo.job_written(old, new, origin)
        if table == JOBS and new is not None:
            self.world.clocks.charged(old, new, origin)  # backlog: I25
        if table == JOBS and "operator_races" in self.world.plan.wide.features:
            self.world.runbook.job_written(old, new)
        if table == JOBS and self.world.lambda_run is not None:
            self.world.lambda_run.job_written(old, new)  # lambda: jobs retry racing the run

    def on_effect(self, entry: Any) -> None:
        self.world.checker.now = self.world.now
        self.world.checker.effect_applied(entry)

    def on_redrive(self, m: Message) -> None:
        self.world.record("sqs", "redrive_to_dlq", {"message": m.message_id, "body": m.body})
        if self.world.planned is not None:  # plans: P4, no waiter for a slot is dead-lettered
            self.world.planned.redriven(m)

    def live_owner(self, worker: str, job_id: str, token: int) -> bool:
        """I24 (dup-defer): the worker runs and holds the job at the token, its lease
        open and inside its conservative deadline on its own clock; or one of its
        attempts claimed it at the token and has not held it yet (validating, taking
        its slots: soak seeds 1040258 and 1045173). (An attempt whose handler
        returned, its end write under way, is the protocol's to keep too, but not
        counted here: another worker's watch does not see it, see ``LeaseBook.owns``.)"""
        w = self.world.workers.get(worker)
        return (
            w is not None
            and w.alive
            and w.paused_until <= self.world.now
            and (
                w.book.holds_open(job_id, token, w.mono())
                or w.book.claim_pending(job_id, token, w.mono())
            )
        )

    def known_classes(self, worker: str) -> frozenset[str] | None:
        w = self.world.workers.get(worker)
        return frozenset(w.classes) if w is not None else None

    def effect_reported(self, worker: str, data: Any) -> None:
        """``intent_confirmed``/``intent_replayed``: the effect flow returns this result."""
        key = str(data.get("key", ""))
        recorded = None
        for target in self.world.receivers.targets.values():
            recorded = recorded or target.applied.get(key)
        self.world.checker.now = self.world.now
        self.world.checker.effect_reported(
            worker, str(data.get("job_id")), key, data.get("external_id"), recorded
        )

    def refused(self, worker: str, data: Any) -> None:
        """A refusal that proves another owner: a fenced receiver's 412 (the tool's
        ``LeaseLost``) or a fenced intent start that found the token moved (I20)."""
        if data.get("error_code") == "LeaseLost" or data.get("reason") == "token_moved":
            self.refused_attempts.add((worker, str(data.get("job_id")), data.get("token")))

    def attempt_abandoned(self, worker: str, data: Any) -> None:
        """``job_abandoned``: was the attempt given up right after a transient cancellation?
        And if a refusal proved another owner, is it told as a lease loss (I20)?"""
        w = self.world.workers[worker]
        job_id, token = str(data.get("job_id")), data.get("token")
        if (worker, job_id, token) in self.refused_attempts:
            self.world.checker.now = self.world.now
            self.world.checker.refusal_told_as(worker, job_id, token, str(data.get("error_code")))
        held = w.book.get(job_id)
        if held is None or held.lease.token != token or not held.tag.transient_cancel:
            return
        lease = held.lease
        # Past the conservative deadline giving up is the rule (DESIGN: let it go).
        running = lease.status is LeaseStatus.DONE and w.mono() < lease.conservative_deadline
        self.world.checker.now = self.world.now
        self.world.checker.attempt_abandoned(
            worker, job_id, token, str(data.get("error_code")), self.world.truth(job_id), running
        )

    def ownership_unknown(self, worker: str, data: Any) -> None:
        """I14: a write DynamoDB refused as invalid is not a question of ownership."""
        reason = str(data.get("reason", ""))
        if "ValidationException" in reason:
            self.world.checker.now = self.world.now
            self.world.checker.validation_as_unknown(worker, str(data.get("job_id")), reason)
