"""The producer: it submits each job as a user's code would, with the real ``submit_flow``.

Its calls may be slow, lose their answer and be retried by its SDK (a duplicate
message); it never pauses nor crashes, and resubmits on error. Some worlds add a
producer that dies before the send, or more producers of the same job id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._core.calls import Call
from ..._core.sending import submit_flow
from ..._jobs import canonical_json, payload_hash
from .invariants import Origin
from .tasks import drive_plain

if TYPE_CHECKING:
    from .world import World


def submit(world: World, job_id: str, tries: int = 1, producer: str = "") -> None:
    """Submit ``job_id`` as the producer would (``producer``: concurrent_submits'
    extra producers, "p1", "p2": their own send ids and tasks)."""
    text = canonical_json({"n": int(job_id.rsplit("-", 1)[1])})
    jp = world.job_plans[job_id]
    flow: Any = submit_flow(
        world.jobs_req,
        queue_url=world.queue_url,
        job_id=job_id,
        job_class=jp.job_class,
        payload_json=text,
        payload_hash=payload_hash(text),
        wall_now=world.producer.wall(),
        send_id=f"{job_id}{'.' + producer if producer else ''}.{tries}",
        resend_after=resend_after(world),
        # staged: submitted with the app, the record and message name the first stage
        stage=jp.stages[0][0] if jp.stages else None,
        # fifo: its session, stage count, interleave_stages
        **(world.fifo.submit_args(jp) if world.fifo is not None else {}),
        tenant=world.planned.tenant(job_id) if world.planned is not None else None,  # plans
    )
    if jp.producer_dies:
        flow = _dies_before_send(world, flow, job_id)
    name = f"submit-{job_id}" + (f"-{producer}" if producer else "")
    origin = Origin("producer", name, "producer")

    def again() -> None:  # a producer resubmits (submit is idempotent by job id)
        if world.producer_backoff is not None:  # a fleet's producers back off, and persist
            world.chaos.count("producer_retry")
            delay = world.producer_backoff(tries)
            world.at(world.now + delay, lambda: submit(world, job_id, tries + 1, producer))
        elif tries < 30:
            world.at(world.now + 1.0, lambda: submit(world, job_id, tries + 1, producer))

    world.producer.spawn(name, drive_plain(world, world.producer, flow, origin, again))


def resend_after(world: World) -> float:
    """As the real producer (``submit_flow``'s default grace) where the workers
    sweep stranded records; without a sweep, a resubmission must take the send
    over at once or a record whose first send died is never sent."""
    sweep = world.plan.sweep
    return sweep.grace if sweep is not None else 0.0


def _dies_before_send(world: World, flow: Any, job_id: str) -> Any:
    """producer_death: the submission stops where the message would be sent (the
    record is written; the process that wrote it is gone, nobody resubmits)."""
    instr = next(flow)
    while True:
        if isinstance(instr, Call) and instr.op == "SendMessage":
            flow.close()
            if world.chaos.active:
                world.chaos.count("producer_died")
            world.record("producer", "producer_died", {"job_id": job_id})
            return None
        out = yield instr
        try:
            instr = flow.send(out)
        except StopIteration as stop:
            return stop.value


def schedule_extra_submits(world: World) -> None:
    """concurrent_submits: another producer of the same job id, milliseconds later:
    both may see the record without a sent message."""
    for jp in world.plan.job_plans:
        for k, delay in enumerate(jp.extra_submits, 1):

            def extra(j: str = jp.job_id, who: str = f"p{k}") -> None:
                if world.chaos.active:
                    world.chaos.count("concurrent_submit")
                submit(world, j, producer=who)

            world.at(jp.submit_at + delay, extra)
