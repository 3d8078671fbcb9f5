"""The demo's job app: four classes with different leases.

- ``ocr``: short calls (lease 6 s), pure computation, no side effect.
- ``export``: slower calls (lease 10 s) that sometimes fail transiently.
- ``charge``: a payment at the fenced receiver (lease 5 s) through an intent,
  keyed and fenced; its check asks the payment service by key.
- ``erp_post``: a posting to an ERP that cannot be asked (its check can never
  tell): a timeout there parks the job for an operator.

Run workers for it with ``sqs-lease worker examples.demo_app:app``.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
from typing import Any

from pydantic import BaseModel, Field

from sqs_lease import (
    App,
    CheckAnswer,
    EffectCall,
    IntentView,
    JobContext,
    ToolOutcomeUnknown,
    ToolResult,
    TransientError,
    Verdict,
)
from sqs_lease.effects import http_json

app = App()


class Page(BaseModel):
    document: str
    page: int = Field(ge=1)


class Export(BaseModel):
    report: str
    rows: int = Field(ge=0)
    flaky: bool = False


class Payment(BaseModel):
    invoice: str
    amount: int = Field(gt=0)
    lose_response: bool = False  # demo only: the target applies it, the answer is lost


class ErpPosting(BaseModel):
    invoice: str
    account: str
    timeout_first: bool = False  # demo only: the first call times out, nobody can tell


def _receiver() -> str:
    return os.environ["RECEIVER_URL"]


def payments_check(intent: IntentView) -> CheckAnswer:
    """Ask the payment service whether this key was applied (by idempotency key)."""
    with urllib.request.urlopen(_receiver() + "/ledger", timeout=10) as resp:
        rows = json.loads(resp.read())["rows"]
    for row in rows:
        if row["idem_key"] == intent.key:
            return CheckAnswer(
                Verdict.CONFIRMED,
                external_id=row.get("charge_id"),
                response={"charge_id": row.get("charge_id"), "reconciled": True},
            )
    return CheckAnswer(Verdict.NOT_APPLIED)


def erp_check(intent: IntentView) -> CheckAnswer:
    # This ERP has no lookup by key or by business id: it can never tell.
    return CheckAnswer(Verdict.CANNOT_TELL, detail="the ERP offers no lookup")


app.target("payments", check=payments_check, key_retention_seconds=86_400, success="completed")
app.target("erp", check=erp_check, key_retention_seconds=None, success="accepted")


@app.job(
    "ocr",
    payload=Page,
    lease_seconds=6,
    heartbeat_seconds=1.5,
    jitter_seconds=1.0,
    missed_heartbeats=2,
    progress_timeout_seconds=30,
)
def ocr(ctx: JobContext[Any], p: Page) -> dict[str, Any]:
    ctx.wait(0.05 + (p.page % 5) * 0.05)
    digest = hashlib.sha256(f"{p.document}:{p.page}".encode()).hexdigest()[:16]
    return {"text_hash": digest, "page": p.page}


@app.job(
    "export",
    payload=Export,
    lease_seconds=10,
    heartbeat_seconds=2.0,
    jitter_seconds=1.5,
    missed_heartbeats=3,
    progress_timeout_seconds=60,
    max_attempts=4,
    backoff_base_seconds=1.0,
    backoff_max_seconds=3.0,
)
def export(ctx: JobContext[Any], p: Export) -> dict[str, Any]:
    if p.flaky and ctx.attempt == 1:
        raise TransientError("export service answered 503", code="upstream_503")
    for _ in range(max(1, p.rows // 500)):
        ctx.wait(0.3)  # raises once the attempt must stop: no partial export returned
        ctx.progress()
    return {"report": p.report, "rows": p.rows}


@app.job(
    "charge",
    payload=Payment,
    lease_seconds=5,
    heartbeat_seconds=1.0,
    jitter_seconds=1.0,
    missed_heartbeats=2,
    effect_timeout_seconds=30,  # http_json's socket timeout (EffectCall.timeout)
    max_attempts=5,
)
def charge(ctx: JobContext[Any], p: Payment) -> dict[str, Any]:
    def capture(call: EffectCall) -> ToolResult:
        result = http_json(
            call,
            _receiver() + "/charge",
            id_field="charge_id",
            body={"invoice": p.invoice, "amount": p.amount},
        )
        if p.lose_response and ctx.attempt == 1:
            raise ToolOutcomeUnknown("payment service: response timed out")
        return result

    done = ctx.effect(
        "capture",
        "payments",
        {"invoice": p.invoice, "amount": p.amount},
        capture,
        key=f"payment:{p.invoice}:capture",
    )
    ctx.wait(0.3 + (p.amount % 7) * 0.1)  # the rest of the call: confirmation, bookkeeping
    return {"charge_id": done.external_id, "invoice": p.invoice, "reconciled": done.reconciled}


@app.job(
    "erp_post",
    payload=ErpPosting,
    lease_seconds=6,
    heartbeat_seconds=1.5,
    jitter_seconds=1.0,
    missed_heartbeats=2,
    effect_timeout_seconds=30,
    max_attempts=3,
)
def erp_post(ctx: JobContext[Any], p: ErpPosting) -> dict[str, Any]:
    def post(call: EffectCall) -> ToolResult:
        if p.timeout_first:
            raise ToolOutcomeUnknown("ERP: request timed out after sending")
        return ToolResult({"posted": p.invoice}, external_id=f"erp-{p.invoice}")

    done = ctx.effect("post", "erp", {"invoice": p.invoice, "account": p.account}, post)
    return {"erp_id": done.external_id, "replayed": done.replayed}
