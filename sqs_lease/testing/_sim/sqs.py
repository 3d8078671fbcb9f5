"""Simulated SQS standard queues on the virtual clock.

What AWS documents, and where moto and AWS differ, chosen per run (seeded):

- visibility timers; a fresh receipt handle per receive; ``ApproximateReceiveCount``;
- at-least-once delivery: a receive may leave a copy behind, which a later
  receive returns while the message is still in flight to someone else (a
  duplicate delivery, with its own new receipt handle);
- stale receipt handles: ``moto`` mode really extends and deletes with them;
  ``aws`` mode may ignore a delete (and answer success), and a CMV with a stale
  handle may apply, be ignored (success) or be refused;
- a CMV on a message whose visibility lapsed (not yet received again) either
  applies (200, as recorded on AWS) or is refused ``MessageNotInflight``;
- error codes in the JSON spelling (``MessageNotInflight``) or the legacy query
  spelling (``AWS.SimpleQueueService.MessageNotInflight``);
- the 12-hour cap counted from the receive that issued the handle (or, a directed
  world's knob, from the message's first receive): a CMV past it is
  ``InvalidParameterValue``;
- redrive: a receive that would take a message past ``maxReceiveCount`` moves it
  to the dead-letter queue instead;
- long polling: a receive with nothing visible waits (``Wait``) until a message
  becomes visible or ``WaitTimeSeconds`` pass.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ..._core.calls import Err, ErrorKind, Ok, Outcome
from . import fifo as fifo_world
from .chaos import Chaos

MAX_VISIBILITY = 43_200
EPOCH_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: SentTimestamp = EPOCH + virtual time


@dataclass
class SqsBehaviour:
    stale_mode: str = "moto"  # "moto" | "aws"
    spelling: str = "json"  # "json" | "query"
    expired_cmv: str = "apply"  # "apply" | "not_inflight"
    duplicate: float = 0.0  # chance a receive leaves a duplicate for a later receive


@dataclass
class Message:
    seq: int
    queue_url: str
    message_id: str
    body: str
    sent_at: float
    visible_at: float
    attributes: Mapping[str, Any] = field(default_factory=dict)
    receive_count: int = 0
    first_received_at: float | None = None
    handle: str | None = None  # the latest receipt handle
    handles: dict[str, float] = field(default_factory=dict)  # handle -> its receive time
    deleted: bool = False
    dup_pending: bool = False  # a duplicate copy waits for a later receive


@dataclass
class Queue:
    url: str
    visibility: int = 30
    dlq_url: str | None = None
    max_receive: int = 0  # 0: no redrive
    messages: dict[str, Message] = field(default_factory=dict)  # not deleted
    gone: dict[str, Message] = field(default_factory=dict)  # deleted (handles stay known)
    fifo: fifo_world.FifoQueue | None = None  # a FIFO queue's state (the fifo world)
    # A fleet's queue (``SimSQS.indexed``): the messages visible now, oldest first, and
    # a heap of (visible_at, seq, id) for those that become visible later (entries
    # whose message moved again are skipped when they come up).
    ready: dict[str, Message] = field(default_factory=dict)
    timers: list[tuple[float, int, str]] = field(default_factory=list)
    held: set[str] = field(default_factory=set)  # in flight: received, not yet visible again


@dataclass(frozen=True)
class Wait:
    """A long poll found nothing: ask again at ``until`` (or when woken), or at
    ``next_visible``, when the earliest message in flight becomes visible (None: none)."""

    until: float
    next_visible: float | None = None


class SimSQS:
    def __init__(self, chaos: Chaos, behaviour: SqsBehaviour | None = None) -> None:
        self.chaos = chaos
        self.behaviour = behaviour or SqsBehaviour()
        self.queues: dict[str, Queue] = {}
        self._handles: dict[str, tuple[str, str]] = {}  # handle -> (queue url, message id)
        self._seq = 0
        self._handle_seq = 0
        self.now = 0.0
        # Live long polls, longest-waiting first: (woken, over). ``woken()`` takes a
        # wake-up (True) or passes it on (False, once ``over()``, for good).
        self.waiters: deque[tuple[Callable[[], bool], Callable[[], bool]]] = deque()
        self._prune_at = 64
        self.on_redrive: Callable[[Message], None] | None = None
        self.calls: dict[str, int] = {}
        # issue 26 (backlog): how long before now a message with this body was sent
        self.sent_before: Callable[[str], float] | None = None
        # Where the 12-hour cap counts from: the receive that issued the handle (False,
        # every drawn run) or the message's first receive (True: a directed world's
        # stricter reading, under which a re-received message's earlier receives used
        # part of its cap, as ``messages.cap_budget`` assumes they may).
        self.cap_from_first_receive = False
        # A fleet (fleet.py): receives read an index instead of scanning the queue (a
        # drawn world's receive shuffles every visible message, so its schedules stay
        # as they were), and a receive while ``in_flight_limit`` messages are in flight
        # is refused ``OverLimit``, as SQS refuses it (None: no limit drawn).
        self.indexed = False
        self.in_flight_limit: int | None = None
        self.peak_in_flight = 0  # (indexed: the most messages in flight a receive saw)

    def create_queue(
        self, url: str, *, visibility: int = 30, dlq_url: str | None = None, max_receive: int = 0
    ) -> Queue:
        q = Queue(url, visibility, dlq_url, max_receive)
        if url.endswith(fifo_world.FIFO_SUFFIX):  # AWS's rule: a FIFO queue's name says so
            q.fifo = fifo_world.FifoQueue()
        self.queues[url] = q
        return q

    # ---------------------------------------------------------------- spelling

    def _code(self, name: str) -> tuple[str, str]:
        """(Code, QueryErrorCode) for an error, spelled as this run's SQS spells it."""
        query = {
            "MessageNotInflight": "AWS.SimpleQueueService.MessageNotInflight",
            "QueueDoesNotExist": "AWS.SimpleQueueService.NonExistentQueue",
            "BatchEntryIdsNotDistinct": "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
            "EmptyBatchRequest": "AWS.SimpleQueueService.EmptyBatchRequest",
            "TooManyEntriesInBatchRequest": "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        }.get(name, name)
        if self.behaviour.spelling == "query":
            return query, ""
        return name, query

    def _err(self, name: str, message: str, kind: ErrorKind = ErrorKind.INVALID) -> Err:
        code, query = self._code(name)
        return Err(kind, code, query, message)

    # ---------------------------------------------------------------- entry

    def handle(self, op: str, params: Mapping[str, Any], now: float) -> Outcome | Wait:
        self.now = now
        self.calls[op] = self.calls.get(op, 0) + 1
        q = self.queues.get(str(params.get("QueueUrl", "")))
        if q is None:
            return self._err(
                "QueueDoesNotExist", "The specified queue does not exist.", ErrorKind.NOT_FOUND
            )
        fn = getattr(self, "_op_" + op, None)
        if fn is None:
            return self._err("InvalidAction", f"unsupported operation {op}")
        result: Outcome | Wait = fn(q, params)
        return result

    # ---------------------------------------------------------------- helpers

    def _new_handle(self, m: Message) -> str:
        self._handle_seq += 1
        h = f"rh-{m.seq}-{m.receive_count}-{self._handle_seq}"
        m.handle = h
        m.handles[h] = self.now
        self._handles[h] = (m.queue_url, m.message_id)
        return h

    def _lookup(self, q: Queue, handle: str) -> Message | None:
        where = self._handles.get(handle)
        if where is None or where[0] != q.url:
            return None
        return q.messages.get(where[1]) or q.gone.get(where[1])

    def _remove(self, q: Queue, m: Message) -> None:
        m.deleted = True
        q.messages.pop(m.message_id, None)
        q.gone[m.message_id] = m
        q.ready.pop(m.message_id, None)
        q.held.discard(m.message_id)

    def _moved(self, q: Queue, m: Message) -> None:
        """``m.visible_at`` changed: keep an indexed queue's index in step."""
        if not self.indexed:
            return
        q.ready.pop(m.message_id, None)
        if m.visible_at <= self.now:
            q.ready[m.message_id] = m
            q.held.discard(m.message_id)
        else:
            heapq.heappush(q.timers, (m.visible_at, m.seq, m.message_id))
            if m.handle is not None:  # (a delayed message never received is not in flight)
                q.held.add(m.message_id)

    def _due(self, q: Queue) -> float | None:
        """Move an indexed queue's messages that became visible into ``ready``; the
        next time one becomes visible (None: none)."""
        timers = q.timers
        while timers:
            t, _, mid = timers[0]
            m = q.messages.get(mid)
            if m is None or m.visible_at != t:
                heapq.heappop(timers)  # deleted, or moved again since
            elif t <= self.now:
                heapq.heappop(timers)
                q.ready[mid] = m
                q.held.discard(mid)
            else:
                return t
        return None

    def in_flight(self, m: Message) -> bool:
        return not m.deleted and m.handle is not None and m.visible_at > self.now

    def next_visible(self, q: Queue) -> float | None:
        if self.indexed:
            return self._due(q)
        later = [m.visible_at for m in q.messages.values() if m.visible_at > self.now]
        return min(later) if later else None

    def wait(self, woken: Callable[[], bool], over: Callable[[], bool]) -> None:
        """A long poll waits for a message: ``woken()`` when one may have become visible.

        ``over()`` tells a poll that has ended (answered, or its process gone): it
        never takes a wake-up again, so dropping it early changes nothing. Polls are
        re-armed far more often than messages arrive, so without the pruning the
        queue grows to tens of thousands of ended polls in a long run.
        """
        self.waiters.append((woken, over))
        if len(self.waiters) > self._prune_at:
            self.waiters = deque(w for w in self.waiters if not w[1]())
            self._prune_at = max(64, 2 * len(self.waiters))

    def _wake(self) -> None:
        """A message became visible: the longest-waiting live long poll gets to look."""
        while self.waiters:
            if self.waiters.popleft()[0]():
                return

    def send(
        self, q: Queue, body: str, delay: int = 0, attributes: Mapping[str, Any] | None = None
    ) -> Message:
        self._seq += 1
        m = Message(
            seq=self._seq,
            queue_url=q.url,
            message_id=f"msg-{self._seq:05d}",
            body=body,
            sent_at=self.now - (self.sent_before(body) if self.sent_before is not None else 0.0),
            visible_at=self.now + delay,
            attributes=dict(attributes or {}),
        )
        q.messages[m.message_id] = m
        self._moved(q, m)
        self._wake()
        return m

    # ---------------------------------------------------------------- operations

    def _op_SendMessage(self, q: Queue, params: Mapping[str, Any]) -> Outcome:
        if q.fifo is not None:
            return fifo_world.send(self, q, q.fifo, params)
        delay = int(params.get("DelaySeconds", 0))
        if not 0 <= delay <= 900:
            return self._err("InvalidParameterValue", "DelaySeconds must be 0..900")
        body = str(params.get("MessageBody", ""))
        if not body:
            return self._err("MissingParameter", "The request must contain MessageBody")
        m = self.send(q, body, delay, params.get("MessageAttributes"))
        return Ok({"MessageId": m.message_id})

    def _op_ReceiveMessage(self, q: Queue, params: Mapping[str, Any]) -> Outcome | Wait:
        want = int(params.get("MaxNumberOfMessages", 1))
        wait = int(params.get("WaitTimeSeconds", 0))
        vis = int(params.get("VisibilityTimeout", q.visibility))
        if not 1 <= want <= 10:
            return self._err("InvalidParameterValue", "MaxNumberOfMessages must be 1..10")
        if not 0 <= wait <= 20:
            return self._err("InvalidParameterValue", "WaitTimeSeconds must be 0..20")
        if not 0 <= vis <= MAX_VISIBILITY:
            return self._err("InvalidParameterValue", "VisibilityTimeout must be 0..43200")
        # One pass over the queue (most receives are long polls that find nothing):
        # the visible messages, the earliest later visibility (the long poll's next
        # look), and the in-flight copies a duplicate delivery may return.
        now = self.now
        visible: list[Message] = []
        later: float | None = None
        dups: list[Message] = []
        if self.indexed:
            later = self._due(q)
            held = len(q.held)
            self.peak_in_flight = max(self.peak_in_flight, held)
            limit = self.in_flight_limit
            if limit is not None and held >= limit:
                self.chaos.count("sqs_over_limit")
                return self._err(
                    "OverLimit",
                    f"Too many messages in flight: the queue's in-flight limit is {limit}.",
                    ErrorKind.THROTTLED,
                )
            visible = list(islice(q.ready.values(), want))  # oldest visible first
        else:
            for m in q.messages.values():
                va = m.visible_at
                if va <= now:
                    visible.append(m)
                    continue
                if later is None or va < later:
                    later = va
                if m.dup_pending and m.handle:
                    dups.append(m)
        if q.fifo is not None:  # groups in order, none while one is in flight; no copies
            visible, dups = q.fifo.receivable(q, visible, now), []
        if not self.indexed:
            self.chaos.shuffle(visible)
        if q.fifo is not None and want > 1:
            # A batch holds each group's messages in order behind its head (a Lambda
            # mapping's batch: several groups, each in its order).
            chosen = q.fifo.batch(q, visible, want, now)
        else:
            chosen = visible[:want]
        for m in chosen:
            # At-least-once: this receive may leave a copy behind that a later receive
            # returns while the message is still in flight here (once per receive).
            m.dup_pending = self.chaos.roll("duplicate_armed", self.behaviour.duplicate)
        if len(chosen) < want and self.chaos.active:
            # (the rolls above touched only visible messages, none of these)
            for m in dups:
                if len(chosen) >= want:
                    break
                m.dup_pending = False
                self.chaos.count("duplicate_delivery")
                chosen.append(m)
        if not chosen:
            return Wait(now + wait, later) if wait > 0 else Ok({})
        names = list(params.get("MessageSystemAttributeNames") or []) + list(
            params.get("AttributeNames") or []
        )
        out: list[dict[str, Any]] = []
        for m in chosen:
            if q.max_receive and q.dlq_url and m.receive_count + 1 > q.max_receive:
                self._redrive(q, m)
                continue
            m.receive_count += 1
            if m.first_received_at is None:
                m.first_received_at = self.now
            handle = self._new_handle(m)
            m.visible_at = self.now + vis
            self._moved(q, m)
            entry: dict[str, Any] = {
                "MessageId": m.message_id,
                "ReceiptHandle": handle,
                "Body": m.body,
            }
            attrs = {
                "ApproximateReceiveCount": str(m.receive_count),
                "SentTimestamp": str(EPOCH_MS + int(m.sent_at * 1000)),
                "ApproximateFirstReceiveTimestamp": str(
                    EPOCH_MS + int((m.first_received_at or 0.0) * 1000)
                ),
            }
            if q.fifo is not None:  # as AWS names a FIFO message's own attributes
                attrs["MessageGroupId"] = q.fifo.group_of(m)
                attrs["SequenceNumber"] = str(m.seq)
            if "All" not in names:
                attrs = {k: v for k, v in attrs.items() if k in names}
            if attrs:
                entry["Attributes"] = attrs
            if m.attributes:
                entry["MessageAttributes"] = dict(m.attributes)
            out.append(entry)
        if not out and wait > 0:  # (every chosen message went to the DLQ)
            return Wait(self.now + wait, self.next_visible(q))
        return Ok({"Messages": out} if out else {})

    def _redrive(self, q: Queue, m: Message) -> None:
        self._remove(q, m)
        dlq = self.queues.get(q.dlq_url or "")
        if dlq is not None:
            self.send(dlq, m.body, 0, m.attributes)
        self.chaos.count("redrive_dlq")
        if self.on_redrive is not None:
            self.on_redrive(m)

    def _change(self, q: Queue, handle: str, timeout: Any) -> Err | None:
        """Apply one visibility change; None when it succeeded (or was silently ignored)."""
        try:
            t = int(timeout)
        except (TypeError, ValueError):
            return self._err("InvalidParameterValue", f"VisibilityTimeout {timeout!r}")
        if not 0 <= t <= MAX_VISIBILITY:
            return self._err("InvalidParameterValue", "VisibilityTimeout must be 0..43200")
        m = self._lookup(q, handle)
        if m is None or m.deleted:
            return self._err("ReceiptHandleIsInvalid", f"The receipt handle {handle} is not valid.")
        received = m.handles[handle]
        if self.cap_from_first_receive and m.first_received_at is not None:
            received = m.first_received_at
        if self.now + t > received + MAX_VISIBILITY:
            self.chaos.count("cap_exceeded")
            return self._err(
                "InvalidParameterValue",
                "Value for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout "
                "for the message is beyond the limit [43200 seconds]",
            )
        if handle != m.handle:
            # A stale handle: another receive has happened since.
            if self.behaviour.stale_mode == "aws":
                pick = self.chaos.random()
                if pick < 1 / 3:
                    self.chaos.count("stale_cmv_ignored")
                    return None
                if pick < 2 / 3:
                    self.chaos.count("stale_cmv_refused")
                    return self._err(
                        "ReceiptHandleIsInvalid", f"The receipt handle {handle} has expired."
                    )
            self.chaos.count("stale_cmv_applied")
            m.visible_at = self.now + t
            self._moved(q, m)
            if t == 0:
                self._wake()
            return None
        if m.visible_at <= self.now:
            # Not in flight: its visibility lapsed and nobody received it since.
            if self.behaviour.expired_cmv == "not_inflight":
                self.chaos.count("cmv_not_inflight")
                return self._err("MessageNotInflight", "The message is not in flight.")
            self.chaos.count("cmv_expired_applied")
        m.visible_at = self.now + t
        self._moved(q, m)
        if t == 0:
            self._wake()
        return None

    def _op_ChangeMessageVisibility(self, q: Queue, params: Mapping[str, Any]) -> Outcome:
        err = self._change(q, str(params.get("ReceiptHandle", "")), params.get("VisibilityTimeout"))
        return err if err is not None else Ok({})

    def _batch_check(self, entries: list[Mapping[str, Any]]) -> Err | None:
        if not entries:
            return self._err("EmptyBatchRequest", "There should be at least one entry")
        if len(entries) > 10:
            return self._err("TooManyEntriesInBatchRequest", "Maximum number of entries is 10")
        ids = [str(e.get("Id", "")) for e in entries]
        if len(set(ids)) != len(ids):
            return self._err(
                "BatchEntryIdsNotDistinct", "Two or more batch entries have the same Id"
            )
        return None

    def _batch(
        self, params: Mapping[str, Any], one: Callable[[Mapping[str, Any]], Err | None]
    ) -> Outcome:
        """A batch request: ``one`` applies each entry in turn; the answer lists each
        entry's success or failure (an invalid batch applies none)."""
        entries = list(params.get("Entries") or [])
        bad = self._batch_check(entries)
        if bad is not None:
            return bad
        ok: list[dict[str, str]] = []
        failed: list[dict[str, Any]] = []
        for e in entries:
            err = one(e)
            if err is None:
                ok.append({"Id": str(e["Id"])})
            else:
                failed.append(
                    {
                        "Id": str(e["Id"]),
                        "SenderFault": True,
                        "Code": err.code,
                        "Message": err.message,
                    }
                )
        return Ok({"Successful": ok, "Failed": failed})

    def _op_ChangeMessageVisibilityBatch(self, q: Queue, params: Mapping[str, Any]) -> Outcome:
        return self._batch(
            params,
            lambda e: self._change(q, str(e.get("ReceiptHandle", "")), e.get("VisibilityTimeout")),
        )

    def _delete(self, q: Queue, handle: str) -> Err | None:
        m = self._lookup(q, handle)
        if m is None:
            return self._err("ReceiptHandleIsInvalid", f"The receipt handle {handle} is not valid.")
        if m.deleted:
            return None
        if handle != m.handle and self.behaviour.stale_mode == "aws" and self.chaos.chance(0.5):
            self.chaos.count("stale_delete_ignored")
            return None  # "succeeds, but the message might not be deleted"
        if handle != m.handle:
            self.chaos.count("stale_delete_applied")
        self._remove(q, m)
        if q.fifo is not None:
            self._wake()  # the group's next message may be received now
        return None

    def _op_DeleteMessage(self, q: Queue, params: Mapping[str, Any]) -> Outcome:
        err = self._delete(q, str(params.get("ReceiptHandle", "")))
        return err if err is not None else Ok({})

    def _op_DeleteMessageBatch(self, q: Queue, params: Mapping[str, Any]) -> Outcome:
        return self._batch(params, lambda e: self._delete(q, str(e.get("ReceiptHandle", ""))))

    # ---------------------------------------------------------------- inspection

    def live(self, url: str) -> list[Message]:
        return list(self.queues[url].messages.values())
