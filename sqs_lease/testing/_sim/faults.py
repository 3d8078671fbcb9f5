"""The faults a run injects: the drawn fault events (a pause, a crash, a partition, a
slow window, a shutdown, an operator's cancel, a poison message) and the widened
world's scheduled ones (a rolling deploy, a stray class, an unreadable record).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._core.cancelling import cancel_flow
from ..._core.messages import message_body
from .invariants import Origin
from .plan import FAULT_KINDS
from .resources import JOB_CLASS, JOB_CLASS_V2, JOBS
from .tasks import drive_plain

if TYPE_CHECKING:
    from .world import World


def deploy(world: World) -> None:
    """mixed_versions: the rolling deploy reaches the old workers (graceful stop;
    they restart on the new version)."""
    for w in list(world.workers.values()):
        if w.alive and not w.stopping and JOB_CLASS_V2 not in w.classes:
            world.record("world", "deploy", {"worker": w.id})
            w.begin_shutdown()


def stray(world: World) -> None:
    """mixed_versions: a message names a submitted job with the other class (an old
    producer, a hand-sent message): poison, it must claim nothing."""
    if not world.chaos.active:
        return
    ids = sorted(world.job_plans)
    job_id = world.chaos.wide.choice(ids)
    record = world.ddb.get(JOBS, {"job_id": {"S": job_id}})
    if record is None:
        return
    cls = record["job_class"]["S"]
    other = JOB_CLASS if cls == JOB_CLASS_V2 else JOB_CLASS_V2
    world.chaos.count("stray_class_message")
    world.record("faults", "stray_class_message", {"job_id": job_id, "job_class": other})
    world.sqs.now = world.now
    world.sqs.send(world.sqs.queues[world.queue_url], message_body(job_id, other))


def _cancel(world: World) -> None:
    """An operator cancels a job (``cancel_flow``), whatever state it is in."""
    job_id = world.chaos.choice(sorted(world.job_plans))
    flow = cancel_flow(
        world.jobs_req,
        job_id=job_id,
        reason="operator (simulated)",
        wall_now=world.operator.wall(),
    )
    origin = Origin("operator", f"cancel-{job_id}", "operator")
    world.operator.spawn(f"cancel-{job_id}", drive_plain(world, world.operator, flow, origin))


def _poison(world: World) -> None:
    """A message no worker can read, or one naming a job nobody submitted."""
    q = world.sqs.queues[world.queue_url]
    world.sqs.now = world.now
    if world.chaos.chance(0.5):
        world.sqs.send(q, "{not json")
    else:
        world.sqs.send(q, message_body(f"ghost-{world.seq}", JOB_CLASS))


def fault(world: World) -> None:
    """One drawn fault event (its kind by the plan's weights), on a live worker."""
    kinds = list(FAULT_KINDS)
    weights = [world.plan.fault_weights.get(k, 0.0) for k in kinds]
    kind = world.chaos.rng.choices(kinds, weights)[0]
    if not world.chaos.active:
        return
    live = [w for w in world.workers.values() if w.alive and not w.stopping]
    room = world.plan.cutoff - world.now
    if kind == "cancel":
        world.chaos.count(kind)
        world.record("faults", kind, {})
        _cancel(world)
        return
    if kind == "poison_message":
        world.chaos.count(kind)
        world.record("faults", kind, {})
        _poison(world)
        return
    if not live:
        return
    w = world.chaos.choice(live)
    L = world.plan.lease
    info: dict[str, Any] = {"worker": w.id}
    if kind == "pause":
        d = min(world.chaos.uniform(0.5, 2.5 * L), max(0.1, room))
        w.paused_until = max(w.paused_until, world.now + d)
        info["seconds"] = round(d, 3)
    elif kind == "crash":
        delay = world.chaos.uniform(1.0, 60.0)
        info["restart_after"] = round(delay, 3)
        world.worker_exited(w, restart_after=delay)
    elif kind in ("partition_both", "partition_oneway"):
        d = min(world.chaos.uniform(1.0, 2.0 * L), room)
        services = world.chaos.choice(
            [
                ("dynamodb", "sqs", "target"),
                ("dynamodb",),
                ("sqs",),
                ("target",),
                ("dynamodb", "sqs"),
            ]
        )
        mode = "both" if kind == "partition_both" else "response"
        w.partitions.append((world.now, world.now + d, mode, services))
        info.update(seconds=round(d, 3), services=list(services))
    elif kind == "slow_window":
        d = min(world.chaos.uniform(5.0, 60.0), room)
        hi = world.chaos.uniform(1.0, 10.0)
        w.slow.append((world.now, world.now + d, hi))
        info.update(seconds=round(d, 3), max_extra=round(hi, 3))
    elif kind == "shutdown":
        w.begin_shutdown()
    world.chaos.count(kind)
    world.record("faults", kind, info)


# ------------------------------------------------------------------ the run


def _make_unreadable(world: World, seconds: float) -> None:
    """unreadable_records: an outside writer (a hand edit, a newer version) gives a
    running job's record a state this version does not know, and puts it back
    ``seconds`` later. Written around the API: no worker request is involved."""
    table = world.ddb.items[JOBS]
    running = sorted(
        (str(item["job_id"]["S"]), key)
        for key, item in table.items()
        # (the workers' liveness records share the table and carry no state)
        if item.get("state", {}).get("S") == "running"
    )
    if not running:
        return
    job_id, key = world.chaos.wide14.choice(running)
    world._edited.add(job_id)
    saved = table[key]["state"]
    table[key] = {**table[key], "state": {"S": "archived"}}
    if world.chaos.active:
        world.chaos.count("record_unreadable")
    world.record("world", "record_unreadable", {"job_id": job_id, "seconds": seconds})

    def restore() -> None:
        item = table.get(key)
        if item is not None and item.get("state") == {"S": "archived"}:
            table[key] = {**item, "state": saved}
            world.record("world", "record_readable", {"job_id": job_id})

    world.at(world.now + seconds, restore)


def schedule_unreadable(world: World) -> None:
    """unreadable_records: when the outside writer edits a running job's record."""
    for when, seconds in world.plan.wide.unreadable:
        world.at(when, lambda d=seconds: _make_unreadable(world, d))  # type: ignore[misc]
