"""A real worker process for the duplicate-delivery tests (``python tests/dup_worker.py``).

Its one job class, ``long``, stands for an hour of work in a few seconds: the handler
records that it ran (a line in ``RUNS``, with the worker's name), then works until the
file ``GATE`` exists (checking its lease as it goes), and returns who ran it.
Environment: ``AWS_ENDPOINT_URL``, ``SQS_LEASE_PREFIX``, ``WORKER_NAME``, ``RUNS``,
``GATE``; ``SQS_LEASE_SHELL``: ``thread`` (default) or ``async``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import BaseModel

from sqs_lease import App, JobContext

LEASE = 8
HEARTBEAT = 2.0

app = App()


class Work(BaseModel):
    n: int


@app.job(
    "long",
    payload=Work,
    lease_seconds=LEASE,
    heartbeat_seconds=HEARTBEAT,
    jitter_seconds=1.0,
    missed_heartbeats=2,
    max_attempts=5,
)
def long(ctx: JobContext[Any], p: Work) -> dict[str, Any]:
    name = os.environ.get("WORKER_NAME", "?")
    with open(os.environ["RUNS"], "a") as runs:
        runs.write(f"{name}\n")
    gate = Path(os.environ["GATE"])
    deadline = time.monotonic() + 300  # a hang guard only
    while not gate.exists() and time.monotonic() < deadline:
        ctx.check()  # a fenced-out attempt stops here
        time.sleep(0.1)
    return {"n": p.n, "by": name}


def main() -> int:
    from sqs_lease import AsyncWorker, Settings, Worker
    from sqs_lease._journal import configure_stderr

    configure_stderr()
    shell = {"thread": Worker, "async": AsyncWorker}[os.environ.get("SQS_LEASE_SHELL", "thread")]
    # One job at a time: a worker running the job receives nothing more, so a copy of
    # its message goes to the other worker.
    worker = shell(
        app,
        Settings.from_env(),
        worker_id=os.environ["WORKER_NAME"],
        concurrency=1,
        receive_wait=1,
        shutdown_grace=5,
    )
    worker.install_signal_handlers()
    worker.run(idle_exit=float(os.environ.get("IDLE_EXIT", "120")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
