"""The demo's job app: seven classes with different leases.

- ``ocr``: short calls (lease 6 s), pure computation, no side effect.
- ``export``: slower calls (lease 10 s) that sometimes fail transiently.
- ``charge``: a payment at the fenced receiver (lease 5 s) through an intent,
  keyed and fenced; its check asks the payment service by key.
- ``erp_post``: a posting to an ERP that cannot be asked (its check can never
  tell): a timeout there parks the job for an operator.
- ``browse``: a page in a headless browser from a pool of two for the whole
  fleet (``concurrency_limit=2``): never more than two run at once, whichever
  worker holds them; the rest wait without spending an attempt.
- ``agent_step``: one step of an agent session (submitted with a group); it
  thinks until its session is cancelled (``sqs-lease jobs cancel --group``).
- ``report_export``: a job of three stages (fetch -> render -> publish), each
  with its own class and checkpoint (docs/stages.md).

Run workers for it with ``sqs-lease worker examples.demo_app:app``.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
from typing import Any

from pydantic import BaseModel, Field

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


class BrowsePage(BaseModel):
    page: int = Field(ge=1)
    seconds: float = Field(default=0.8, ge=0, le=10)


class AgentStep(BaseModel):
    step: int = Field(ge=1)


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
            headers=signed_fence(call),  # the receiver verifies the signature
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


@app.job(
    "browse",
    payload=BrowsePage,
    lease_seconds=6,
    heartbeat_seconds=1.5,
    jitter_seconds=1.0,
    missed_heartbeats=2,
    concurrency_limit=2,  # the browser pool: two for the whole fleet
)
def browse(ctx: JobContext[Any], p: BrowsePage) -> dict[str, Any]:
    ctx.note("browser_opened", page=p.page)
    try:
        ctx.wait(p.seconds)  # the page loads
    finally:
        ctx.note("browser_closed", page=p.page)
    return {"page": p.page, "title": f"page {p.page}"}


@app.job(
    "agent_step",
    payload=AgentStep,
    lease_seconds=6,
    heartbeat_seconds=1.5,
    jitter_seconds=1.0,
    missed_heartbeats=2,
)
def agent_step(ctx: JobContext[Any], p: AgentStep) -> dict[str, Any]:
    ctx.note("agent_step_started", step=p.step)
    for _ in range(600):  # thinks for up to a minute; a cancel stops it at once
        ctx.wait(0.1)
    return {"step": p.step}


class ReportExport(BaseModel):
    report: str
    months: int = Field(ge=1, le=24)


class Rendered(BaseModel):
    rows_key: str
    rows: int


report_export = app.staged(
    "report_export",
    payload=ReportExport,
    lease_seconds=6,
    heartbeat_seconds=1.5,
    jitter_seconds=1.0,
    missed_heartbeats=3,
    max_attempts=4,
    backoff_base_seconds=1.0,
    backoff_max_seconds=3.0,
)
"""A multi-stage job: fetch the months' rows, render the report, publish it. Each
stage is its own checkpoint; a worker that dies in a stage redoes only that one."""


@report_export.stage("fetch")
def report_fetch(ctx: JobContext[Any], p: ReportExport) -> NextStage:
    rows = 0
    for _ in range(p.months):
        ctx.wait(0.1)  # one month's rows (raises once the attempt must stop)
        rows += 120
    # The rows would go to S3; the stage's input and checkpoint carry a reference.
    return NextStage("render", Rendered(rows_key=f"s3://reports/{p.report}/rows", rows=rows))


@report_export.stage("render", payload=Rendered, lease_seconds=10, heartbeat_seconds=2.0)
def report_render(ctx: JobContext[Any], p: Rendered) -> NextStage:
    ctx.wait(0.3)
    return NextStage("publish", {"pdf_key": p.rows_key.replace("/rows", ".pdf")})


@report_export.stage("publish")
def report_publish(ctx: JobContext[Any], p: dict[str, Any]) -> dict[str, Any]:
    rows = ctx.results["fetch"]["rows"]  # fetch left its rendered input as its checkpoint
    return {"url": p["pdf_key"].replace("s3://", "https://"), "rows": rows}
