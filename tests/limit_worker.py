"""A real worker process for the concurrency-limit tests (``python tests/limit_worker.py``).

Its one job class, ``browse``, stands for a tool with a fleet-wide limit (2 jobs at
once): each job makes one call to a fake target that counts the calls in flight
(``TARGET``); the call lasts the payload's ``hold`` seconds (``HOLD_LONG=1``: up to
a minute, so a test can kill the worker while it holds its slots). The app's
tenant limit is ``TENANT_LIMIT`` (unset: none). Environment: ``AWS_ENDPOINT_URL``,
``SQS_LEASE_PREFIX``, ``WORKER_NAME``, ``TARGET``.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import BaseModel

from sqs_lease import App, JobContext

CLASS_LIMIT = 2

app = App(tenant_limit=int(os.environ["TENANT_LIMIT"]) if os.environ.get("TENANT_LIMIT") else None)


class Browse(BaseModel):
    n: int
    hold: float = 0.3
    who: str = ""  # the job's tenant, for the target's count (the record has its own)


@app.job(
    "browse",
    payload=Browse,
    lease_seconds=4,
    heartbeat_seconds=1.0,
    jitter_seconds=0.5,
    missed_heartbeats=2,
    max_attempts=5,
    concurrency_limit=CLASS_LIMIT,
)
def browse(ctx: JobContext[Any], p: Browse) -> dict[str, Any]:
    hold = 60.0 if os.environ.get("HOLD_LONG") else p.hold
    ctx.note("browse_started", n=p.n)
    url = f"{os.environ['TARGET']}/call?job={ctx.job_id}&who={p.who}&hold={hold}"
    with urllib.request.urlopen(url, timeout=90) as answer:  # the tool call, held open
        answer.read()
    return {"n": p.n, "by": os.environ.get("WORKER_NAME", "?")}


if __name__ == "__main__":
    from worker_helpers import serve_as_script_worker

    raise SystemExit(serve_as_script_worker(app))
