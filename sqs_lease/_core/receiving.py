"""When a worker's receive loop asks SQS for messages, and for how many: the fill
wait and the batching window (:class:`ReceivePacer`), one state for every shell and
the simulator. Pure arithmetic on the caller's clock readings: no instruction is yielded.
"""

from __future__ import annotations

from .messages import SQS_BATCH, receive_batch

RECEIVE_FILL_WAIT = 0.5
"""Seconds a worker with some free slots, but fewer than a full receive, waits for
more to free up before it asks for what it has."""


def receive_size(
    free: int, concurrency: int, left: int | None, waited: float, *, batch: int = SQS_BATCH
) -> int:
    """How many messages a worker asks for now (0: wait for more free slots).

    ``free``: slots open now (of ``concurrency``); ``left``: messages it may still
    receive (None: no bound); ``waited``: seconds since it first had a free slot
    but not enough. A receive asks for a full batch (10, or the concurrency, or
    what is left, whichever is least) once that many slots are free, so short jobs
    cost 1/10 of a receive each, not one receive per freed slot; with fewer free
    it waits for more, at most :data:`RECEIVE_FILL_WAIT`, then asks for what it
    can hold. It never holds more than ``concurrency`` jobs. ``batch``: the most one
    receive returns (1 from a FIFO queue, which then never waits for more slots).
    """
    if free <= 0:
        return 0
    want = free if left is None else min(free, left)
    full = min(batch, concurrency, batch if left is None else left)
    if want <= 0:
        return 0
    if want >= full or waited >= RECEIVE_FILL_WAIT:
        return want
    return 0


RECEIVE_WINDOW_MAX = 20.0
"""The longest batching window a worker may be given (seconds), as long as a long poll."""


class ReceivePacer:
    """When a worker's receive loop asks for messages, and for how many: one state for
    every shell and the simulator (times are the caller's monotonic seconds).

    Two waits keep receives near 1/10 of a job each. The *fill wait*
    (:func:`receive_size`): with fewer slots free than a full receive, wait up to
    :data:`RECEIVE_FILL_WAIT` for more. The *batching window* (``window`` seconds,
    0 = off, like Lambda's ``MaximumBatchingWindowInSeconds``): a receive that came
    back short but not empty means messages trickle in, one per long poll; waiting
    ``window`` before the next receive lets up to a batch gather, at the cost of up
    to ``window`` of latency for a message that arrives meanwhile. Neither wait
    touches a lease: a message not yet received has none.
    """

    def __init__(self, concurrency: int, *, batch: int = SQS_BATCH, window: float = 0.0) -> None:
        self.concurrency = concurrency
        self.batch = batch
        self.window = window
        self._short_since: float | None = None  # a slot free, but not a full receive's
        self._resume_at: float | None = None  # the batching window's end

    @classmethod
    def for_queue(cls, concurrency: int, queue_url: str, *, window: float = 0.0) -> ReceivePacer:
        """The pacer of a worker receiving from ``queue_url``: a FIFO queue's receive
        holds one message, so a free slot is a full receive (no fill wait)."""
        return cls(concurrency, batch=receive_batch(queue_url), window=window)

    def want(self, now: float, free: int, left: int | None = None) -> int:
        """How many messages to ask for now (0: wait; see :meth:`pause`). ``free``:
        slots open now, after the heartbeat's backpressure; ``left``: messages it may
        still receive (None: no bound)."""
        if self._resume_at is not None and now < self._resume_at:
            return 0
        self._resume_at = None
        if free <= 0:
            self._short_since = None
        elif self._short_since is None:
            self._short_since = now
        waited = 0.0 if self._short_since is None else now - self._short_since
        want = receive_size(free, self.concurrency, left, waited, batch=self.batch)
        if want:
            self._short_since = None
        return want

    def pause(self, now: float, free: int) -> float:
        """After :meth:`want` said 0: how long until it may say more, at most (a freed
        slot may end the wait sooner; ``free`` as given to :meth:`want`)."""
        if self._resume_at is not None and now < self._resume_at:
            return self._resume_at - now
        if free <= 0 or self._short_since is None:
            return 1.0
        return max(0.01, RECEIVE_FILL_WAIT - (now - self._short_since))

    def received(self, now: float, asked: int, got: int) -> None:
        """A receive that asked for ``asked`` messages came back with ``got``: a short,
        non-empty one opens the batching window. An empty one does not (its long poll
        already waited), nor a full one (more may be waiting now): full is 10, the
        most SQS returns, when it asked for more."""
        if self.window > 0 and 0 < got < min(asked, SQS_BATCH):
            self._resume_at = now + self.window


__all__ = [
    "RECEIVE_FILL_WAIT",
    "RECEIVE_WINDOW_MAX",
    "ReceivePacer",
    "receive_size",
]
