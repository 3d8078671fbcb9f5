"""The hand-backs of a stopping worker: a message received while it stops
(``release_unstarted_flow``), and every attempt still held when the shutdown grace is
over (``shutdown_flow``). The instruction contract is the attempt flow's
(:mod:`sqs_lease._core.attempt`).
"""

from __future__ import annotations

from .calls import Flow, Invoke
from .endwrites import release_flow
from .env import ActFor, AttemptEnv, nonce_of, now_of
from .messages import Delivery, Poison

# ----------------------------------------------------------------------------- shutdown


def release_unstarted_flow(env: AttemptEnv, item: Delivery | Poison) -> Flow[None]:
    """A message received while the worker stops: handed back unclaimed at once."""
    if not isinstance(item, Delivery):
        return
    now = yield from now_of(env)
    released = yield from release_flow(
        env.table,
        queue_url=env.queue_url,
        held=[(None, item)],
        worker_id=env.worker_id,
        wall_now=now.wall,
        reason="shutdown",
        nonce="",  # nothing claimed: no record is written
    )
    env.tally("released", released)


def shutdown_flow(env: AttemptEnv) -> Flow[None]:
    """The shutdown grace is over: every attempt still held goes back to queued, at
    once (no claimed job leaves without a decision)."""
    left = env.book.let_go()
    if not left:
        return
    yield Invoke("act_for", ActFor("release", {h.job.job_id: h.lease.token for h in left}))
    now = yield from now_of(env)
    nonce = yield from nonce_of(env)  # the shutdown's own: no attempt takes it for its write
    released = yield from release_flow(
        env.table,
        queue_url=env.queue_url,
        held=[(h.job, h.delivery) for h in left],
        worker_id=env.worker_id,
        wall_now=now.wall,
        reason="shutdown: handler overran the grace period",
        nonce=nonce,
        lapsed=[h.delivery.receipt_handle for h in left if not h.lease.handle_ours(now.mono)],
    )
    env.tally("released", released)
    # Handed back, or found taken (release_flow journaled that loss): a late end
    # write of these attempts reports no second loss.
    env.book.gave_back(left, "shutdown")


# ----------------------------------------------------------------------------- sweep


__all__ = [
    "release_unstarted_flow",
    "shutdown_flow",
]
