"""A late worker's hand-back: the heartbeat let a confirmed lease run out, so the job
goes back to ``queued`` with its attempt given back (or charged, the third time at one
stage: :func:`~sqs_lease._core.timing.late_charged`); and how long a delivery of the
same job waits while that hand-back is under way (:func:`hand_back_defer`)."""

from __future__ import annotations

import math

from .calls import Emit, Flow, Invoke
from .endwrites import release_flow
from .env import ActFor, AttemptEnv, nonce_of, now_of
from .leasebook import HAND_BACK_STALE, Held
from .timing import LATE_HANDBACK_LIMIT, beat_due, late_charged


def hand_back_late_flow(env: AttemptEnv, held: Held, now: float) -> Flow[None]:
    """The worker's own heartbeat let a confirmed lease run out (it was overloaded,
    paused, or its loop was held): the job did nothing wrong, so the attempt is not
    charged. The fenced release puts the record back to ``queued`` and gives back
    the attempt its claim counted (only while the token is still this attempt's:
    a claim that already took the job over keeps its own count), and makes the
    message visible at once. The record counts its late hand-backs: one that
    :func:`~sqs_lease._core.timing.late_charged` charges keeps the attempt and is
    told as ``worker_late_charged``, naming the job's class and stage."""
    lease, job = held.lease, held.job
    late_by = round(now - beat_due(lease), 3)
    charged = late_charged(job.late_handbacks)
    yield Emit(
        "lease_dropped_late",
        {
            "job_id": lease.job_id,
            "token": lease.token,
            "late_by": late_by,
            "lease_left": round(lease.deadline - now, 3),
            "late_handbacks": job.late_handbacks + 1,
            "charged": charged,
        },
    )
    if charged:
        yield Emit(
            "worker_late_charged",
            {
                "job_id": lease.job_id,
                "job_class": job.job_class,
                "stage": job.stage,
                "token": lease.token,
                "late_handbacks": job.late_handbacks + 1,
                "limit": LATE_HANDBACK_LIMIT,
                "late_by": late_by,
                "fix": "this job's worker was late every time it ran it: a handler that "
                "holds the GIL (a long C call) or the event loop stops the heartbeat; "
                "release it (run the work in a subprocess or a thread that releases "
                "the GIL) or raise the class's lease_seconds",
            },
        )
    reason = (
        f"worker late {job.late_handbacks + 1} times running this job at this stage: "
        "attempt charged (its handler may hold the GIL or the loop past its lease)"
        if charged
        else "worker late: its heartbeat fell behind; attempt not charged"
    )
    yield Invoke("act_for", ActFor("release", {lease.job_id: lease.token}))
    try:
        t = yield from now_of(env)
        nonce = yield from nonce_of(env)  # the hand-back's own, not the lapsed attempt's
        released = yield from release_flow(
            env.table,
            queue_url=env.queue_url,
            held=[(held.job, held.delivery)],
            worker_id=env.worker_id,
            wall_now=t.wall,
            reason=reason,
            nonce=nonce,
            lapsed=() if lease.handle_ours(t.mono) else (held.delivery.receipt_handle,),
            late=True,
            charged=charged,
        )
    finally:
        # However the release ended (even a driver failure), the hand-back is over:
        # a claim of the job waits for it (LeaseBook.before_claim), never forever.
        env.book.gave_back([held], "worker late")
    yield Invoke("act_for", ActFor("heartbeat"))
    env.tally("released_late", released)


HAND_BACK_DEFER = 1
"""The shortest wait, in seconds, of a delivery (its visibility) while this worker's
hand-back of the same job's lapsed attempt is under way (:meth:`LeaseBook.before_claim`)."""


def hand_back_defer(age: float) -> int:
    """Seconds a delivery waits behind a hand-back under way for ``age`` seconds.

    Each wait is a receive, and SQS counts every receive toward the queue's
    ``maxReceiveCount``: a fixed short wait behind a slow hand-back (calls timing
    out on an overloaded or partitioned worker) would spend the job's receives and
    let SQS move a healthy job to the DLQ. Waiting as long as the hand-back has
    already taken (at least :data:`HAND_BACK_DEFER`, at most until
    :data:`HAND_BACK_STALE`) bounds the receives one hand-back costs to about
    log2(HAND_BACK_STALE) + 2 (8), whatever it takes.
    """
    left = HAND_BACK_STALE - age
    return max(HAND_BACK_DEFER, math.ceil(min(age, left)))


__all__ = [
    "HAND_BACK_DEFER",
    "hand_back_defer",
    "hand_back_late_flow",
]
