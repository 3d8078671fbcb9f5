"""The app the container entry-point tests run in a real ``sqs-lease worker`` process.

Gate files in ``$GATE_DIR`` fix the order of events instead of timing them: a
handler touches ``<class>-<n>-started`` when it runs, and the slow ones wait for
a file the test creates. Payloads carry a ``note`` (the tests put a marker string
there and assert it never reaches the metrics).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sqs_lease import (
    App,
    JobContext,
    PermanentError,
    ToolOutcomeUnknown,
    TransientError,
)

app = App()

LEASE: dict[str, Any] = {
    "lease_seconds": 60,
    "heartbeat_seconds": 1.0,
    "jitter_seconds": 1.0,
    "missed_heartbeats": 2,
    "backoff_base_seconds": 0.0,
    "backoff_max_seconds": 0.0,
}
HANG_GUARD = 120.0


class Work(BaseModel):
    n: int
    note: str = ""


def _gates() -> Path:
    return Path(os.environ["GATE_DIR"])


def _started(name: str, p: Work) -> None:
    (_gates() / f"{name}-{p.n}-started").touch()


def _wait_for_file(path: Path) -> bool:
    deadline = time.monotonic() + HANG_GUARD
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@app.job("quick", payload=Work, **LEASE)
def quick(ctx: JobContext[Any], p: Work) -> dict[str, Any]:
    _started("quick", p)
    return {"n": p.n, "len": len(p.note)}


@app.job("polite", payload=Work, **LEASE)
def polite(ctx: JobContext[Any], p: Work) -> dict[str, Any]:
    """Waits through ``ctx.wait``: told to stop, it raises at once."""
    _started("polite", p)
    deadline = time.monotonic() + HANG_GUARD
    while not ctx.wait(0.1) and time.monotonic() < deadline:
        pass
    return {"n": p.n}


@app.job("blocked", payload=Work, **LEASE)
def blocked(ctx: JobContext[Any], p: Work) -> dict[str, Any]:
    """A tool call that never looks at its context (a blocked socket): it runs on
    until the test opens its gate, whatever the worker is told."""
    _started("blocked", p)
    _wait_for_file(_gates() / "open-blocked")
    (_gates() / f"blocked-{p.n}-finished").touch()
    return {"n": p.n}


@app.job("summarize", payload=Work, model="demo-model-1", provider="demo-ai", **LEASE)
def summarize(ctx: JobContext[Any], p: Work) -> dict[str, Any]:
    """Holds its lease (heartbeats) until the test opens its gate."""
    _started("summarize", p)
    gate = _gates() / "open-summarize"
    deadline = time.monotonic() + HANG_GUARD
    while not gate.exists() and time.monotonic() < deadline:
        ctx.wait(0.1)
    return {"n": p.n}


@app.job("flaky", payload=Work, **LEASE)
def flaky(ctx: JobContext[Any], p: Work) -> dict[str, Any]:
    _started("flaky", p)
    if ctx.attempt == 1:
        raise TransientError("first try fails")
    return {"n": p.n, "attempt": ctx.attempt}


@app.job("unsure", payload=Work, **LEASE)
def unsure(ctx: JobContext[Any], p: Work) -> dict[str, Any]:
    _started("unsure", p)
    raise ToolOutcomeUnknown(f"the call timed out ({p.note})")


@app.job("broken", payload=Work, **LEASE)
def broken(ctx: JobContext[Any], p: Work) -> dict[str, Any]:
    _started("broken", p)
    raise PermanentError(f"cannot do {p.note}")
