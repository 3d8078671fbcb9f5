"""Lambda's SQS event source: its record spelling, the time budget, FIFO groups, settlement.

The Lambda adapter (``sqs_lease.aws_lambda``) is a shell of :func:`attempt_flow`
like the workers; what differs is where a message comes from (an event record the
event source mapping received, not our ``ReceiveMessage``) and what the shell must
answer (``batchItemFailures``). The rules for that live here, pure:

- :func:`parse_event_record`: an event record (``messageId``, ``receiptHandle``,
  ``body``, ``attributes.ApproximateReceiveCount``) read by the workers' own
  :func:`~sqs_lease._core.messages.parse_message`.
- :func:`take_record_flow`: one ChangeMessageVisibility to the class's lease, so
  the local lease counts from a moment this process measured (the mapping's
  receive time is not known to it).
- :func:`can_start`: the budget: a record starts only when its class's whole
  stage budget, plus :data:`END_MARGIN_SECONDS`, fits in the invocation's time left.
- :class:`GroupStop`: FIFO: after a failure in a message group, the rest of it
  is not started.

Whether a record succeeded is the attempt's own answer
(``attempt.AttemptEnd.deleted``: its flows deleted its message), read by
``invocation.record_flow``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .calls import Call, Emit, Err, Flow, Ok, Outcome, call, sqs_code_is
from .messages import Delivery, Poison, parse_message

END_MARGIN_SECONDS = 3.0
"""Time kept after a record's stage budget for its end write, the release of the
records not started and the answer to Lambda."""


def parse_event_record(
    record: Mapping[str, Any], received_at: float, visibility: int
) -> Delivery | Poison:
    """One SQS event record (the event's own key spelling) as a delivery, or poison.
    Total, like :func:`parse_message`: a record of any shape returns."""
    if not isinstance(record, Mapping):
        record = {}
    attrs = record.get("attributes")
    return parse_message(
        {
            "MessageId": record.get("messageId", ""),
            "ReceiptHandle": record.get("receiptHandle", ""),
            "Body": record.get("body", ""),
            "Attributes": attrs if isinstance(attrs, Mapping) else {},
        },
        received_at,
        visibility,
    )


def message_group(record: Mapping[str, Any]) -> str | None:
    """The record's FIFO message group, or None for a standard queue's record."""
    attrs = record.get("attributes")
    group = attrs.get("MessageGroupId") if isinstance(attrs, Mapping) else None
    if group:
        return str(group)
    if str(record.get("eventSourceARN", "")).endswith(".fifo"):
        return ""  # a FIFO queue's record without its group: the whole batch is one group
    return None


def can_start(remaining_ms: int, stage_budget_seconds: float) -> bool:
    """Whether a record of a class with this stage budget may start with
    ``remaining_ms`` of the invocation left: its whole budget and the end margin fit."""
    return remaining_ms / 1000.0 >= stage_budget_seconds + END_MARGIN_SECONDS


def not_started_visibility(remaining_ms: int) -> int:
    """The visibility a record not started for the budget is released with: the rest
    of this invocation, rounded up (at least 1 s). Released at 0, the event source
    would receive it again at once, into a batch of the same invocation wave, where
    it may again not start; each such receive counts toward the redrive bound. Once
    this invocation is over, the wave's batches were handed out: it comes back to a
    fresh one."""
    return max(1, math.ceil(remaining_ms / 1000.0))


FIFO_BATCH_SIZE = 1
"""The event source's batch size on a FIFO queue (the worker's receive takes one
message from a FIFO queue for the same reason, ``messages.receive_batch``)."""


def fifo_batch_problem(batch_size: int) -> str | None:
    """Why an event source on a FIFO queue must not hand a function ``batch_size``
    records (None: it may). A batch holds each group's messages in order behind its
    head; a record behind one that failed, was retried or did not fit the time left
    must not start (the group's order), and SQS cannot take it back uncounted: a
    fresh message would go behind the group's later jobs. So it is received and
    handed back, each receive counted toward the redrive bound, as often as the
    records before it fail (soak seed 1117530: a job received 20 times behind a
    retried head and dead-lettered without ever starting)."""
    if batch_size <= FIFO_BATCH_SIZE:
        return None
    return (
        f"a FIFO queue's event source handing over {batch_size} records a batch: a record "
        "behind a failed or retried one of its group is received and handed back, each "
        "receive counted, until SQS dead-letters it unstarted; set the event source's "
        f"batch size to {FIFO_BATCH_SIZE}"
    )


def batch_size_for(
    function_timeout: float, stage_budgets: Iterable[float], *, fifo: bool = False
) -> int:
    """The event source's batch size for a function of this timeout: as many records
    as can start one after the other when each uses its whole stage budget (at
    least 1, at most 10); on a FIFO queue one (:func:`fifo_batch_problem`). A larger
    batch's later records are received, not started and released (each receive
    counted against the redrive bound) whenever the earlier ones run long."""
    if fifo:
        return FIFO_BATCH_SIZE
    longest = max(stage_budgets, default=0.0)
    if longest <= 0:
        return 10
    return max(1, min(10, int((function_timeout - END_MARGIN_SECONDS) // longest)))


def never_fit(budgets: Mapping[str, float], function_timeout: float) -> list[str]:
    """The classes (and stages) whose whole stage budget and the end margin can never fit
    in an invocation of ``function_timeout`` seconds: :func:`can_start` never starts a
    record of theirs, and it would come back until SQS moved it to the DLQ."""
    return sorted(n for n, b in budgets.items() if b + END_MARGIN_SECONDS > function_timeout)


@dataclass
class GroupStop:
    """FIFO order: once a record of a group failed, the group's later records wait."""

    stopped: set[str] = field(default_factory=set)

    def blocked(self, group: str | None) -> bool:
        """Whether a record of ``group`` must not start (its group saw a failure)."""
        return group is not None and group in self.stopped

    def failed(self, group: str | None) -> None:
        """A record of ``group`` did not finish: its group's later records wait."""
        if group is not None:
            self.stopped.add(group)


def take_record_flow(
    queue_url: str, delivery: Delivery, lease_seconds: int
) -> Flow[Delivery | Err]:
    """Set the record's visibility to ``lease_seconds`` from now: its local lease counts
    from before this call. SQS's refusal when it refused (the message is not ours to
    work; :func:`lapsed` tells whether its receive's visibility ran out)."""
    out: Outcome = yield from call(
        Call(
            "sqs",
            "ChangeMessageVisibility",
            {
                "QueueUrl": queue_url,
                "ReceiptHandle": delivery.receipt_handle,
                "VisibilityTimeout": lease_seconds,
            },
        )
    )
    if not isinstance(out, Ok):
        yield Emit(
            "lambda_record_not_taken",
            {"job_id": delivery.job_id, "error_code": out.code or out.kind.value},
        )
        return out
    return replace(delivery, received_at=out.sent_at, visibility=lease_seconds)


def lapsed(refused: Err) -> bool:
    """Whether SQS refused a record's take because its receive's visibility ran out
    behind the batch's earlier records (the handle no longer in flight): the record was
    received and never started, like one the budget did not fit. Any other refusal
    (a denied call, a throttle, no answer) leaves the record to its visibility."""
    return sqs_code_is("MessageNotInflight", refused.code) or sqs_code_is(
        "ReceiptHandleIsInvalid", refused.code
    )


__all__ = [
    "END_MARGIN_SECONDS",
    "FIFO_BATCH_SIZE",
    "GroupStop",
    "batch_size_for",
    "can_start",
    "fifo_batch_problem",
    "lapsed",
    "message_group",
    "never_fit",
    "not_started_visibility",
    "parse_event_record",
    "take_record_flow",
]
