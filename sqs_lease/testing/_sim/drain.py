"""The end of a run: which jobs the drain waits for, and the checks once it is over.

The run drains once every job of the plan reached a final state (and the last one
was submitted), then settles a while; what is left is judged against the tables
and the queues as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .resources import JOBS

if TYPE_CHECKING:
    from .world import World


def finished(world: World) -> int:
    """Jobs the drain waits no more for: finished ones and (unreadable_records) the
    ones an outside writer edited, which are the operator's."""
    if not world._edited:
        return len(world.checker.final_jobs)
    return len(world.checker.final_jobs | world._edited)


def stranded(world: World, records: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """Jobs whose record is ``queued`` and no message (queue or DLQ) names them."""
    named = {m.body for url in (world.queue_url, world.dlq_url) for m in world.sqs.live(url)}
    out = []
    for job_id, item in records.items():
        if item is None or item["state"]["S"] != "queued":
            continue
        if not any(f'"job_id":"{job_id}"' in body for body in named):
            out.append(job_id)
    return out


def stuck_detail(world: World, records: Mapping[str, Mapping[str, Any] | None]) -> dict[str, str]:
    out: dict[str, str] = {}
    for job_id in records:
        where = []
        for url, name in ((world.queue_url, "queue"), (world.dlq_url, "dlq")):
            for m in world.sqs.live(url):
                if f'"job_id":"{job_id}"' in m.body:
                    state = "in flight" if world.sqs.in_flight(m) else "visible"
                    where.append(f"{name} {m.message_id} {state} receives={m.receive_count}")
        out[job_id] = "; messages: " + (", ".join(where) if where else "none")
    return out


def check_end(world: World) -> None:
    """The end-of-run checks (when no step broke an invariant), then every violation
    in the log."""
    checker = world.checker
    if not checker.violations:
        checker.now = world.now
        # unreadable_records: a job whose record an outside writer made unreadable
        # is the operator's (its message went to the DLQ as poison): not checked
        records = {
            jp.job_id: world.ddb.get(JOBS, {"job_id": {"S": jp.job_id}})
            for jp in world.plan.job_plans
            if jp.job_id not in world._edited
        }
        left = stranded(world, records)
        # first: a stranded record that a half-done resolution left is named as such
        checker.half_resolutions(records, left)
        checker.finish(records, stuck_detail(world, records), left)
        checker.oversize_ended(records, world.oversize_returned)
        from . import lambdas

        lambdas.finish(world, records)  # lambda
    for v in checker.violations:
        world.record("checker", "violation", {"name": v.name, "message": v.message})
