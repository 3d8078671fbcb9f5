"""The example app's jobs: what the stack's queue and consumers are sized for.

The stack reads the job classes from this ``App`` (visibility, redrive); the
Lambda function and the ECS task load it as ``example_jobs:app``.
"""

from __future__ import annotations

from pydantic import BaseModel

from sqs_lease import App, JobContext

app = App()


class Document(BaseModel):
    """An OCR request: which document, which pages."""

    document: str
    pages: int = 1


# Stage budgets fit the example's 300 s function (a record starts only when its
# whole budget and the end margin fit the invocation's time left).
@app.job(
    "ocr",
    payload=Document,
    lease_seconds=60,
    heartbeat_seconds=10.0,
    max_attempts=5,
    stage_budget_seconds=240.0,
)
def ocr(ctx: JobContext[Document], doc: Document) -> dict[str, object]:
    """A tool call of up to a few minutes (stands in for a real OCR service)."""
    ctx.check()
    return {"document": doc.document, "pages": doc.pages}


class Export(BaseModel):
    """An ERP export of one period."""

    period: str


@app.job(
    "erp_export",
    payload=Export,
    lease_seconds=120,
    heartbeat_seconds=20.0,
    max_attempts=8,
    stage_budget_seconds=280.0,
)
def erp_export(ctx: JobContext[Export], export: Export) -> dict[str, str]:
    """A slower call whose lease is longer: the queue's visibility follows it."""
    ctx.check()
    return {"period": export.period, "status": "exported"}
