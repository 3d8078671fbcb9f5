"""Deletes of finished jobs' messages, batched over a short window.

A message whose job a fenced write ended (committed, failed, parked) needs only
to be deleted some time: it is no fence. Until it is, its visibility runs out
and SQS may deliver it again; that delivery meets a terminal record at its
claim (the claim's condition fails, ALL_OLD says ``succeeded``) and is deleted
then, its job never run again. So the worker keeps the receipt handles of ended
jobs for up to ``window`` seconds and deletes them 10 per DeleteMessageBatch:
0.1 requests per job instead of 1. A worker that dies with handles pending
loses nothing but the deletes; a shutdown flushes them
(``flush_deletes_flow(force=True)``), and a batch entry SQS refuses is
journaled and left for that redelivery. A DeleteMessageBatch names one queue,
so a worker reading several queues (priorities) batches each queue's handles
apart: a batch never mixes queues.

The batch is pure: no I/O, no clock (times are passed in); ``lock`` guards it
as the lease book's lock does (a ``threading.Lock`` for the thread worker).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .leasebook import Guard, NoLock

DELETE_BATCH = 10
"""SQS's DeleteMessageBatch limit (entries per call)."""

DELETE_WINDOW = 0.25
"""Default seconds a finished job's receipt handle may wait for a full batch."""


@dataclass(frozen=True)
class PendingDelete:
    """A finished job's message, to be deleted (``since``: when it was queued)."""

    receipt_handle: str
    job_id: str
    token: int | None
    since: float
    queue_url: str = ""  # the queue the message came from ("": the worker's own)


class DeleteBatch:
    """The receipt handles of ended jobs, waiting for a full batch or the window."""

    def __init__(
        self,
        window: float = DELETE_WINDOW,
        lock: Guard | None = None,
        on_add: Callable[[], None] | None = None,
    ) -> None:
        self.window = window
        self.lock: Guard = lock if lock is not None else NoLock()
        self._pending: list[PendingDelete] = []
        self._on_add = on_add  # a shell whose flusher sleeps until due wakes it

    def __len__(self) -> int:
        with self.lock:
            return len(self._pending)

    def add(
        self, receipt_handle: str, job_id: str, token: int | None, now: float, queue_url: str = ""
    ) -> bool:
        """Queue one message for deletion; True when its queue has a full batch."""
        with self.lock:
            self._pending.append(PendingDelete(receipt_handle, job_id, token, now, queue_url))
            full = sum(p.queue_url == queue_url for p in self._pending) >= DELETE_BATCH
        if self._on_add is not None:
            self._on_add()
        return full

    def due(self) -> float | None:
        """When the oldest pending delete must go (None: nothing pending)."""
        with self.lock:
            return self._pending[0].since + self.window if self._pending else None

    def take(self, now: float, *, force: bool = False) -> list[PendingDelete]:
        """The next batch to send now (empty: none is due): a full batch, or whatever
        waited ``window`` seconds, or with ``force`` (shutdown) whatever is pending.
        Taken entries are the caller's: two flushers never send the same one."""
        with self.lock:
            if not self._pending:
                return []
            oldest = self._pending[0]
            same = [p for p in self._pending if p.queue_url == oldest.queue_url]
            full = [
                q
                for q in {p.queue_url for p in self._pending}
                if sum(p.queue_url == q for p in self._pending) >= DELETE_BATCH
            ]
            if force or now >= oldest.since + self.window:
                batch = same[:DELETE_BATCH]
            elif full:
                batch = [p for p in self._pending if p.queue_url == full[0]][:DELETE_BATCH]
            else:
                return []
            taken = {id(p) for p in batch}
            self._pending = [p for p in self._pending if id(p) not in taken]
            return batch


__all__ = ["DELETE_BATCH", "DELETE_WINDOW", "DeleteBatch", "PendingDelete"]
