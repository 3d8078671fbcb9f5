"""An agent's tool calls as job classes: one set of handlers, two ways to run them.

The agent (its planner is not shown) turns each tool call it decides on into a job
(``session.submit_session``); a worker runs them under heartbeat-extended leases.

- ``search``: a quick call (well under a second).
- ``ocr``: one page of OCR (a fraction of a second here; seconds in real life).
- ``browse``: a slow, browser-like call: a minute or an hour, one page load after
  another. It calls ``ctx.progress()`` after each page, and the heartbeat extends
  its lease while it runs; a lost lease or a shutdown stops it at the next
  ``ctx.wait``. The payload says how many pages and how long each takes (the local
  run uses seconds; an hour is ``steps=3600, step_seconds=1``).
- ``export_fetch`` then ``export_publish``: an ERP export as two stages. The fetch
  stage's result is the checkpoint (the rows' digest); it submits the publish
  stage as its own job, with a job id taken from the export id, so a second owner
  that redoes the fetch submits nothing new. The publish stage posts the digest
  to the ERP through an intent.
- ``pay``: a payment at the fenced receiver (``examples/receiver_service.py``)
  through an intent keyed on the invoice, with the attempt's fencing token: a
  retried attempt, a lost answer or a second job for the same invoice never pays
  twice (the key replays, the check reconciles an unknown outcome).

``app`` is what a long-running worker runs (``sqs-lease worker
examples.agent.tools:app``; ECS: ``SQS_LEASE_APP=examples.agent.tools:app``): its
classes may run for an hour. ``lambda_app`` registers the same handlers with a
stage budget a Lambda invocation can hold (600 s under a 900 s function timeout):
``SQS_LEASE_APP=examples.agent.tools:lambda_app`` with the function handler
``sqs_lease.aws_lambda.entry``. Both read their settings from the environment
(``Settings.from_env``) and the receiver's address from ``RECEIVER_URL``.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

from pydantic import BaseModel, Field

from examples.demo_app import payments_check
from sqs_lease import (
    App,
    CheckAnswer,
    EffectCall,
    IntentView,
    JobContext,
    Producer,
    Settings,
    ToolOutcomeUnknown,
    ToolResult,
    Verdict,
)
from sqs_lease.effects import http_json

LOCAL_LEASE: dict[str, Any] = {
    # Short, so a local run shows the heartbeat extending a lease several times; in
    # production the defaults (30 s lease, 5 s heartbeat) or longer.
    "lease_seconds": 6,
    "heartbeat_seconds": 1.5,
    "jitter_seconds": 1.0,
    "missed_heartbeats": 2,
}

WORKER_BUDGET = 3600.0
"""A long-running worker's stage budget: a browse may take an hour."""

LAMBDA_BUDGET = 600.0
"""What a Lambda invocation can hold: a record starts only when its whole stage
budget (and a 3 s margin) fits in the time left, so keep it under the function
timeout (900 s at most)."""


class Query(BaseModel):
    text: str = Field(min_length=1)


class Page(BaseModel):
    document: str
    page: int = Field(ge=1)


class Browse(BaseModel):
    url: str
    steps: int = Field(ge=1, le=100_000)
    step_seconds: float = Field(gt=0, le=60)


class Export(BaseModel):
    export_id: str
    rows: int = Field(ge=0)


class Publish(BaseModel):
    export_id: str
    rows: int
    digest: str


class Payment(BaseModel):
    invoice: str
    amount: int = Field(gt=0)
    lose_first_answer: bool = False  # local only: the charge applies, its answer is lost


# ------------------------------------------------------------------- the ERP (a stand-in)

_erp_lock = threading.Lock()
ERP_POSTINGS: dict[str, str] = {}
"""Postings by idempotency key: stands in for an ERP that keeps the keys it saw."""


def erp_post(call: EffectCall) -> ToolResult:
    """Post an export to the ERP with the intent's key (a repeated key is replayed)."""
    with _erp_lock:
        posting = ERP_POSTINGS.setdefault(call.key, f"erp-{len(ERP_POSTINGS) + 1}")
    return ToolResult({"posted": True}, external_id=posting)


def erp_check(intent: IntentView) -> CheckAnswer:
    """Asked when a posting's outcome is unknown: did this key reach the ERP?"""
    with _erp_lock:
        posting = ERP_POSTINGS.get(intent.key)
    if posting is not None:
        return CheckAnswer(Verdict.CONFIRMED, external_id=posting)
    return CheckAnswer(Verdict.NOT_APPLIED)


_lost: set[str] = set()


def _first_time(key: str) -> bool:
    """Local only: True the first time this process answers for ``key`` (whichever
    attempt that is: a retried attempt must meet the same lost answer)."""
    with _erp_lock:
        first = key not in _lost
        _lost.add(key)
    return first


# ------------------------------------------------------------------- the handlers


def search(ctx: JobContext[Any], q: Query) -> dict[str, Any]:
    ctx.check()  # still ours? (raises if the lease was lost or the session cancelled)
    words = q.text.split()
    return {"hits": [f"https://example.com/{w}" for w in words[:3]]}


def ocr(ctx: JobContext[Any], p: Page) -> dict[str, Any]:
    ctx.wait(0.2)  # the OCR engine; wait() raises at once if the attempt must stop
    digest = hashlib.sha256(f"{p.document}:{p.page}".encode()).hexdigest()[:16]
    return {"page": p.page, "text_hash": digest}


def browse(ctx: JobContext[Any], b: Browse) -> dict[str, Any]:
    for _ in range(b.steps):
        ctx.wait(b.step_seconds)  # one page load
        ctx.progress()  # alive: the watchdog lets the heartbeat extend the lease
    return {"url": b.url, "pages": b.steps}


def export_fetch(ctx: JobContext[Any], e: Export) -> dict[str, Any]:
    ctx.wait(0.3)  # read the rows from the source system
    digest = hashlib.sha256(f"{e.export_id}:{e.rows}".encode()).hexdigest()[:16]
    # The next stage is a job of its own, named after the export: a second owner of
    # this stage (after a takeover) submits the same id and payload, a no-op.
    next_stage = _producer().submit(
        "export_publish",
        Publish(export_id=e.export_id, rows=e.rows, digest=digest),
        job_id=f"{ctx.job_id}:publish",
    )
    return {"rows": e.rows, "digest": digest, "next": next_stage.job_id}


def export_publish(ctx: JobContext[Any], p: Publish) -> dict[str, Any]:
    done = ctx.effect("publish", "erp", {"export_id": p.export_id, "digest": p.digest}, erp_post)
    return {"erp_id": done.external_id, "replayed": done.replayed}


def pay(ctx: JobContext[Any], p: Payment) -> dict[str, Any]:
    def capture(call: EffectCall) -> ToolResult:
        result = http_json(
            call,
            os.environ["RECEIVER_URL"] + "/charge",
            id_field="charge_id",
            body={"invoice": p.invoice, "amount": p.amount},
        )
        if p.lose_first_answer and _first_time(call.key):
            # The charge applied; the answer never came back. The check asks the
            # payment service by key instead of charging again.
            raise ToolOutcomeUnknown("payment service: response timed out")
        return result

    done = ctx.effect(
        "capture",
        "payments",
        {"invoice": p.invoice, "amount": p.amount},
        capture,
        key=f"payment:{p.invoice}:capture",  # one invoice, one capture: across jobs too
    )
    return {"charge_id": done.external_id, "reconciled": done.reconciled}


# ------------------------------------------------------------------- the apps


def build_app(stage_budget_seconds: float) -> App:
    """The agent's job classes, each with ``stage_budget_seconds`` for one attempt."""
    a = App()
    a.target("payments", check=payments_check, key_retention_seconds=86_400)
    a.target("erp", check=erp_check)
    policy = {**LOCAL_LEASE, "stage_budget_seconds": stage_budget_seconds}
    a.job("search", payload=Query, **policy)(search)
    a.job("ocr", payload=Page, **policy)(ocr)
    a.job("browse", payload=Browse, progress_timeout_seconds=60, **policy)(browse)
    a.job("export_fetch", payload=Export, **policy)(export_fetch)
    a.job("export_publish", payload=Publish, effect_timeout_seconds=30, **policy)(export_publish)
    a.job("pay", payload=Payment, effect_timeout_seconds=30, max_attempts=5, **policy)(pay)
    return a


app = build_app(WORKER_BUDGET)
lambda_app = build_app(LAMBDA_BUDGET)

_producers: dict[str, Producer] = {}


def _producer() -> Producer:
    """The producer the stages submit with (settings from the environment, made once)."""
    if "p" not in _producers:
        _producers["p"] = Producer(Settings.from_env())
    return _producers["p"]
