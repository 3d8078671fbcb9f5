"""An agent's tool calls on a long-running worker, locally, in one command:

    python examples/agent/run_local.py

Starts the embedded emulator (moto, on 127.0.0.1) and the fenced payment service,
submits one agent session's tool calls (``examples/agent/tools.py``: a quick search,
OCR, a browse that runs for many leases, an ERP export in three stages, the same
invoice paid twice with the first answer lost), runs a worker on ``tools.app``
until every call has ended, and reports how each call ended. Exits 0 when every
call succeeded, the browse's lease was extended while it ran, and the invoice was
charged exactly once. ``--endpoint-url URL --prefix P`` uses an emulator already
running instead. The same worker in a container: ``SQS_LEASE_APP=examples.agent.tools:app
sqs-lease worker`` (see examples/ecs/).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from examples.agent import tools
from examples.agent.session import (
    all_done,
    journal_events,
    local_aws,
    options,
    report,
    say,
    submit_session,
)
from sqs_lease import Worker, WorkerStats

HANG_GUARD = 180.0


def main(argv: Sequence[str] | None = None) -> int:
    args = options(argv, "an agent's tool calls on a long-running worker, locally")
    with local_aws(args) as settings, journal_events() as journal:
        session = submit_session(settings)
        worker = Worker(tools.app, settings, concurrency=8, receive_wait=1)
        say("worker running (tools.app: the same handlers the Lambda example runs)")
        runs: list[WorkerStats] = []
        thread = threading.Thread(target=lambda: runs.append(worker.run()), name="worker")
        thread.start()
        # Until every call has ended (a retry's backoff included), not until a quiet
        # moment: a busy machine can make a retry wait longer than any idle limit.
        deadline = time.monotonic() + HANG_GUARD
        while not all_done(session) and time.monotonic() < deadline:
            time.sleep(0.5)
        worker.stop()  # as SIGTERM would: nothing is running by now
        thread.join(timeout=HANG_GUARD)
        stats = runs[0] if runs else None
        if stats is not None:
            say(f"worker stopped: {stats.committed} committed, {stats.retried} retried")
        return 0 if report(session, journal) else 1


if __name__ == "__main__":
    raise SystemExit(main())
