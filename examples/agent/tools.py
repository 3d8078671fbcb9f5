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
- ``export``: an ERP export as one job of three durable stages (``app.staged``,
  docs/stages.md): ``fetch`` reads the rows from the source and stores them (a
  stand-in store: the stage passes on a reference, not the rows), ``transform``
  normalises them into the upload file, ``upload`` posts that file to the ERP
  through an intent. Each stage ends with ``NextStage`` (its checkpoint, the next
  stage's input), has its own lease, attempts and keys, and reads what the earlier
  ones left (``ctx.results``); a stage that fails is retried alone (``sqs-lease
  jobs retry ID``), the committed ones are not run again.
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
from examples.receiver_service import signed_fence
from sqs_lease import (
    App,
    CheckAnswer,
    EffectCall,
    IntentView,
    JobContext,
    NextStage,
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


class Fetched(BaseModel):
    """The transform stage's input: where the fetch stage stored the rows."""

    export_id: str
    rows_key: str


class Upload(BaseModel):
    """The upload stage's input: the file to post, and its digest."""

    export_id: str
    file_key: str
    digest: str


class Payment(BaseModel):
    invoice: str
    amount: int = Field(gt=0)
    lose_first_answer: bool = False  # local only: the charge applies, its answer is lost


# ------------------------------------------------------------------- the stores (stand-ins)

_store_lock = threading.Lock()
STORE: dict[str, list[str]] = {}
"""Stands in for the object store (S3) the export's stages pass references into: a
stage's checkpoint names a key here, never the rows themselves (a job record holds
400 KB in all)."""


def _put(key: str, lines: list[str]) -> str:
    with _store_lock:
        STORE[key] = lines  # written whole under one key: a retried stage rewrites it
    return key


def _get(key: str) -> list[str]:
    with _store_lock:
        return list(STORE[key])


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


def export_fetch(ctx: JobContext[Any], e: Export) -> NextStage:
    """Stage 1: read the rows from the source system and store them."""
    ctx.wait(0.3)  # the source system's query
    rows = [f"{e.export_id},row-{i},{(i * 37) % 1000}" for i in range(e.rows)]
    key = _put(f"exports/{ctx.job_id}/rows.csv", rows)
    return NextStage(
        "transform",
        Fetched(export_id=e.export_id, rows_key=key),
        result={"rows": len(rows), "rows_key": key},
    )


def export_transform(ctx: JobContext[Any], f: Fetched) -> NextStage:
    """Stage 2: normalise the stored rows into the ERP's upload file."""
    ctx.wait(0.2)
    lines = [line.upper() for line in _get(f.rows_key)]
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    key = _put(f"exports/{ctx.job_id}/upload.csv", lines)
    return NextStage(
        "upload",
        Upload(export_id=f.export_id, file_key=key, digest=digest),
        result={"file_key": key, "digest": digest},
    )


def export_upload(ctx: JobContext[Any], u: Upload) -> dict[str, Any]:
    """Stage 3: post the file to the ERP, once (an intent keyed by job id + stage)."""
    done = ctx.effect("post", "erp", {"export_id": u.export_id, "digest": u.digest}, erp_post)
    return {
        "erp_id": done.external_id,
        "replayed": done.replayed,
        "rows": ctx.results["fetch"]["rows"],  # what the fetch stage left
        "digest": u.digest,
    }


def pay(ctx: JobContext[Any], p: Payment) -> dict[str, Any]:
    def capture(call: EffectCall) -> ToolResult:
        result = http_json(
            call,
            os.environ["RECEIVER_URL"] + "/charge",
            id_field="charge_id",
            body={"invoice": p.invoice, "amount": p.amount},
            headers=signed_fence(call),  # the receiver verifies the signature
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
    # Settled without a second charge either way: reconciled by the check, or replayed
    # from the intent the other job of the same invoice confirmed first.
    return {"charge_id": done.external_id, "reconciled": done.reconciled, "replayed": done.replayed}


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
    export = a.staged("export", payload=Export, **policy)
    export.stage("fetch")(export_fetch)
    export.stage("transform", payload=Fetched)(export_transform)
    export.stage("upload", payload=Upload, effect_timeout_seconds=30)(export_upload)
    a.job("pay", payload=Payment, effect_timeout_seconds=30, max_attempts=5, **policy)(pay)
    return a


app = build_app(WORKER_BUDGET)
lambda_app = build_app(LAMBDA_BUDGET)
