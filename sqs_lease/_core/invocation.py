"""One record of a Lambda invocation's SQS batch, decided and run: the flow every Lambda
shell drives (the adapter ``sqs_lease.aws_lambda`` and the simulator's ``testing._sim.lambdas``).

The rules it applies are :mod:`~sqs_lease._core.eventsource`'s: read the record
(:func:`parse_event_record`), start it only when its own stage's budget fits in the
time left (:func:`can_start`) and no earlier record of its FIFO group failed
(:class:`GroupStop`), set its visibility to its class's lease
(:func:`take_record_flow`), run the attempt and read whether it deleted its
message (``AttemptEnd.deleted``, the attempt's own answer, never inferred from the
calls it made). A shell loops over the records in order, asks the time left from
its own context, gathers their ends (:class:`BatchEnds`), reports the records not
done in ``batchItemFailures`` and hands back the records it did not start (each
waits as a fresh message where it can, so that no skip counts toward the DLQ:
:func:`release_unstarted_records_flow`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import JobClassError
from .attempt import AttemptEnd, attempt_flow
from .calls import Emit, Err, Flow, ask
from .deploy import LAMBDA_MAX_TIMEOUT, check_lambda_fit
from .endwrites import release_flow
from .env import AttemptEnv, now_of, rules_for
from .eventsource import (
    GroupStop,
    can_start,
    fifo_batch_problem,
    lapsed,
    message_group,
    not_started_visibility,
    parse_event_record,
    take_record_flow,
)
from .fifo import is_fifo
from .messages import Delivery, cap_visibility, on_queue
from .slots import unstarted_wait_flow, wait_delay, waits_of


def unfit_problem(rules: Mapping[str, tuple[float, int]], function_timeout: float) -> str | None:
    """Why a consumer of this app must refuse to run in a function of ``function_timeout``
    seconds (None: it may run): ``rules`` maps each lease rule (class, ``job/stage``,
    ``job/tool``) to its (``stage_budget_seconds``, ``lease_seconds``); one whose whole
    budget and the end margin never fit an invocation (:func:`check_lambda_fit`, the
    construct's rule at synth) would never start: each record would come back until
    SQS moved it to the DLQ, the function succeeding all along. Refused, every
    invocation fails, loudly, until the app or the function is fixed (the function's
    ``Errors`` alarm), and no record is lost meanwhile.

    ``function_timeout`` is the function's own as its environment knows it
    (:class:`FunctionTimeout`), never above Lambda's :data:`LAMBDA_MAX_TIMEOUT`."""
    try:
        check_lambda_fit(rules, min(float(function_timeout), float(LAMBDA_MAX_TIMEOUT)))
    except JobClassError as unfit:
        return str(unfit)
    return None


@dataclass
class FunctionTimeout:
    """The function's timeout as one execution environment knows it. Lambda tells a
    function its timeout only as the time left when an invocation starts, and that
    reading can only fall short: an environment frozen or starved of CPU before its
    handler reads the clock sees less. So the largest reading so far stands, never the
    first: a late first reading kept for the environment's life would make a function
    that fits refuse every invocation until Lambda recycled it (soak seed 1309403),
    its records dead-lettered unstarted meanwhile. A function that really is too short
    reads too short every time, and is refused every time."""

    seconds: int | None = None

    def read(self, remaining_ms: int) -> int:
        """Take this invocation's time left at its start; the timeout as now known."""
        seen = math.ceil(max(0, remaining_ms) / 1000)
        if self.seconds is None or seen > self.seconds:
            self.seconds = seen
        return self.seconds


@dataclass
class FifoBatchWatch:
    """One environment's watch on its batches' size: a FIFO queue's event source that
    hands over more than one record at a time (``eventsource.fifo_batch_problem``) is
    told once per environment, with the fix. The batch still runs in its groups'
    order; only its later records' receives are spent."""

    told: bool = False

    def seen(self, records: int, queue_url: str) -> Emit | None:
        """A batch of ``records`` arrived from ``queue_url``: the warning, the first time."""
        problem = fifo_batch_problem(records) if is_fifo(queue_url) else None
        if problem is None or self.told:
            return None
        self.told = True
        return Emit("lambda_fifo_batch_too_large", {"records": records, "fix": problem})


@dataclass(frozen=True)
class RecordEnd:
    """What became of one record: ``done`` when the attempt's own flows deleted its
    message (``AttemptEnd.deleted``: a success for the mapping); ``unstarted``, a
    delivery not started, to hand back at the end of the batch: ``blocked`` when its
    FIFO group stopped (back at once, behind its group), else for the budget or a
    take SQS refused (back after this invocation)."""

    message_id: str
    done: bool
    unstarted: Delivery | None = None
    blocked: bool = False


@dataclass
class BatchEnds:
    """One invocation's batch as its records end, in order: the FIFO groups stopped
    (``groups``, what :func:`record_flow` reads), the records reported failed
    (``failures``, the ``batchItemFailures``) and those handed back at the end
    (``unstarted``, :func:`release_unstarted_records_flow`)."""

    groups: GroupStop = field(default_factory=GroupStop)
    failures: list[str] = field(default_factory=list)
    unstarted: list[RecordEnd] = field(default_factory=list)

    def ended(self, end: RecordEnd | None) -> None:
        """A record's flow ended (None: no SQS record, nothing to report it by)."""
        if end is None:
            return
        if not end.done:
            self.failures.append(end.message_id)
        if end.unstarted is not None:
            self.unstarted.append(end)

    def broke(self, record: Any) -> None:
        """A record's flow raised (an AWS failure it could not handle): reported
        failed, and its FIFO group's later records wait."""
        if isinstance(record, Mapping):
            self.groups.failed(message_group(record))
            self.failures.append(str(record.get("messageId", "")))


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
    now = yield from now_of(env)
    item = parse_event_record(record, now.mono, 0)
    # A staged job's record starts only when its own stage's budget fits.
    rules = rules_for(env, item.job_class, item.stage) if isinstance(item, Delivery) else None
    budget = rules.stage_budget_seconds if rules is not None else 0.0
    blocked = groups.blocked(group)
    left: int = yield from ask("remaining", remaining_ms)
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
    if isinstance(item, Delivery):
        lease = rules.lease_seconds if rules is not None else env.receive_visibility
        # The take asks no visibility past SQS's 12-hour cap (the attempt's own rule,
        # cap_budget): with less than a lease of it left SQS would refuse the take and
        # the record come back until the DLQ; taken for what is left, the attempt
        # sends the job on under a new message instead.
        taken = yield from take_record_flow(
            env.queue_url, item, cap_visibility(item, lease, now.wall)
        )
        if isinstance(taken, Err):
            groups.failed(group)
            # Its visibility lapsed behind the batch's earlier records: not started
            # either, it waits like one the budget did not fit, so that it is no
            # receive toward the DLQ (a FIFO record is left to its visibility, behind
            # its group). Any other refusal leaves it to its visibility.
            wait = lapsed(taken) and waits_as_fresh(env, item)
            return RecordEnd(mid, False, item if wait else None)
        item = taken
    end: AttemptEnd = yield from attempt_flow(env, item, tag=tag)
    if not end.deleted:
        groups.failed(group)
    return RecordEnd(mid, end.deleted)


def waits_as_fresh(env: AttemptEnv, delivery: Delivery) -> bool:
    """Whether a record received and not started waits as a fresh message
    (``slots.unstarted_wait_flow``): on a standard queue. On a FIFO queue it keeps its
    message: a fresh one would go behind its group's later jobs (the session's
    order)."""
    return not is_fifo(on_queue(delivery, env.queue_url))


def release_unstarted_records_flow(
    env: AttemptEnv, ends: Sequence[RecordEnd], remaining_ms: Callable[[], int]
) -> Flow[int]:
    """The records the invocation did not start (nothing was claimed), handed back.
    A FIFO group's blocked ones at once (visibility 0, behind the group's failed
    record). One the budget did not fit, or whose visibility lapsed before its turn,
    waits as a fresh message (``slots.unstarted_wait_flow``, the slot waiters' rule 4,
    with their delay, rule 6): every receive counts toward the redrive bound, and a
    record behind long ones in a batch would otherwise be dead-lettered without ever
    starting. Where it cannot (:func:`waits_as_fresh`: a FIFO queue; or its record
    moved on) it is released for the rest of this invocation
    (:func:`not_started_visibility`), so the event source does not hand it straight
    back into the same wave of batches. Returns how many are back (waiting or
    released)."""
    blocked = [e.unstarted for e in ends if e.unstarted is not None and e.blocked]
    unfit = [e.unstarted for e in ends if e.unstarted is not None and not e.blocked]
    released: int = yield from _release(env, blocked, 0)
    kept: list[Delivery] = []
    for d in unfit:
        if not waits_as_fresh(env, d):
            kept.append(d)
            continue
        home = on_queue(d, env.queue_url)
        # As a slot waiter waits for a free slot (rule 6: the delay falls with the
        # job's waits, so the record skipped most often comes back most often).
        rand: float = yield from ask("random", env.random)
        delay = wait_delay(waits_of(d.send_id), rand, interactive=home == env.interactive_url)
        now = yield from now_of(env)
        waits = yield from unstarted_wait_flow(
            env.table, queue_url=env.queue_url, delivery=d, wall_now=now.wall, delay=delay
        )
        if not waits:
            kept.append(d)
            continue
        yield Emit(
            "lambda_record_waits",
            {"job_id": d.job_id, "delay": delay, "receive_count": d.receive_count},
        )
        released += 1
    if kept:
        left: int = yield from ask("remaining", remaining_ms)
        released += yield from _release(env, kept, not_started_visibility(left))
    return released


def _release(env: AttemptEnv, deliveries: Sequence[Delivery], visibility: int) -> Flow[int]:
    """Hand these unclaimed deliveries back, visible again in ``visibility`` seconds."""
    if not deliveries:
        return 0
    now = yield from now_of(env)
    released: int = yield from release_flow(
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


__all__ = [
    "BatchEnds",
    "FifoBatchWatch",
    "FunctionTimeout",
    "RecordEnd",
    "record_flow",
    "release_unstarted_records_flow",
    "unfit_problem",
]
