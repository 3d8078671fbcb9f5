"""A real worker process for the group-cancel tests (``python tests/group_worker.py``).

Its one job class, ``session_step``, stands for one step of an agent session: it
notes ``step_started`` and then waits (``ctx.wait``) until its attempt is told to
stop or its gate file appears, then returns. Environment: ``AWS_ENDPOINT_URL``,
``SQS_LEASE_PREFIX``, ``WORKER_NAME``, ``GATE_DIR``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import BaseModel

from sqs_lease import App, JobContext

app = App()


class Step(BaseModel):
    n: int


@app.job(
    "session_step",
    payload=Step,
    lease_seconds=4,
    heartbeat_seconds=1.0,
    jitter_seconds=0.5,
    missed_heartbeats=2,
    max_attempts=3,
)
def session_step(ctx: JobContext[Any], p: Step) -> dict[str, Any]:
    ctx.note("step_started", n=p.n)
    gate = Path(os.environ["GATE_DIR"]) / ctx.job_id
    for _ in range(1200):  # hang guard: at most about two minutes
        if gate.exists():
            break
        ctx.wait(0.1)  # raises JobCancelled once the heartbeat sees the cancel
    return {"n": p.n, "by": os.environ.get("WORKER_NAME", "?")}


if __name__ == "__main__":
    from worker_helpers import serve_as_script_worker

    raise SystemExit(serve_as_script_worker(app))
