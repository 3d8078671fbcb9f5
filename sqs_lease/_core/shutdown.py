"""A stopping worker, decided once for every shell (thread, async, the simulator's).

``received_flow``: a message the receive loop got is counted, and started, or, when
the worker stops, handed back unclaimed at once (``release_unstarted_flow``).

``shutdown_order``: the steps of a shutdown, in their order (tell, wait the grace,
hand back what is still held with ``shutdown_flow``, wait for the attempts writing
their own end, delete every ended job's message). It yields what the shell must do
(:data:`ShutdownStep`); a shell only performs each step its own way (joins threads,
awaits tasks, sleeps in simulated time) and drives the flows it is given. The
instruction contract of the flows is the attempt flow's (:mod:`sqs_lease._core.attempt`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from .attempt import flush_deletes_flow
from .calls import Flow, Invoke
from .deploy import SHUTDOWN_RELEASE_MARGIN
from .endwrites import release_flow
from .env import ActFor, AttemptEnv, nonce_of, now_of
from .messages import Delivery, Poison

# ----------------------------------------------------------------------------- receiving


def received_flow(env: AttemptEnv, item: Delivery | Poison) -> Flow[bool]:
    """A message the receive loop got: counted; True when the shell starts its attempt.
    One received while the worker stops (its book was told, ``LeaseBook.request_stop``
    or ``stopping``) is not started: handed back unclaimed at once."""
    env.tally("received", 1)
    if not env.book.stopping:
        return True
    yield from release_unstarted_flow(env, item)
    return False


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


# ----------------------------------------------------------------------------- the order


@dataclass(frozen=True)
class WaitAttempts:
    """Wait up to ``seconds`` for the attempts' own tasks (threads, tasks) to end."""

    seconds: float


@dataclass(frozen=True)
class WaitEndWrites:
    """Wait up to ``seconds`` while ``writing()`` (attempts whose handler ended and whose
    end write is under way: ``LeaseBook.ending``) is not 0; poll it, or be woken."""

    seconds: float
    writing: Callable[[], int]


@dataclass(frozen=True)
class Drive:
    """Drive ``flow`` to its end; ``kind`` names whose work it is (the simulator's
    checker labels the calls with it)."""

    flow: Flow[Any]
    kind: Literal["release", "deletes"]


ShutdownStep: TypeAlias = WaitAttempts | WaitEndWrites | Drive


def shutdown_order(env: AttemptEnv, *, asked: bool, grace: float) -> Iterator[ShutdownStep]:
    """A worker's shutdown, once its receive loop ended: what the shell does, in order.

    ``asked``: the worker was told to stop (not just done: ``max_messages`` or
    ``idle_exit`` let the handlers finish). Then every attempt is told first. The
    handlers get ``grace`` seconds; what is still held is handed back
    (``shutdown_flow``). Attempts whose handler ended within the grace finish their own
    end write (a release, a commit) before the worker stops: counted, not cut off;
    and their deletes are queued as those writes land, so every ended job's message
    is deleted last (a worker killed first leaves them to their redelivery, deleted
    at the claim)."""
    if asked:
        env.book.request_stop()
    yield WaitAttempts(grace)
    yield Drive(shutdown_flow(env), "release")
    yield WaitEndWrites(SHUTDOWN_RELEASE_MARGIN / 2, env.book.ending)
    yield Drive(flush_deletes_flow(env, force=True), "deletes")


__all__ = [
    "Drive",
    "ShutdownStep",
    "WaitAttempts",
    "WaitEndWrites",
    "received_flow",
    "release_unstarted_flow",
    "shutdown_flow",
    "shutdown_order",
]
