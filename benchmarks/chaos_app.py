"""The job app that ``benchmarks/chaos.py`` runs in real worker processes.

Three job classes with short leases, so faults of a few seconds cost leases:

- ``pay`` (lease 5 s): some work, then ``capture`` at the fenced payment
  receiver, more work, then (usually) a ``fee`` on the same invoice, then a tail.
  Both effects go through ``ctx.effect`` (durable intents) with ``http_json``;
  the fence scope is the job (tokens are ordered per job), so the two effects
  of one job may carry different tokens when the job changed hands between them.
- ``notify`` (lease 4 s): one effect on its own invoice, through the
  ``notices`` target, which declares no check: when its outcome is in doubt
  (a takeover finds the intent ``in_progress``) nobody can tell, the intent
  turns ``ambiguous`` and the job is parked for an operator.
- ``compute`` (lease 6 s): pure work, no side effect.

Every duration comes from the payload (drawn from the run's seed by the
driver), so a schedule's work is the same on every replay. Each effect's tool
call waits ``think`` seconds before it sends (a slow client), which widens the
window where a SIGSTOP lands in the middle of a call.

The ``payments`` target's check asks the receiver's idempotency store whether
the key was applied: a ``done`` record is ``CONFIRMED`` with the stored charge
id, no record is ``NOT_APPLIED``, anything else (or an error) ``CANNOT_TELL``.
The check reads the receiver's own tables directly (``CHAOS_RECEIVER_AWS``),
not through this worker's fault proxy: it asks the target, which is reachable.

Environment: ``CHAOS_RECEIVER_URL``, ``CHAOS_RECEIVER_AWS``,
``CHAOS_RECEIVER_PREFIX``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from pydantic import BaseModel, Field

from sqs_lease import (
    App,
    CheckAnswer,
    EffectCall,
    IntentView,
    JobContext,
    LeaseError,
    Settings,
    Verdict,
)
from sqs_lease.effects import ToolResult, http_json
from sqs_lease.receiver import FencedReceiver

__all__ = ["Compute", "Notify", "Pay", "app", "check_payment"]

app = App()

_RECEIVER_LOCK = threading.Lock()
_RECEIVER: FencedReceiver | None = None


def _receiver() -> FencedReceiver:
    global _RECEIVER
    with _RECEIVER_LOCK:
        if _RECEIVER is None:
            settings = Settings(
                endpoint_url=os.environ["CHAOS_RECEIVER_AWS"],
                prefix=os.environ["CHAOS_RECEIVER_PREFIX"],
            )
            _RECEIVER = FencedReceiver(settings, prefix=settings.prefix)
        return _RECEIVER


def check_payment(view: IntentView) -> CheckAnswer:
    """Did the receiver apply this intent's key? Asked after an unknown outcome."""
    try:
        record = _receiver().record(view.key)
    except Exception as exc:  # the check could not ask: nobody can tell
        return CheckAnswer(Verdict.CANNOT_TELL, detail=f"check failed: {type(exc).__name__}")
    if record is None:
        return CheckAnswer(Verdict.NOT_APPLIED, detail="no idempotency record")
    status = int(record.status or 0)
    if record.state == "done" and 200 <= status < 300:
        response = json.loads(record.response or "{}")
        return CheckAnswer(
            Verdict.CONFIRMED,
            external_id=record.external_id,
            response=response if isinstance(response, dict) else {"value": response},
            detail="done at the receiver",
        )
    return CheckAnswer(Verdict.CANNOT_TELL, detail=f"record is {record.state} (status {status})")


app.target("payments", check=check_payment)
app.target("notices")  # no check: doubt parks the job


class Pay(BaseModel):
    invoice: str
    amount: int = Field(ge=100)
    fee: int | None = Field(default=None, ge=1, le=99)
    work: float = Field(ge=0)
    middle: float = Field(default=0.0, ge=0)
    tail: float = Field(default=0.0, ge=0)
    think: float = Field(default=0.0, ge=0)


class Notify(BaseModel):
    invoice: str
    amount: int = Field(ge=1)
    work: float = Field(ge=0)
    think: float = Field(default=0.0, ge=0)


class Compute(BaseModel):
    items: int = Field(ge=1)
    work: float = Field(ge=0)


def _work(ctx: JobContext[Any], seconds: float) -> bool:
    """Work for ``seconds`` in small steps; False once the attempt was told to stop.

    A handler that swallows the stop (as this one does, on purpose) and returns
    anyway gets its result discarded, never committed.
    """
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            ctx.wait(min(0.1, left))
        except LeaseError:
            return False
        ctx.progress()
    return True


def _send(think: float) -> Any:
    """The tool: a slow client (``think`` s) that then POSTs the intent's payload."""

    def tool(call: EffectCall) -> ToolResult:
        if think > 0:
            time.sleep(think)
        return http_json(
            call, os.environ["CHAOS_RECEIVER_URL"] + "/charge", timeout=5.0, id_field="charge_id"
        )

    return tool


def _mine(ctx: JobContext[Any]) -> dict[str, Any]:
    # Who produced the result: the driver checks it against the record's owner and token.
    return {"worker": ctx.worker_id, "token": ctx.token, "attempt": ctx.attempt}


@app.job(
    "pay",
    payload=Pay,
    lease_seconds=5,
    heartbeat_seconds=1.0,
    jitter_seconds=1.0,
    missed_heartbeats=2,
    effect_timeout_seconds=30,
    progress_timeout_seconds=30,
    max_attempts=12,
    backoff_base_seconds=0.5,
    backoff_max_seconds=2.0,
)
def pay(ctx: JobContext[Any], p: Pay) -> dict[str, Any]:
    _work(ctx, p.work)
    capture = ctx.effect(
        "capture", "payments", {"invoice": p.invoice, "amount": p.amount}, _send(p.think)
    )
    fee_id: str | None = None
    if p.fee is not None:
        _work(ctx, p.middle)
        fee = ctx.effect("fee", "payments", {"invoice": p.invoice, "amount": p.fee}, _send(p.think))
        fee_id = fee.external_id
    _work(ctx, p.tail)
    return {**_mine(ctx), "capture": capture.external_id, "fee": fee_id}


@app.job(
    "notify",
    payload=Notify,
    lease_seconds=4,
    heartbeat_seconds=1.0,
    jitter_seconds=1.0,
    missed_heartbeats=2,
    effect_timeout_seconds=30,
    progress_timeout_seconds=30,
    max_attempts=12,
    backoff_base_seconds=0.5,
    backoff_max_seconds=2.0,
)
def notify(ctx: JobContext[Any], p: Notify) -> dict[str, Any]:
    _work(ctx, p.work)
    sent = ctx.effect(
        "notify", "notices", {"invoice": p.invoice, "amount": p.amount}, _send(p.think)
    )
    return {**_mine(ctx), "notice": sent.external_id}


@app.job(
    "compute",
    payload=Compute,
    lease_seconds=6,
    heartbeat_seconds=1.5,
    jitter_seconds=1.0,
    missed_heartbeats=2,
    effect_timeout_seconds=30,
    progress_timeout_seconds=30,
    max_attempts=12,
    backoff_base_seconds=0.5,
    backoff_max_seconds=2.0,
)
def compute(ctx: JobContext[Any], p: Compute) -> dict[str, Any]:
    # A stopped attempt still returns: its result must be discarded, never committed.
    finished = _work(ctx, p.work)
    return {**_mine(ctx), "items": p.items, "finished": finished}
