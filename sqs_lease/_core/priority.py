"""Priorities: two queues, and the order a worker receives from them.

A job is submitted ``interactive`` (a person is waiting) or ``batch`` (the
default). Each level has its own SQS queue (``PREFIX-jobs-interactive`` and
``PREFIX-jobs``, one DLQ); SQS has no priority within a queue, so the order is
the worker's receive order. The rule (:func:`receive_order`) is a weighted round
robin over the levels: of every ``sum(weights)`` receives, the interactive queue
is asked first ``weights[0]`` times and the batch queue first ``weights[1]``
times. A receive takes from the first queue of its turn that has messages, and
long-polls the interactive queue when none has. So interactive work is served
first whenever it is there, and batch work still gets the first pick of at least
one receive in ``sum(weights)``: it is never starved.

A short poll (no wait) is not proof that a queue is empty: SQS answers it from a
sample of its servers, and a queue holding only a few messages may answer empty
while they wait ("you might not receive any messages in a particular
ReceiveMessage response", the ReceiveMessage reference). A long poll asks every
server. So each level is long-polled at least once in every ``sum(weights)``
receives: the highest at the end of every receive that found nothing, every lower
level on its own turn (first in the order) for :data:`LOWER_POLL_SECONDS`. A
message on any level is therefore received within one round of receives, however
few wait; the other asks stay short polls.
A claim does not care which queue a message came from (the record's send id
decides). The record remembers an interactive job (``priority``), so a re-send (a
sweep, a resume, a retry, a resolve: ``sweeping.home_queue``) goes back to its queue;
a DLQ redrive moves messages to the batch queue, where they still run, at batch
priority.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from .calls import Flow
from .messages import Delivery, Poison, receive_flow

Priority = Literal["interactive", "batch"]
PRIORITIES: tuple[Priority, ...] = ("interactive", "batch")
WEIGHTS: tuple[int, ...] = (3, 1)
"""Receives that ask each level first, per round (interactive, batch)."""

LOWER_POLL_SECONDS = 1
"""The wait of a lower level's long poll on its own turn: SQS's shortest long poll,
which asks every server (a short poll samples some) and answers as soon as a
message is there. An idle worker's interactive work waits at most this much more,
once a round."""


def receive_order(turn: int, weights: Sequence[int] = WEIGHTS) -> list[int]:
    """The levels (indexes, highest first) in the order receive ``turn`` asks them."""
    if not weights or any(w < 1 for w in weights):
        raise ValueError(f"weights={list(weights)!r}: every level needs a weight of 1 or more")
    k = turn % sum(weights)
    first = 0
    for i, w in enumerate(weights):
        if k < w:
            first = i
            break
        k -= w
    return [first, *(i for i in range(len(weights)) if i != first)]


def receive_prioritized_flow(
    *,
    queue_urls: Sequence[str],
    turn: int,
    max_messages: int,
    wait_seconds: int,
    visibility: int,
    weights: Sequence[int] = WEIGHTS,
) -> Flow[list[Delivery | Poison]]:
    """One receive over the levels' queues (highest first in ``queue_urls``): the first
    queue of this turn's order with messages, else a long poll on the highest. A
    lower level asked first on its turn is long-polled (:data:`LOWER_POLL_SECONDS`),
    the rest short-polled (see the module). Every message names the queue it came
    from (its visibility and delete go there)."""
    levels = len(queue_urls)
    # One queue (no priorities): only the long poll below, its messages untagged.
    order = [] if levels == 1 else receive_order(turn, weights[:levels])
    for level in order:
        own_turn = level == order[0] and level > 0
        got = yield from receive_flow(
            queue_url=queue_urls[level],
            max_messages=max_messages,
            # A worker configured without long polls (wait 0) keeps its short polls.
            wait_seconds=min(LOWER_POLL_SECONDS, wait_seconds) if own_turn else 0,
            visibility=visibility,
            tag_queue=True,
        )
        if got:
            return got
    return (
        yield from receive_flow(
            queue_url=queue_urls[0],
            max_messages=max_messages,
            wait_seconds=wait_seconds,
            visibility=visibility,
            tag_queue=levels != 1,
        )
    )


__all__ = [
    "LOWER_POLL_SECONDS",
    "PRIORITIES",
    "WEIGHTS",
    "Priority",
    "receive_order",
    "receive_prioritized_flow",
]
