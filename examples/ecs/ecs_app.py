"""The handlers the ECS example runs: an agent's tool calls as job classes.

``search`` is quick; ``summarize`` calls a model (its ``model``/``provider`` become
metric dimensions); ``export`` is a long call that checks its lease as it goes,
so a SIGTERM stops it at once and its job goes back to the queue.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from sqs_lease import App, JobContext

app = App()

# A short lease so the local run shows heartbeats; in production the defaults
# (30 s lease, 5 s heartbeat) or longer.
LEASE: dict[str, Any] = {
    "lease_seconds": 20,
    "heartbeat_seconds": 2.0,
    "jitter_seconds": 2.0,
    "missed_heartbeats": 3,
}


class Query(BaseModel):
    text: str


class Export(BaseModel):
    report: str
    pages: int = 50


@app.job("search", payload=Query, **LEASE)
def search(ctx: JobContext[Any], q: Query) -> dict[str, Any]:
    ctx.check()  # still ours? (raises if the lease was lost)
    return {"hits": len(q.text.split())}


@app.job("summarize", payload=Query, model="example-model-1", provider="example-ai", **LEASE)
def summarize(ctx: JobContext[Any], q: Query) -> dict[str, Any]:
    ctx.wait(0.5)  # the model call; wait() raises if the worker is told to stop
    return {"summary_words": min(12, len(q.text.split()))}


@app.job("export", payload=Export, **LEASE)
def export(ctx: JobContext[Any], e: Export) -> dict[str, Any]:
    for _page in range(e.pages):
        ctx.wait(0.2)  # one page; a SIGTERM raises WorkerShuttingDown here
        ctx.progress()
    return {"pages": e.pages}
