"""One record of a Lambda invocation's SQS batch, decided and run: the flow every Lambda
shell drives (the adapter ``sqs_lease.aws_lambda`` and the simulator's ``testing.sim.lambdas``).

The rules it applies are :mod:`~sqs_lease._core.eventsource`'s: read the record
(:func:`parse_event_record`), start it only when its own stage's budget fits in the
time left (:func:`can_start`) and no earlier record of its FIFO group failed
(:class:`GroupStop`), set its visibility to its class's lease
(:func:`take_record_flow`), run the attempt and tell whether the attempt deleted its
message (:func:`settled_flow`). A shell loops over the records in order, asks the
time left from its own context, reports the records not done in
``batchItemFailures`` and releases the records it did not start
(:func:`release_unstarted_records_flow`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import JobClassError
from .attempt import AttemptEnv, _now, _value, attempt_flow, rules_for
from .calls import Emit, Flow
from .deploy import LAMBDA_MAX_TIMEOUT, check_lambda_fit
from .eventsource import (
    GroupStop,
    can_start,
    message_group,
    not_started_visibility,
    parse_event_record,
    settled_flow,
    take_record_flow,
)
from .flows import Delivery, Poison, release_flow


def unfit_problem(rules: Mapping[str, tuple[float, int]], function_timeout: float) -> str | None:
    """Why a consumer of this app must refuse to run in a function of ``function_timeout``
    seconds (None: it may run): ``rules`` maps each lease rule (class, ``job/stage``,
    ``job/tool``) to its (``stage_budget_seconds``, ``lease_seconds``); one whose whole
    budget and the end margin never fit an invocation (:func:`check_lambda_fit`, the
    construct's rule at synth) would never start: each record would come back until
    SQS moved it to the DLQ, the function succeeding all along. Refused, every
    invocation fails, loudly, until the app or the function is fixed (the function's
    ``Errors`` alarm), and no record is lost meanwhile.

    ``function_timeout`` is the function's own (a shell reads it from its first
    invocation's remaining time), never above Lambda's :data:`LAMBDA_MAX_TIMEOUT`."""
    try:
        check_lambda_fit(rules, min(float(function_timeout), float(LAMBDA_MAX_TIMEOUT)))
    except JobClassError as unfit:
        return str(unfit)
    return None


@dataclass(frozen=True)
class RecordEnd:
    """What became of one record: ``done`` when the attempt's own flows deleted its
    message (a success for the mapping); ``unstarted``, a delivery not started, to hand
    back at the end of the batch: ``blocked`` when its FIFO group stopped (back at
    once, behind its group), else for the budget (back after this invocation)."""

    message_id: str
    done: bool
    unstarted: Delivery | None = None
    blocked: bool = False


def record_flow(
    env: AttemptEnv,
    record: Any,
    groups: GroupStop,
    remaining_ms: Callable[[], int],
    *,
    tag: Any = None,
) -> Flow[RecordEnd | None]:
    """One record of the batch, in order: not started (and why), or run to its end.
    None for an entry that is no SQS record at all (nothing to report it by).
    ``tag``: the shell's own label of the attempt (``attempt_flow``'s)."""
    if not isinstance(record, Mapping):
        yield Emit("lambda_record_unreadable", {"record_type": type(record).__name__})
        return None
    mid = str(record.get("messageId", ""))
    group = message_group(record)
    now = yield from _now(env)
    item = parse_event_record(record, now.mono, 0)
    # A staged job's record starts only when its own stage's budget fits.
    rules = rules_for(env, item.job_class, item.stage) if isinstance(item, Delivery) else None
    budget = rules.stage_budget_seconds if rules is not None else 0.0
    blocked = groups.blocked(group)
    left: int = yield from _value("remaining", remaining_ms)
    if blocked or not can_start(left, budget):
        yield Emit(
            "lambda_record_not_started",
            {
                "job_id": item.job_id,
                "reason": "fifo_group_stopped" if blocked else "stage_budget_does_not_fit",
                "stage_budget": budget,
                "remaining": round(left / 1000.0, 3),
            },
        )
        groups.failed(group)
        return RecordEnd(mid, False, item if isinstance(item, Delivery) else None, blocked)
    env.tally("received", 1)
    done = yield from _run_record(env, item, tag)
    if not done:
        groups.failed(group)
    return RecordEnd(mid, done)


def _run_record(env: AttemptEnv, item: Delivery | Poison, tag: Any) -> Flow[bool]:
    """One started record through the attempt flow; True when its message was deleted."""
    if isinstance(item, Delivery):
        rules = rules_for(env, item.job_class, item.stage)
        lease = rules.lease_seconds if rules is not None else env.receive_visibility
        taken = yield from take_record_flow(env.queue_url, item, lease)
        if taken is None:
            return False
        item = taken
    done: bool = yield from settled_flow(attempt_flow(env, item, tag=tag), item.receipt_handle)
    return done


def release_unstarted_records_flow(
    env: AttemptEnv, ends: Sequence[RecordEnd], remaining_ms: Callable[[], int]
) -> Flow[int]:
    """The records the invocation did not start, handed back (nothing was claimed, no
    record is written): a FIFO group's at once (visibility 0, it waits behind the
    group's failed record); one the budget did not fit after the rest of this
    invocation (:func:`not_started_visibility`), so the event source does not hand it
    straight back into the same wave of batches, where it may again not start, each
    receive counted toward the redrive bound."""
    blocked = [e.unstarted for e in ends if e.unstarted is not None and e.blocked]
    unfit = [e.unstarted for e in ends if e.unstarted is not None and not e.blocked]
    released = 0
    for deliveries, visibility in ((blocked, 0), (unfit, None)):
        if not deliveries:
            continue
        if visibility is None:
            left: int = yield from _value("remaining", remaining_ms)
            visibility = not_started_visibility(left)
        now = yield from _now(env)
        released += yield from release_flow(
            env.table,
            queue_url=env.queue_url,
            held=[(None, d) for d in deliveries],
            worker_id=env.worker_id,
            wall_now=now.wall,
            reason="lambda: not started",
            nonce="",  # nothing claimed: no record is written
            visibility=visibility,
        )
    return released


__all__ = ["RecordEnd", "record_flow", "release_unstarted_records_flow", "unfit_problem"]
