"""The demo's job app: three classes with different leases.

- ``ocr``: short calls (lease 6 s), pure computation, no side effect.
- ``export``: slower calls (lease 10 s) that sometimes fail transiently.
- ``charge``: a payment at the fenced receiver (lease 5 s), keyed and fenced.

Run workers for it with ``sqs-lease worker examples.demo_app:app``.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request
from typing import Any

from pydantic import BaseModel, Field

from sqs_lease import App, JobContext, PermanentError, TransientError

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


@app.job("ocr", payload=Page, lease_seconds=6, heartbeat_seconds=1.5, jitter_seconds=1.0,
         missed_heartbeats=2, tool_timeout_seconds=30)
def ocr(ctx: JobContext[Any], p: Page) -> dict[str, Any]:
    ctx.wait(0.05 + (p.page % 5) * 0.05)
    digest = hashlib.sha256(f"{p.document}:{p.page}".encode()).hexdigest()[:16]
    return {"text_hash": digest, "page": p.page}


@app.job("export", payload=Export, lease_seconds=10, heartbeat_seconds=2.0, jitter_seconds=1.5,
         missed_heartbeats=3, tool_timeout_seconds=60, max_attempts=4,
         backoff_base_seconds=1.0, backoff_max_seconds=3.0)
def export(ctx: JobContext[Any], p: Export) -> dict[str, Any]:
    if p.flaky and ctx.attempt == 1:
        raise TransientError("export service answered 503", code="upstream_503")
    for _ in range(max(1, p.rows // 500)):
        if ctx.wait(0.3):
            break
        ctx.progress()
    return {"report": p.report, "rows": p.rows}


@app.job("charge", payload=Payment, lease_seconds=5, heartbeat_seconds=1.0, jitter_seconds=1.0,
         missed_heartbeats=2, tool_timeout_seconds=60, max_attempts=5)
def charge(ctx: JobContext[Any], p: Payment) -> dict[str, Any]:
    key = f"{ctx.job_id}:capture"  # built in code from the job, never from model output
    body = json.dumps({"invoice": p.invoice, "amount": p.amount}).encode()
    headers = {"Content-Type": "application/json", **ctx.fence_headers(key)}
    ctx.check()  # the last moment to refuse before an irreversible call
    req = urllib.request.Request(os.environ["RECEIVER_URL"] + "/charge", body, headers)
    with ctx.tool_request("payments", key=key):
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            code = f"http_{err.code}"
            if err.code == 412:
                raise PermanentError("fenced out by the receiver", code="fenced") from None
            if err.code in (409, 503):
                raise TransientError(f"receiver answered {err.code}", code=code) from None
            raise PermanentError(f"receiver answered {err.code}", code=code) from None
    ctx.wait(0.3 + (p.amount % 7) * 0.1)  # the rest of the call: confirmation, bookkeeping
    return {"charge_id": answer["charge_id"], "invoice": p.invoice}
