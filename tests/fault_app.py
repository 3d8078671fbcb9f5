"""The job app that the fault tests run in real worker processes.

One job class, ``charge``: step 1 charges an invoice at the fenced receiver,
step 2 sends its receipt. Gates (files) let a test decide exactly when a slow
call completes, so each scenario's order of events is fixed, not timed.
Behaviour per process comes from the environment:

- ``GATE_BEFORE_STEP2``: wait for the gate file between step 1 and step 2. While
  waiting, with ``CHECK_WHILE_WAITING=1`` the handler keeps asking ``ctx.check()``
  and gives up step 2 once the lease cannot be confirmed; without it, step 2 is
  a request that was already on its way when the process was paused.
- ``GATE_BEFORE_RETURN``: wait for the gate file after step 2.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sqs_lease import App, JobContext, LeaseError

app = App()


class Charge(BaseModel):
    invoice: str
    amount: int


def _post(ctx: JobContext[Any], path: str, key: str, body: dict[str, Any]) -> tuple[int, Any]:
    url = os.environ["RECEIVER_URL"] + path
    headers = {"Content-Type": "application/json", **ctx.fence_headers(key)}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    with ctx.tool_request("receiver", key=key):
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")


def _gate(name: str, ctx: JobContext[Any] | None = None) -> bool:
    """Wait for a gate file; return False if a check refused while waiting."""
    path = Path(os.environ["GATE_DIR"]) / name
    refused = False
    deadline = time.monotonic() + 90
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
        if ctx is not None and not refused:
            try:
                ctx.check()
            except LeaseError as exc:
                refused = True
                ctx.note("irreversible_step_refused", error_code=type(exc).__name__)
    return not refused


@app.job(
    "charge",
    payload=Charge,
    lease_seconds=4,
    heartbeat_seconds=1.0,
    jitter_seconds=1.0,
    missed_heartbeats=2,
    max_attempts=5,
)
def charge(ctx: JobContext[Any], p: Charge) -> dict[str, Any]:
    me = os.environ.get("WORKER_NAME", "?")
    ctx.check()
    status1, body1 = _post(
        ctx, "/charge", f"{ctx.job_id}:charge", {"invoice": p.invoice, "amount": p.amount}
    )
    ctx.note("step_done", step="charge", status=status1)
    ctx.check()
    sent_step2 = True
    status2: int | None = None
    if os.environ.get("GATE_BEFORE_STEP2"):
        checking = os.environ.get("CHECK_WHILE_WAITING") == "1"
        sent_step2 = _gate(f"{me}.step2", ctx if checking else None)
    if sent_step2:
        status2, _ = _post(
            ctx,
            "/charge",
            f"{ctx.job_id}:receipt",
            {"invoice": f"{p.invoice}-receipt", "amount": 1},
        )
        ctx.note("step_done", step="receipt", status=status2)
    if os.environ.get("GATE_BEFORE_RETURN"):
        _gate(f"{me}.return")
    return {"by": me, "charge_status": status1, "charge": body1, "receipt_status": status2}


# ----------------------------------------------------------------------------- staged

ship = app.staged(
    "ship",
    payload=Charge,
    lease_seconds=4,
    heartbeat_seconds=1.0,
    jitter_seconds=1.0,
    missed_heartbeats=2,
    max_attempts=5,
)
"""A job of three stages (charge -> receipt -> close) for the stage tests.

Every run of a stage's handler appends ``stage token worker`` to ``RUNS_FILE`` (a
file, so runs of processes that were killed count too). ``GATE_AFTER_EFFECT``:
the charge stage waits for the gate ``{worker}.late`` after its effect (the test
pauses the process there); ``LATE_EFFECT=1``: it then sends a second, late call
to the receiver under its own token before it returns."""


class Receipt(BaseModel):
    charge_status: int


def _ran(ctx: JobContext[Any]) -> None:
    with open(os.environ["RUNS_FILE"], "a") as fh:
        fh.write(f"{ctx.stage} {ctx.token} {os.environ.get('WORKER_NAME', '?')}\n")


@ship.stage("charge")
def ship_charge(ctx: JobContext[Any], p: Charge) -> Any:
    from sqs_lease import NextStage

    me = os.environ.get("WORKER_NAME", "?")
    _ran(ctx)
    ctx.check()
    status, _ = _post(ctx, "/charge", f"{ctx.job_id}:charge", {"invoice": p.invoice, "amount": 1})
    ctx.note("step_done", step="charge", status=status)
    if os.environ.get("GATE_AFTER_EFFECT"):
        _gate(f"{me}.late")
    if os.environ.get("LATE_EFFECT") == "1":
        late, _ = _post(ctx, "/charge", f"{ctx.job_id}:late", {"invoice": "late", "amount": 1})
        ctx.note("late_effect", status=late)
    return NextStage("receipt", Receipt(charge_status=status), result={"by": me})


@ship.stage("receipt", payload=Receipt)
def ship_receipt(ctx: JobContext[Any], p: Receipt) -> Any:
    from sqs_lease import NextStage

    _ran(ctx)
    ctx.check()
    status, _ = _post(ctx, "/charge", f"{ctx.job_id}:receipt", {"invoice": "rcpt", "amount": 1})
    ctx.note("step_done", step="receipt", status=status)
    if os.environ.get("GATE_IN_RECEIPT"):
        _gate(f"{os.environ.get('WORKER_NAME', '?')}.receipt")
    return NextStage("close", {"receipt_status": status})


@ship.stage("close")
def ship_close(ctx: JobContext[Any], p: dict[str, Any]) -> dict[str, Any]:
    _ran(ctx)
    return {"earlier": sorted(ctx.results), "input": p}
