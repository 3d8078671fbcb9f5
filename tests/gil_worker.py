"""A real worker process whose handler holds the GIL (``python tests/gil_worker.py``).

Its one job class, ``hog``, runs one CPU-bound C call that never releases the GIL
for ``hold`` seconds (a regex whose backtracking doubles with each character: the
``re`` module keeps the GIL for a whole match), longer than its lease, so the
worker's heartbeat thread cannot run: the worker is late on every attempt. Then it
waits (releasing the GIL) until it is told to stop, as a handler does between its
steps. Environment: ``AWS_ENDPOINT_URL``, ``SQS_LEASE_PREFIX``, ``WORKER_NAME``.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import BaseModel

from sqs_lease import App, JobContext

app = App()

_BACKTRACKS = re.compile(r"(a+)+$")


class Hog(BaseModel):
    hold: float = 8.0


def hold_the_gil(seconds: float) -> float:
    """One match of at least ``seconds`` (wall time), the GIL held all along; grown a
    character at a time (each doubles the work), so no machine is too fast for it."""
    n = 12
    while n < 64:  # bounded: 2**64 steps is never reached
        began = time.perf_counter()
        _BACKTRACKS.match("a" * n + "!")
        took = time.perf_counter() - began
        if took >= seconds:
            return took
        n += 1
    raise RuntimeError("the regex never took long enough")


@app.job(
    "hog",
    payload=Hog,
    lease_seconds=4,
    heartbeat_seconds=1.0,
    jitter_seconds=0.5,
    missed_heartbeats=2,
    max_attempts=1,
)
def hog(ctx: JobContext[Any], p: Hog) -> dict[str, Any]:
    ctx.note("hog_started")
    held = hold_the_gil(p.hold)
    ctx.note("hog_held", seconds=round(held, 3))
    ctx.wait(120.0)  # until told to stop (a hang guard): the GIL released meanwhile
    return {"held": round(held, 3)}


if __name__ == "__main__":
    from worker_helpers import serve_as_script_worker

    raise SystemExit(serve_as_script_worker(app))
