"""One attempt, from a received message to a decided end; and the worker's other rounds.

Every worker shell (the thread worker, the asyncio worker, the simulator) runs
these flows and decides no protocol step itself. A shell *schedules* (a thread,
a task or a simulated task per attempt; a heartbeat loop; a sweep loop) and
*performs* the instructions the flows yield, exactly as for every other flow:

``attempt_flow(env, item)``
    receive -> (poison: DLQ) -> admit/claim -> validate the payload -> hold the
    lease in the :class:`~sqs_lease._core.leasebook.LeaseBook` -> run the
    handler (unless the attempt was told to stop first) -> mark its end ->
    decide the ending (``ending_for`` + ``stopped_ending``) -> commit / retry
    with backoff / park / fail / release / abandon -> forget the lease.
``heartbeat_tick_flow(env, stopping=...)`` / ``heartbeat_round_flow(env)``
    every tick of the heartbeat loop (a shutdown passed on, a failed round
    journaled); one round: the watchdog's drops (a counted retry for each, but a spent
    reserve) -> extend the leases still open (``heartbeat_flow``) -> apply the
    verdicts to the book.
``shutdown_flow(env)``, ``release_unstarted_flow(env, item)``, ``sweep_once_flow(env, ...)``
    the hand-back of what is still held when the grace is over, of a message
    received while stopping, and one bounded stranded-record sweep.

The instruction contract (what a shell must perform):

- ``Call``: one AWS call, answered with ``Ok``/``Err`` (the drivers' ``execute``).
- ``Sleep``: wait on the shell's clock (never used by an attempt itself; the
  flows it runs may back off).
- ``Emit``: write the journal event.
- ``Invoke(what, fn)``: run caller code and answer ``Ok({"value": v})``, or
  ``Err(ErrorKind.RAISED, exc=e)`` when it raised an ``Exception``. The ``what``
  names are:

  - ``"now"``: ``fn`` is the shell's ``env.now`` -> :class:`Now` (the monotonic
    lease clock and the wall clock, read together; the core reads no clock).
  - ``"random"``: ``env.random`` -> a float in [0, 1) (backoff, deferral jitter).
  - ``"write_id"``: ``env.write_id`` -> a fresh nonce (str): an attempt's, carried by
    its end writes so that it recognises its own write exactly (``fencing.end_write_id``);
    a release made on an attempt's behalf draws its own. Unguessable in a real shell
    (``secrets``): whoever could predict it could forge the attempt's write.
  - ``"validate"``: the job class's payload validation (may raise ``PayloadError``).
  - ``"handler"``: ``fn`` is a :class:`HandlerRun`. A sync shell just calls it (in
    the attempt's thread: it calls ``env.run_handler``, which builds the job
    context and calls the handler). An async shell may look at ``fn`` itself
    (``held``, ``claim``, ``payload``, ``rules``) and await a coroutine handler or
    run a sync one in its pool; the simulator runs its scripted handler in
    simulated time. The answer is the handler's return value, or its exception.
    A handler's side effects (``ctx.effect``) are the shell's to drive, each with
    :func:`held_effect_flow` (which tells the book of a refused intent start).
  - ``"act_for"``: ``fn`` is an :class:`ActFor`: the calls that follow, until the
    next ``act_for``, are made on behalf of other attempts (a watchdog's retry,
    the shutdown release). A no-op for every shell but one that attributes calls
    (the simulator's checker).

What a shell supplies is an :class:`AttemptEnv` (the worker's identity, requests,
book, clocks, counter). Counters are the shell's (``env.tally``): the flows name
what to count. Optional :class:`Observer` hooks let the simulator's checker see
the truth at the moments it needs (a handler ended, a result about to be
committed, a round planned and applied); real shells pass none.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from .._errors import JobCancelled, LeaseLost, PayloadError, RecordUnreadable
from .calls import Call, Emit, Err, Flow, Invoke, Ok, ask, call
from .claiming import Claimed, ClaimResult, NotClaimed, NotClaimedOutcome, admit_flow
from .deadletter import DlqReport, DlqVerdict, reconcile_dlq_flow
from .deletes import DeleteBatch
from .deploy import redrive_too_tight
from .duplicates import duplicate_defer, owner_alive_flow, owner_window
from .endings import Ending, EndKind, ending_for, stopped_ending
from .endwrites import commit_flow, fail_flow, park_flow, poison_flow, release_flow, retry_flow
from .fencing import Finish, FinishOutcome, set_visibility
from .heartbeats import HeartbeatReport, LossSource, heartbeat_flow
from .intents import EffectResult, EffectSpec, IntentRequests, OwnStarts, effect_flow
from .lease import Drop, LocalLease, Stop
from .leasebook import HAND_BACK_STALE, Held, LeaseBook, LeaseRules, Signal, is_open
from .liveness import HeldJob, liveness_parts
from .messages import DDB_BATCH_GET, SQS_BATCH, Delivery, Poison, on_queue
from .records import JobRequests, attempts_allowed
from .slots import (
    HeldSlot,
    SlotGrant,
    SlotRequests,
    give_back_flow,
    own_pool,
    pools_for,
    slot_wait_event,
    take_slots_flow,
    wait_delay,
    wait_flow,
    waits_of,
)
from .stages import (
    CappedRules,
    NextStage,
    cap_budget,
    continue_flow,
    plain_data,
    refused_next,
    resend_flow,
    stage_input_json,
)
from .sweeping import SweepReport, sweep_flow
from .texts import outside_text
from .timing import LATE_HANDBACK_LIMIT, backoff_delay, beat_due, late_charged

UNKNOWN_CLASS_MAX_ATTEMPTS = 1_000_000  # an unknown class is never claimed: no bound applies


class ClassRules(LeaseRules, Protocol):
    """A job class as the attempt flow sees it (``JobClass`` satisfies it)."""

    @property
    def keep_rejected_results(self) -> bool: ...

    def validate_payload(self, payload_json: str) -> Any: ...


@dataclass(frozen=True)
class Now:
    """The shell's two clocks, read together: ``mono`` (the lease clock) and ``wall``."""

    mono: float
    wall: float


@dataclass(frozen=True)
class HandlerRun:
    """``Invoke("handler").fn``: the attempt whose handler to run, and the shell's runner.

    Calling it runs ``runner(self)`` (a sync shell's way); an async shell or the
    simulator reads the fields and runs the handler its own way.
    """

    held: Held
    claim: Claimed
    rules: ClassRules
    payload: Any
    runner: Callable[[HandlerRun], Any]

    def __call__(self) -> Any:
        return self.runner(self)


@dataclass(frozen=True)
class ActFor:
    """``Invoke("act_for").fn``: the following calls act for these attempts' tokens
    (``kind`` names the task; ``tokens`` None: back to the flow's own)."""

    kind: str
    tokens: Mapping[str, int] | None = None

    def __call__(self) -> None:
        return None


@dataclass(frozen=True)
class Parallel:
    """``Invoke("parallel").fn``: independent flows to run at once (a heartbeat round's
    parts); the answer is their results, in order.

    Calling it runs ``runner(flows)``: the shell's way to run flows together (the
    thread worker's small pool, the async worker's ``gather``); the simulator runs
    them one after another in simulated time.
    """

    flows: tuple[Flow[Any], ...]
    runner: Callable[[Sequence[Flow[Any]]], Any]

    def __call__(self) -> Any:
        return self.runner(self.flows)


class Observer(Protocol):
    """Moments a checker may watch (the simulator's); shells that do not watch pass None."""

    def handler_ended(self, held: Held, stop: Stop | None) -> None: ...

    def committing(self, claim: Claimed, result_json: str) -> None: ...

    def round_planned(self, leases: list[LocalLease]) -> None: ...

    def round_applied(self, extended: tuple[LocalLease, ...]) -> None: ...

    def round_failed(self, exc: Exception) -> None: ...


@dataclass(frozen=True)
class SlotEnv:
    """The fleet-wide concurrency limits a shell's app declares (``_core/slots.py``):
    where the slots are, and the limit of a job class and of a tenant (None: none)."""

    requests: SlotRequests
    class_limit: Callable[[str], int | None]
    tenant_limit: Callable[[str], int | None]
    # A staged job's stage -> what its own limit belongs to and the limit (None: no
    # limit; no callable: the shell runs no staged jobs). The app decides the unit (a
    # stage, or a planned job's tool); the pool is ``own_pool(CLASS, unit)``.
    stage_limit: Callable[[str, str], tuple[str, int] | None] | None = None


@dataclass
class AttemptEnv:
    """What a shell gives the flows: who it is, where, its book, clocks and counters."""

    table: JobRequests
    intents: IntentRequests
    queue_url: str
    dlq_url: str | None
    worker_id: str
    book: LeaseBook
    rules_of: Callable[[str], ClassRules | None]
    receive_visibility: int
    unknown_class_receives: int
    now: Callable[[], Now]
    random: Callable[[], float]
    write_id: Callable[[], str]
    tally: Callable[[str, int], None]
    new_signal: Callable[[], Signal]
    run_handler: Callable[[HandlerRun], Any]
    observer: Observer | None = None
    # How the shell runs a round's parts at once (``Invoke("parallel")``); None: one
    # after another in this flow.
    run_parallel: Callable[[Sequence[Flow[Any]]], Any] | None = None
    slots: SlotEnv | None = None  # None: no limits declared, no slot is ever taken
    # A staged job's stage -> its rules (None: the shell runs no staged jobs).
    stage_rules_of: Callable[[str, str], ClassRules | None] | None = None
    # A staged job's first stage (None: not staged): names it on a record submitted
    # without the app (a producer that cannot know the stages).
    first_stage_of: Callable[[str], str | None] | None = None
    # Deletes of ended jobs' messages, batched (None: each deleted right after its
    # end write, as the Lambda adapter needs to see it).
    deletes: DeleteBatch | None = None
    # Priorities: the interactive queue (None: none), where the sweep re-sends an
    # interactive job's message.
    interactive_url: str | None = None
    # This process's first starts of intents on its lease clock: the only age a
    # repeat inside a target's key retention may go ahead on (``repeat_unprotected``).
    own_starts: OwnStarts = field(default_factory=OwnStarts)


def rules_for(env: AttemptEnv, job_class: str, stage: str | None) -> ClassRules | None:
    """The rules of a job class, or of one stage of a staged job (each stage has its own)."""
    if stage is not None and env.stage_rules_of is not None:
        return env.stage_rules_of(job_class, stage)
    return env.rules_of(job_class)


# What a delivery that was not claimed counts as, by its outcome.
NOT_CLAIMED_COUNTS: dict[NotClaimedOutcome, str] = {
    "done": "already_done",
    "parked": "already_done",
    "stray": "stray",
    "missing": "poisoned",
    "class_mismatch": "poisoned",
    "unknown_class": "poisoned",
    "unreadable": "poisoned",
    "invalid": "poisoned",
    "exhausted": "failed",
    "deferred": "deferred",
    "running": "deferred",
    "unknown": "unanswered",
}

# What an end write counts as, by its outcome (a commit's; the others count apart).
COMMIT_COUNTS: dict[FinishOutcome, str] = {
    FinishOutcome.DONE: "committed",
    FinishOutcome.REJECTED: "rejected",
    FinishOutcome.FAILED: "failed",
    FinishOutcome.UNKNOWN: "commit_unknown",
    FinishOutcome.INVALID: "commit_invalid",
}


def now_of(env: AttemptEnv) -> Flow[Now]:
    """The shell's clocks, read now (both stamps of one moment)."""
    now: Now = yield from ask("now", env.now)
    return now


def _nonce(env: AttemptEnv) -> Flow[str]:
    """A fresh nonce from the shell: an attempt's, or a release's made on its behalf."""
    nonce: str = yield from ask("write_id", env.write_id)
    return nonce


def result_json(result: Any) -> str | None:
    """The handler's result as canonical JSON, or None when it is not JSON."""
    try:
        return json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return None


# ----------------------------------------------------------------------------- attempt


def attempt_flow(
    env: AttemptEnv, item: Delivery | Poison, *, tag: Any = None
) -> Flow[Finish | None]:
    """One received message, to its decided end (see the module doc).

    ``tag`` is kept on the book's entry for the shell (the simulator's task origin).
    Returns the end write, or None when the attempt wrote no end of its own.
    """
    if isinstance(item, Poison):
        env.tally("poisoned", 1)
        yield from poison_flow(
            env.table, queue_url=env.queue_url, poison=item, dlq_url=env.dlq_url, body=item.body
        )
        return None
    rules = rules_for(env, item.job_class, item.stage)
    now = yield from now_of(env)
    late, behind = env.book.before_claim(item.job_id, now.mono)
    if late is not None:
        # Our own lapsed attempt of this job goes back (its attempt given back) first.
        yield from _handed_back_late(env, late, now.mono)
        now = yield from now_of(env)
    elif behind is not None:
        yield from _defer_behind_hand_back(env, item, behind)
        return None
    # Drawn only when needed: the random stream stays the retries' own.
    rand = 0.5 if rules is not None else (yield from ask("random", env.random))
    nonce = yield from _nonce(env)
    try:
        return (yield from _claim_and_run(env, item, rules, now, nonce, rand, tag))
    finally:
        # Held, refused, or ended before its hold: the claim is no longer the book's
        # news (``LeaseBook.owns``); a flow closed midway forgets it too.
        env.book.unclaim(nonce)


def _claim_and_run(
    env: AttemptEnv,
    item: Delivery,
    rules: ClassRules | None,
    now: Now,
    nonce: str,
    rand: float,
    tag: Any,
) -> Flow[Finish | None]:
    claim = yield from _admit(env, item, rules, now.wall, nonce, rand=rand)
    if isinstance(claim, NotClaimed) and claim.outcome == "running" and rules is not None:
        taken = yield from _owner_running(env, item, claim, rules, nonce)
        if taken is None:
            return None
        claim = taken
    if not isinstance(claim, Claimed):
        counter = NOT_CLAIMED_COUNTS.get(claim.outcome)
        if counter is not None:
            env.tally(counter, 1)
        return None
    env.tally("claimed", 1)
    env.tally("reclaimed", int(claim.reclaimed))
    if rules is None:  # pragma: no cover - admit_flow never claims it
        return None
    if claim.job.stage is None and env.first_stage_of is not None:
        first = env.first_stage_of(claim.job.job_class)
        if first is not None:
            claim = replace(claim, job=replace(claim.job, stage=first))
    text = stage_input_json(claim.job)
    checked = yield Invoke("validate", lambda: rules.validate_payload(text))
    if isinstance(checked, Err):
        if not isinstance(checked.exc, PayloadError):
            raise checked.exc if checked.exc is not None else RuntimeError(checked.message)
        env.tally("poisoned", 1)
        invalid = Ending(EndKind.FAIL, str(checked.exc), "invalid_payload")
        failed = yield from _fail(_At(env, claim, rules), invalid, poisoned=True)
        yield from _settle(env, claim, failed)
        return failed
    assert isinstance(checked, Ok)
    payload = checked.response["value"]
    slots = yield from _take_slots(env, claim)
    if slots is not None and not slots.granted:
        yield from _wait_for_slot(env, claim, slots)
        return None
    now = yield from now_of(env)
    held_rules: LeaseRules = rules
    budget = cap_budget(item, rules.stage_budget_seconds, now.wall)
    if budget < rules.lease_seconds:
        # Not one lease is left of the message's 12-hour cap (earlier receives used
        # it): the handler does not start; the job goes on under a new message.
        at = _At(env, claim, rules)
        resent = yield from _resend(
            at,
            now,
            f"its earlier receives left {budget:.0f} s of SQS's 12-hour cap",
        )
        if slots is not None and slots.held:
            yield from _give_back(env, slots.held)
        yield from _settle(env, claim, resent)
        return resent
    if budget < rules.stage_budget_seconds:
        # Earlier receives of the message used part of SQS's 12-hour cap: this
        # attempt gets what is left, never a lease past the cap.
        held_rules = CappedRules(rules, budget)
        yield Emit(
            "stage_budget_capped",
            {
                "job_id": claim.job.job_id,
                "token": claim.token,
                "stage": claim.job.stage,
                "budget": round(budget, 3),
                "class_budget": rules.stage_budget_seconds,
            },
        )
    holding = env.book.hold(claim, held_rules, now.mono, env.new_signal(), tag)
    env.book.unclaim(nonce)  # the book's entry says the rest
    if holding.superseded:
        env.tally("own_claim_superseded", 1)
    if holding.event is not None:
        yield holding.event
    fin: Finish | None = None
    full = False
    try:
        at = _At(env, claim, rules, holding.held)
        try:
            fin = yield from _run(at, holding.held, payload, now.mono)
        except RecordUnreadable as exc:
            fin = yield from _unreadable_end(at, exc)
        # Queued while the book still holds the attempt: a stop that waits for the
        # ending attempts (``LeaseBook.ending``) then flushes this delete too.
        full = yield from _queue_delete(env, claim, fin)
    finally:
        env.book.forget(holding.held, fin)
    if slots is not None and slots.held:
        yield from _give_back(env, slots.held)
    if full:
        yield from flush_deletes_flow(env)
    return fin


# ----------------------------------------------------------------------------- duplicates


def _owner_running(
    env: AttemptEnv, item: Delivery, found: NotClaimed, rules: ClassRules, nonce: str
) -> Flow[ClaimResult | None]:
    """The job's current message, but the record runs under another token: a live
    owner keeps the job (the delivery is deferred, None), a dead one is taken over
    (the claim's result). The rule: ``_core/duplicates.py``."""
    running = found.job
    assert running is not None
    own = rules_for(env, running.job_class, running.stage) or rules
    now = yield from now_of(env)
    if running.owner == env.worker_id:
        # One worker id, two attempts (a copy reached another of its threads): its
        # own book says whether the first still owns the job: holds a lease it
        # extends, or claimed it and has not held it yet (validating, taking its
        # slots), or has a claim of it under way (soak seeds 1040258, 1045173).
        alive = env.book.owns(running.job_id, running.token, now.mono)
    else:
        window = owner_window(own.heartbeat_seconds)
        # Keep the message while watching: a copy that came back meanwhile would
        # be received (one more receive) and watched again by another worker.
        hold = math.ceil(window) + own.lease_seconds
        cmv = yield from set_visibility(on_queue(item, env.queue_url), item.receipt_handle, hold)
        if isinstance(cmv, Ok):
            item = replace(item, visibility=math.floor(cmv.sent_at - item.received_at) + hold)
        alive = yield from owner_alive_flow(
            env.table,
            owner=running.owner or "",
            job_id=running.job_id,
            token=running.token,
            window=window,
        )
    if not alive:
        now = yield from now_of(env)
        claim = yield from _admit(env, item, rules, now.wall, nonce, take_from=running.token)
        if not (isinstance(claim, NotClaimed) and claim.outcome == "running"):
            return claim
        # Claimed by another worker while this one watched: that owner is alive.
        running = claim.job if claim.job is not None else running
    yield from _defer(
        env,
        item,
        duplicate_defer(own.lease_seconds, item.receive_count),
        "owner_alive",
        owner=running.owner,
        token=running.token,
        receive_count=item.receive_count,
    )
    return None


def _admit(
    env: AttemptEnv,
    item: Delivery,
    rules: LeaseRules | None,
    wall_now: float,
    nonce: str,
    *,
    rand: float = 0.5,
    take_from: int | None = None,
) -> Flow[ClaimResult]:
    """``admit_flow`` for a delivery under its class's rules (None: a class this
    worker does not know); ``take_from``: the running token a take-over may replace.

    The book knows the claim from its write to its hold (``LeaseBook.owns``): a copy
    of the job that reaches another attempt of this worker meanwhile is deferred."""
    env.book.claiming(nonce, item.job_id)
    claim = yield from admit_flow(
        env.table,
        queue_url=env.queue_url,
        dlq_url=env.dlq_url,
        delivery=item,
        known_class=rules is not None,
        worker_id=env.worker_id,
        wall_now=wall_now,
        lease_seconds=rules.lease_seconds if rules else env.receive_visibility,
        max_attempts=rules.max_attempts if rules else UNKNOWN_CLASS_MAX_ATTEMPTS,
        unknown_class_receives=env.unknown_class_receives,
        rand=rand,
        keep_receive_lease=first_beat_reserve(rules, item.visibility) if rules else None,
        nonce=nonce,
        take_from=take_from,
    )
    if isinstance(claim, Claimed) and rules is not None:
        env.book.claimed(nonce, claim.token, claim.deadline - rules.jitter_seconds)
    else:
        env.book.unclaim(nonce)
    return claim


def _defer(env: AttemptEnv, item: Delivery, delay: int, reason: str, **fields: Any) -> Flow[None]:
    """Leave a delivery unclaimed for ``delay`` seconds (``claim_deferred``)."""
    cmv = yield from set_visibility(on_queue(item, env.queue_url), item.receipt_handle, delay)
    yield Emit(
        "claim_deferred",
        {
            "job_id": item.job_id,
            "message_id": item.message_id,
            "reason": reason,
            **fields,
            "delay": delay,
            "visibility_set": isinstance(cmv, Ok),
        },
    )
    env.tally("deferred", 1)


# ----------------------------------------------------------------------------- slots


def _take_slots(env: AttemptEnv, claim: Claimed) -> Flow[SlotGrant | None]:
    """The slots of the limits this job falls under (None: it falls under none)."""
    if env.slots is None:
        return None
    job = claim.job
    tenant = job.tenant
    pool, limit = job.job_class, None
    if job.stage is not None and env.slots.stage_limit is not None:
        # A stage's own limit (its class's concurrency_limit), in the pool of what it
        # belongs to: a stage limited to 2 (an upload to an ERP) shares no slots with
        # another stage; a planned tool's limit is one pool for every step calling it.
        own = env.slots.stage_limit(job.job_class, job.stage)
        if own is not None:
            pool, limit = own_pool(job.job_class, own[0]), own[1]
    else:
        limit = env.slots.class_limit(job.job_class)
    pools = pools_for(
        pool,
        limit,
        tenant,
        env.slots.tenant_limit(tenant) if tenant is not None else None,
    )
    if not pools:
        return None
    now = yield from now_of(env)
    grant: SlotGrant = yield from take_slots_flow(
        env.slots.requests,
        env.table,
        pools=pools,
        job_id=job.job_id,
        token=claim.token,
        worker_id=env.worker_id,
        wall_now=now.wall,
    )
    return grant


def _wait_for_slot(env: AttemptEnv, claim: Claimed, grant: SlotGrant) -> Flow[None]:
    """No slot: the claim does not count and the job waits as a fresh message, so the
    wait is no receive its redrive counts (``_core/slots.py``, rules 4 and 6)."""
    rand: float = yield from ask("random", env.random)
    d = claim.delivery
    interactive = env.interactive_url is not None and d.queue_url == env.interactive_url
    delay = wait_delay(waits_of(d.send_id), rand, interactive=interactive)
    yield from slot_wait_event(claim.job.job_id, claim.token, grant, delay, waits_of(d.send_id))
    now = yield from now_of(env)
    pool = grant.waiting_for
    yield from wait_flow(
        env.table,
        queue_url=env.queue_url,
        job=claim.job,
        delivery=d,
        worker_id=env.worker_id,
        wall_now=now.wall,
        delay=delay,
        reason=f"waiting for a slot of {pool.name if pool else '?'}",
        nonce=claim.nonce,
    )
    env.tally("waited_for_slot", 1)


def _give_back(env: AttemptEnv, held: tuple[HeldSlot, ...]) -> Flow[None]:
    assert env.slots is not None
    now = yield from now_of(env)
    yield from give_back_flow(env.slots.requests, held, wall_now=now.wall)


def first_beat_reserve(rules: LeaseRules, visibility: int) -> float:
    """How much of the receive's lease must be left when the claim answers for the
    claim to keep it (no ChangeMessageVisibility: the protocol's floor).

    The first beat comes ``H`` after the receive (at once when the receive granted
    less than the class's L), so keeping the lease while at least ``min(V, L) - H``
    is left gives the first beat no less reserve than any later beat; and never
    less than ``H + J``, the reserve a beat needs to survive one miss
    (``check_beat_reserve``). With less left, the claim sets L itself."""
    lease, beat = rules.lease_seconds, rules.heartbeat_seconds
    return max(beat + rules.jitter_seconds, min(visibility, lease) - beat)


def _queue_delete(env: AttemptEnv, claim: Claimed, fin: Finish | None) -> Flow[bool]:
    """An end write that ended the job left its message to delete: queue it in the
    batch; True when this one filled the batch."""
    if fin is None or not fin.delete_pending or env.deletes is None:
        return False
    now = yield from now_of(env)
    d = claim.delivery
    return env.deletes.add(d.receipt_handle, claim.job.job_id, claim.token, now.mono, d.queue_url)


def _settle(env: AttemptEnv, claim: Claimed, fin: Finish | None) -> Flow[None]:
    """Queue the ended job's delete, and send the batch when this one filled it."""
    if (yield from _queue_delete(env, claim, fin)):
        yield from flush_deletes_flow(env)


def flush_deletes_flow(env: AttemptEnv, *, force: bool = False) -> Flow[int]:
    """Send the deletes that are due (a full batch, or one that waited the window;
    ``force``: all, at shutdown) 10 per DeleteMessageBatch; how many SQS deleted.

    Never raises and never retries: an entry or a batch SQS refused is journaled
    (``message_delete_failed``) and left to its redelivery, which meets the job's
    terminal record at the claim and is deleted then."""
    if env.deletes is None:
        return 0
    deleted = 0
    now = yield from now_of(env)
    while batch := env.deletes.take(now.mono, force=force):
        entries = [{"Id": str(i), "ReceiptHandle": p.receipt_handle} for i, p in enumerate(batch)]
        out = yield Call(
            "sqs",
            "DeleteMessageBatch",
            {"QueueUrl": batch[0].queue_url or env.queue_url, "Entries": entries},
        )
        if isinstance(out, Err):
            for p in batch:
                yield Emit(
                    "message_delete_failed",
                    {
                        "job_id": p.job_id,
                        "token": p.token,
                        "error_code": out.code or out.kind.value,
                    },
                )
            continue
        assert isinstance(out, Ok)
        deleted += len(out.response.get("Successful", []))
        # Batch calls report per-entry failures on HTTP 200: always read Failed[].
        for bad in out.response.get("Failed", []):
            p = batch[int(bad["Id"])]
            yield Emit(
                "message_delete_failed",
                {"job_id": p.job_id, "token": p.token, "error_code": str(bad.get("Code", ""))},
            )
    return deleted


@dataclass(frozen=True)
class _At:
    """One attempt as its ending steps see it: the shell's env, the claim, the class,
    and the book's entry (None: a write right after the claim, before it was held)."""

    env: AttemptEnv
    claim: Claimed
    rules: ClassRules
    held: Held | None = None

    def handle_ours(self, now: Now) -> bool:
        """Whether a visibility change with this attempt's receipt handle is still safe
        (``LocalLease.handle_ours``; before the attempt is held: the claim's own)."""
        return self.held is None or self.held.lease.handle_ours(now.mono)

    def lapsed(self, now: Now) -> tuple[str, ...]:
        """This attempt's receipt handle when a release must not change its visibility."""
        return () if self.handle_ours(now) else (self.claim.delivery.receipt_handle,)

    def end_args(self, now: Now) -> dict[str, Any]:
        """The arguments every end write of an attempt shares."""
        return {
            "queue_url": self.env.queue_url,
            "job": self.claim.job,
            "delivery": self.claim.delivery,
            "worker_id": self.env.worker_id,
            "wall_now": now.wall,
            "defer_delete": self.env.deletes is not None,
            "nonce": self.claim.nonce,
        }

    def rejected(self, fin: Finish, source: LossSource) -> Flow[None]:
        """A rejected end write: the loss, journaled once."""
        ev = self.env.book.rejected(self.held, self.claim, fin, source)
        if ev is not None:
            yield ev


def _unreadable_end(at: _At, exc: RecordUnreadable) -> Flow[Finish]:
    """A write after the handler met a job record this version cannot read (a state an
    outside writer or a newer version put there). Every such write is conditional on
    the record running under this attempt's token, so the record is not ours, whatever
    else it holds: the attempt writes nothing more, keeps its message (it comes back
    when its visibility lapses, and the claim decides), and reports the loss once.
    The one place for it, whichever write of whichever ending met the record."""
    claim = at.claim
    yield Emit(
        "job_record_unreadable",
        {"job_id": claim.job.job_id, "token": claim.token, "stage": "end", "reason": str(exc)},
    )
    fin = Finish(FinishOutcome.REJECTED, "job record unreadable")
    yield from at.rejected(fin, LossSource.COMMIT)
    return fin


def _run(at: _At, held: Held, payload: Any, start: float) -> Flow[Finish | None]:
    env, claim = at.env, at.claim
    error: Exception | None = None
    result: Any = None
    t = yield from now_of(env)
    if env.book.lapsed_before_start(held, t.mono):
        yield from _handed_back_late(env, held, t.mono)
        return None
    if env.book.told(held) is None:  # claimed while the worker stops: do not start
        run = HandlerRun(held, claim, at.rules, payload, env.run_handler)
        out = yield Invoke("handler", run)
        if isinstance(out, Err):
            exc = out.exc
            if not isinstance(exc, Exception):
                raise exc if exc is not None else RuntimeError(out.message)
            error = exc
        elif out is not None:
            result = plain_data(out.response["value"])
    if isinstance(error, LeaseLost) and not isinstance(error, JobCancelled):
        # The handler's own fenced call was refused (a 412 on ``ctx.fence_headers``):
        # the same proof of another owner as a refused intent start, told once.
        ev = env.book.intent_refused(held, str(error), LossSource.HANDLER)
        if ev is not None:
            yield ev
    stop = env.book.mark(held)
    if env.observer is not None:
        env.observer.handler_ended(held, stop)
    # A handler told to stop may return a partial result: never committed.
    end = stopped_ending(ending_for(error, claim.job.payload_json), stop)
    now = yield from now_of(env)
    if end.kind is EndKind.RELEASE:
        released = yield from release_flow(
            env.table,
            queue_url=env.queue_url,
            held=[(claim.job, claim.delivery)],
            worker_id=env.worker_id,
            wall_now=now.wall,
            reason=end.reason,
            nonce=claim.nonce,
            lapsed=at.lapsed(now),
        )
        env.tally("released", released)
        return None
    if end.kind is EndKind.COMMIT:
        return (yield from _commit(at, result, now, now.mono - start))
    if end.kind is EndKind.ABANDON:
        # The handler stopped before an irreversible step, or returned after its
        # attempt was told to stop (result_discarded): nothing may be written for
        # this attempt. The message comes back when its visibility lapses.
        env.tally("lost", 1)
        yield Emit(
            "result_discarded" if end.code == "result_discarded" else "job_abandoned",
            {
                "job_id": claim.job.job_id,
                "token": claim.token,
                "error_code": end.code,
                "stop": stop.value if stop is not None else None,
                "duration": round(now.mono - start, 3),
            },
        )
        return None
    if end.kind is EndKind.FAIL:
        return (yield from _fail(at, end, now))
    if end.kind is EndKind.PARK:
        # Nobody can tell whether the effect applied: stop automatic retries of
        # this job and keep everything for an operator (sqs-lease intents ...).
        env.tally("parked", 1)
        fin = yield from park_flow(env.table, **at.end_args(now), reason=end.reason)
        yield from at.rejected(fin, LossSource.PARK)
        return fin
    return (yield from _retry(at, end, now))


def _commit(at: _At, result: Any, now: Now, duration: float) -> Flow[Finish]:
    env = at.env
    if isinstance(result, NextStage):
        return (yield from _continue(at, result, now, duration))
    text = result_json(result)
    if text is None:
        bad = Ending(EndKind.FAIL, "handler returned a result that is not JSON", "bad_result")
        return (yield from _fail(at, bad, now))
    if env.observer is not None:
        env.observer.committing(at.claim, text)
    # A result over DynamoDB's item limit (with the payload) is never sent: the
    # core's commit_flow fails the job naming the limit. Always attempt the fenced
    # commit, even when the heartbeat already saw the lease lost: DynamoDB's
    # condition is the only arbiter, and a rejected commit is the record forensics
    # needs (result_rejected).
    fin = yield from commit_flow(
        env.table,
        **at.end_args(now),
        result_json=text,
        duration=duration,
        keep_rejected_content=at.rules.keep_rejected_results,
    )
    env.tally(COMMIT_COUNTS[fin.outcome], 1)
    yield from at.rejected(fin, LossSource.COMMIT)
    return fin


def _continue(at: _At, nxt: NextStage, now: Now, duration: float) -> Flow[Finish]:
    """The handler ended its stage with ``NextStage``: checkpoint, next message, delete
    (``stages.continue_flow``); a next stage the job does not have, or an input its
    payload model refuses, fails the job naming the stage and the field."""
    env, job = at.env, at.claim.job
    lookup = env.stage_rules_of
    rules = lookup(job.job_class, nxt.name) if lookup and isinstance(nxt.name, str) else None
    why = refused_next(job, nxt, rules is not None)
    text = result_json(nxt.payload)
    if why is None and (text is None or result_json(nxt.checkpoint) is None):
        why = f"NextStage({nxt.name!r}): its payload and result must be JSON"
    if why is None and rules is not None and text is not None:
        checked = yield Invoke("validate", lambda: rules.validate_payload(text))
        if isinstance(checked, Err):
            if not isinstance(checked.exc, PayloadError):
                raise checked.exc if checked.exc is not None else RuntimeError(checked.message)
            why = f"NextStage({nxt.name!r}): {checked.exc}"
    if why is not None or text is None:
        bad = Ending(EndKind.FAIL, why or "", "bad_next_stage")
        return (yield from _fail(at, bad, now))
    done = yield from continue_flow(
        env.table,
        **at.end_args(now),
        nxt=nxt,
        input_json=text,
        duration=duration,
    )
    env.tally(COMMIT_COUNTS[done.fin.outcome], 1)
    yield from at.rejected(done.fin, LossSource.COMMIT)
    return done.fin


def _retry(at: _At, end: Ending, now: Now | None = None) -> Flow[Finish]:
    """A counted retry after a backoff drawn now (or, past the attempts, a failure)."""
    env, claim, rules = at.env, at.claim, at.rules
    rand: float = yield from ask("random", env.random)
    delay = backoff_delay(
        claim.attempt, rules.backoff_base_seconds, rules.backoff_max_seconds, rand
    )
    if now is None:
        now = yield from now_of(env)
    fin = yield from retry_flow(
        env.table,
        **at.end_args(now),
        reason=end.reason,
        error_code=end.code,
        delay=delay,
        max_attempts=rules.max_attempts,
        handle_ours=at.handle_ours(now),
    )
    if fin.outcome is FinishOutcome.DONE:
        spent = claim.attempt >= attempts_allowed(claim.job, rules.max_attempts)
        env.tally("failed" if spent else "retried", 1)
    elif fin.outcome is FinishOutcome.FAILED:
        env.tally("failed", 1)
    yield from at.rejected(fin, LossSource.RETRY)
    return fin


def _fail(at: _At, end: Ending, now: Now | None = None, *, poisoned: bool = False) -> Flow[Finish]:
    """The job fails for good (``poisoned``: its message carried an invalid payload)."""
    env, claim = at.env, at.claim
    if poisoned:
        yield Emit(
            "message_poisoned",
            {
                "job_id": claim.job.job_id,
                "token": claim.token,
                "error_code": end.code,
                "reason": end.reason,
            },
        )
    if now is None:
        now = yield from now_of(env)
    fin = yield from fail_flow(
        env.table, **at.end_args(now), reason=end.reason, error_code=end.code
    )
    if fin.outcome is FinishOutcome.DONE and not poisoned:
        env.tally("failed", 1)
    yield from at.rejected(fin, LossSource.FAIL)
    return fin


# ----------------------------------------------------------------------------- effects


def held_effect_flow(
    env: AttemptEnv,
    held: Held,
    spec: EffectSpec,
    *,
    wall_clock: Callable[[], float],
    flow_id: str,
) -> Flow[EffectResult]:
    """One side effect of a held attempt (``ctx.effect``): ``effect_flow`` under its
    token; a refused intent start while the lease was open is the first news of
    its loss, told to the book (and journaled) before ``LeaseLost`` reaches the
    handler."""
    try:
        return (
            yield from effect_flow(
                env.intents,
                env.table,
                spec=spec,
                token=held.lease.token,
                worker_id=env.worker_id,
                wall_clock=wall_clock,
                flow_id=flow_id,
                own_starts=env.own_starts,
            )
        )
    except LeaseLost as exc:
        ev = env.book.intent_refused(held, str(exc))
        if ev is not None:
            yield ev
        raise


# ----------------------------------------------------------------------------- heartbeat


ROUND_PART = DDB_BATCH_GET
"""Leases per part of a heartbeat round: one ownership read (BatchGetItem of 100)
and its ten visibility batches. A round's parts run at once (``Invoke("parallel")``),
so a round of thousands takes about as long as its slowest part, not their sum."""


def heartbeat_round_flow(env: AttemptEnv) -> Flow[None]:
    """One heartbeat round over the book (the shell decides only when to run it)."""
    book = env.book
    clock = yield from now_of(env)
    now = clock.mono
    plan, dropped = book.plan_round(now)
    yield from watchdog_drops_flow(env, dropped, now)
    extend = book.still_open(plan.extend)
    if not extend:
        return
    # Leases joined to their group's shared round ahead of their own beat.
    env.tally("beats_early", len(book.still_open(plan.early)))
    if env.observer is not None:
        env.observer.round_planned(extend)
    due = min(beat_due(lease) for lease in extend)
    wall = (yield from now_of(env)).wall
    parts = [
        heartbeat_flow(
            env.table,
            queue_url=env.queue_url,
            leases=extend[i : i + ROUND_PART],
            worker_id=env.worker_id,
            wall_now=wall,
        )
        for i in range(0, len(extend), ROUND_PART)
    ]
    if len(parts) == 1 or env.run_parallel is None:
        reports = []
        for part in parts:
            reports.append((yield from part))
    else:
        reports = yield from ask("parallel", Parallel(tuple(parts), env.run_parallel))
    report = HeartbeatReport(
        {job_id: beat for r in reports for job_id, beat in r.beats.items()},
        sum(r.calls for r in reports),
    )
    changed, superseded = book.apply_round(extend, report, started=now)
    if superseded:
        env.tally("verdict_for_superseded_attempt", superseded)
    yield from changed.events
    if changed.capped:
        # SQS refused an extension while the job is still ours: its new message.
        capped = {id(lease) for lease in changed.capped}
        held_capped = [(h, Drop.MESSAGE_CAP) for h in book.entries() if id(h.lease) in capped]
        yield from watchdog_drops_flow(env, held_capped, now)
    if env.observer is not None:
        env.observer.round_applied(changed.extended)
    end = yield from now_of(env)
    pressure = None
    if book.pace is not None:
        pressure = book.paced(extend, due=due, started=now, ended=end.mono)
    yield from liveness_flow(env, end, round_seconds=end.mono - now)
    if pressure is not None:
        yield pressure


def liveness_flow(env: AttemptEnv, at: Now, *, round_seconds: float) -> Flow[int]:
    """After a round: the worker's one liveness record (``_core/liveness.py``): every
    open lease it holds (and every claim it made and holds not yet), with its token
    and deadline on the wall clock. Advisory: its only condition keeps it off a job
    record under its key, and a failure is only journaled (``liveness_failed``).
    Written once per heartbeat interval (the shortest held; at most one per half
    interval), however many rounds the leases' own schedules make; each write counts
    ``beats`` up, which a claim of a job this worker runs watches move
    (``_core/duplicates.py``). Returns the calls made (one per
    :data:`~sqs_lease._core.liveness.LIVENESS_PART` jobs)."""
    book = env.book
    open_ = [h for h in book.entries() if is_open(h)]
    if not open_:
        return 0
    every = min(h.lease.heartbeat_seconds for h in open_)
    # Half an interval: rounds come every H on their shared schedule, but each ends
    # a little earlier or later than the one before; with a whole H a round that
    # ended early would skip its write, leaving 2H between two, and a claimer
    # watching for the owner's heartbeat (``_core/duplicates.py``) must see one
    # within its window.
    if book.liveness_at is not None and at.mono - book.liveness_at < every / 2:
        return 0
    book.liveness_at = at.mono
    book.liveness_beats += 1
    listed = {
        h.job.job_id: HeldJob(h.job.job_id, h.lease.token, at.wall + (h.lease.deadline - at.mono))
        for h in open_
    }
    # A claim that landed and is not held yet (validating, taking its slots) is this
    # worker's too: a claimer watching it must not judge it dead. It is the job's
    # newest token here (a held entry of the job is the attempt it supersedes).
    for c in book.pending_claims(at.mono):
        assert c.token is not None
        listed[c.job_id] = HeldJob(c.job_id, c.token, at.wall + (c.deadline - at.mono))
    held = sorted(listed.values(), key=lambda j: j.job_id)
    parts = liveness_parts(env.worker_id, at.wall, round_seconds, held, book.liveness_beats)
    for part in parts:
        out = yield from call(env.table.liveness(part))
        if isinstance(out, Err):
            yield Emit(
                "liveness_failed",
                {
                    "part": part.part,
                    "jobs": len(part.held),
                    "error_code": out.code or out.kind.value,
                },
            )
    env.tally("liveness_writes", len(parts))
    return len(parts)


def _resend(at: _At, now: Now, why: str) -> Flow[Finish]:
    """The job goes on under a new message (``stages.resend_flow``), uncharged: its
    message reached SQS's 12-hour cap. A refused write is this attempt's loss."""
    env = at.env
    args = at.end_args(now)
    fin = yield from resend_flow(
        env.table,
        queue_url=args["queue_url"],
        job=at.claim.job,
        delivery=at.claim.delivery,
        worker_id=env.worker_id,
        wall_now=now.wall,
        reason=f"message cap: {why}; attempt not charged",
        defer_delete=args["defer_delete"],
        nonce=args["nonce"],
    )
    env.tally("resent", int(fin.outcome is FinishOutcome.DONE))
    yield from at.rejected(fin, LossSource.RETRY)
    return fin


def watchdog_drops_flow(
    env: AttemptEnv, dropped: list[tuple[Held, Drop]], now: float
) -> Flow[None]:
    """Leases the worker let go (the book already dropped them and told their
    attempts): journal each, and give its job back for a counted retry unless the
    reserve was spent (then the message simply comes back)."""
    book = env.book
    for held, why in dropped:
        lease = held.lease
        if why is Drop.WORKER_LATE:
            yield from _handed_back_late(env, held, now)
            continue
        yield Emit(
            "lease_dropped",
            {
                "job_id": lease.job_id,
                "token": lease.token,
                "reason": why.value,
                "lease_left": round(lease.deadline - now, 3),
            },
        )
        rules = rules_for(env, held.job.job_class, held.job.stage)
        if why is Drop.RESERVE_SPENT or rules is None:
            continue
        # The watchdog gives the job back for a counted retry; the handler's late
        # result will meet a moved record and be rejected.
        # Its own nonce: the attempt's late end write must not take this retry for its own.
        nonce = yield from _nonce(env)
        claim = Claimed(
            held.delivery,
            held.job,
            lease.token,
            held.job.attempt,
            False,
            None,
            lease.deadline,
            nonce,
        )
        yield Invoke("act_for", ActFor("heartbeat", {lease.job_id: lease.token}))
        if why is Drop.MESSAGE_CAP:
            # Not the job's fault: a new message, the attempt given back.
            t = yield from now_of(env)
            fin = yield from _resend(_At(env, claim, rules, held), t, "SQS's 12-hour cap reached")
            yield from _settle(env, claim, fin)
            yield Invoke("act_for", ActFor("heartbeat"))
            book.gave_back([held], f"watchdog: {why.value}")
            continue
        watchdog = Ending(EndKind.RETRY, f"watchdog: {why.value}", why.value)
        fin = yield from _retry(_At(env, claim, rules, held), watchdog)
        yield from _settle(env, claim, fin)  # attempts spent: the job failed
        yield Invoke("act_for", ActFor("heartbeat"))
        if fin.outcome in (FinishOutcome.DONE, FinishOutcome.FAILED):
            book.gave_back([held], f"watchdog: {why.value}")


def _handed_back_late(env: AttemptEnv, held: Held, now: float) -> Flow[None]:
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
        nonce = yield from _nonce(env)  # the hand-back's own, not the lapsed attempt's
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


def _defer_behind_hand_back(env: AttemptEnv, item: Delivery, age: float) -> Flow[None]:
    """The job's lapsed attempt is being handed back by another flow of this worker:
    a claim now could land before that release and charge the job an attempt for the
    worker's own lateness, so the message comes back later, unclaimed."""
    yield from _defer(env, item, hand_back_defer(age), "hand_back_under_way")


def heartbeat_tick_flow(env: AttemptEnv, *, stopping: bool) -> Flow[None]:
    """What the heartbeat loop does every tick: pass a shutdown on to every attempt
    still held, then one round. A round that raises is journaled
    (``heartbeat_error``) and the loop goes on: the heartbeat survives anything."""
    if stopping:
        env.book.request_stop()
    try:
        yield from heartbeat_round_flow(env)
    except Exception as exc:
        yield Emit("heartbeat_error", {"error_code": type(exc).__name__})
        if env.observer is not None:
            env.observer.round_failed(exc)


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


def first_sweep_wait(interval: float, rand: float) -> float:
    """The wait before a worker's first stranded sweep: a random part of the interval
    spreads the sweeps of workers started together."""
    return interval * (0.5 + 0.5 * rand)


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
    nonce = yield from _nonce(env)  # the shutdown's own: no attempt takes it for its write
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


DLQ_SWEEP_RECEIVES = 1
"""DLQ receives (up to 10 messages each) a worker's periodic sweep reconciles: one per
sweep keeps its cost a few calls a minute; ``sqs-lease dlq list --reconcile`` walks
the whole DLQ."""


SWEEP_PAGE_SECONDS = 10.0
"""What a sweep with a time budget (the Lambda shell's scheduled sweep) keeps for one
more page: a query and its re-sends, or one DLQ receive of 10 messages and their
parks. A stranded page after the first starts only while two of these are left (one
for the DLQ's first receive), a DLQ receive after the first while one is left."""

SWEEP_MAX_PAGES = 1000
"""The bound on a paging sweep's stranded pages (its time budget ends it sooner)."""

SCHEDULED_SWEEP_PAGE = 100
"""Stranded records per page of a scheduled sweep (the Lambda shell's)."""

SCHEDULED_DLQ_RECEIVES = 100
"""The bound on a scheduled sweep's DLQ receives (1,000 messages, each held for the
reconciliation's hold, then given back); its time budget ends it sooner."""


@dataclass(frozen=True)
class SweepRun:
    """What one sweep did: stranded records found and sent again over ``pages``
    pages (``more``: it stopped before the index's end: time, the page bound, or a
    failure), and what its DLQ reconciliation parked."""

    resent: int = 0
    found: int = 0
    pages: int = 0
    more: bool = False
    dlq_looked: int = 0
    dlq_parked: int = 0
    dlq_more: bool = False
    failed: tuple[str, ...] = ()  # the events of the parts that failed


def sweep_once_flow(
    env: AttemptEnv,
    *,
    older_than: float,
    limit: int,
    send_id_prefix: str,
    dlq_receives: int = 0,
) -> Flow[int]:
    """One bounded sweep of stranded records (one page of ``limit``); how many were
    sent again. Never raises: a failed sweep is journaled (``stranded_sweep_failed``)
    and the next one tries.

    With ``dlq_receives`` (and a DLQ) it then reconciles that many receives of the
    DLQ (up to 10 messages each): a job whose current message SQS moved there is
    parked (``job_dead_lettered``), so no record waits ``queued`` or ``running`` for
    a message nothing will run; a failure is journaled (``dlq_reconcile_failed``)."""
    run = yield from sweep_pages_flow(
        env,
        older_than=older_than,
        limit=limit,
        send_id_prefix=send_id_prefix,
        dlq_receives=dlq_receives,
    )
    return run.resent


def sweep_pages_flow(
    env: AttemptEnv,
    *,
    older_than: float,
    limit: int,
    send_id_prefix: str,
    dlq_receives: int = 0,
    until: float | None = None,
) -> Flow[SweepRun]:
    """The sweep every shell runs: stranded records, then the DLQ. Never raises.

    ``until`` None: one page of ``limit`` stranded records and ``dlq_receives``
    receives of the DLQ (a worker's periodic sweep, :func:`sweep_once_flow`).
    ``until`` (lease clock, when the caller's time ends: a scheduled Lambda sweep):
    page on through the ``unsent`` index to its end (each page after the last one's
    ``LastEvaluatedKey``, so records it cannot send do not hide the rest), then up
    to ``dlq_receives`` DLQ receives, while :data:`SWEEP_PAGE_SECONDS` allow. The
    first page and the first DLQ receive always run, as a worker's sweep does."""
    resent = found = pages = 0
    more = False
    failed: list[str] = []
    start: Mapping[str, Any] | None = None
    try:
        for page in range(1 if until is None else SWEEP_MAX_PAGES):
            now = yield from now_of(env)
            if until is not None and page > 0 and now.mono + 2 * SWEEP_PAGE_SECONDS > until:
                break  # out of time: more stays as the last page said
            report: SweepReport = yield from sweep_flow(
                env.table,
                queue_url=env.queue_url,
                wall_now=now.wall,
                older_than=older_than,
                limit=limit,
                # Unique per page: a page's new send ids are PREFIX.N.
                send_id_prefix=send_id_prefix if page == 0 else f"{send_id_prefix}p{page}",
                interactive_url=env.interactive_url,
                start_key=start,
            )
            pages += 1
            found += len(report.jobs)
            sent = sum(1 for j in report.jobs if j.verdict == "resent")
            resent += sent
            env.tally("stranded_resent", sent)
            more, start = report.more, report.next_key
            if start is None:
                break
    except Exception as exc:  # the sweep must never stop the worker
        more = True
        failed.append("stranded_sweep_failed")
        yield Emit(
            "stranded_sweep_failed",
            {"error_code": type(exc).__name__, "reason": outside_text(str(exc))[:300]},
        )
    run = SweepRun(resent=resent, found=found, pages=pages, more=more)
    if dlq_receives > 0 and env.dlq_url:
        receive_until = None if until is None else until - SWEEP_PAGE_SECONDS
        dlq = yield from _reconcile_dlq_once(env, env.dlq_url, dlq_receives, receive_until)
        if dlq is None:
            failed.append("dlq_reconcile_failed")
        else:
            run = replace(
                run,
                dlq_looked=len(dlq.findings),
                dlq_parked=dlq.count(DlqVerdict.PARKED),
                dlq_more=dlq.more,
            )
    return replace(run, failed=tuple(failed))


def _reconcile_dlq_once(
    env: AttemptEnv, dlq_url: str, receives: int, receive_until: float | None = None
) -> Flow[DlqReport | None]:
    try:
        now = yield from now_of(env)
        dlq: DlqReport = yield from reconcile_dlq_flow(
            env.table,
            dlq_url=dlq_url,
            wall_now=now.wall,
            limit=receives * SQS_BATCH,
            receives=receives,
            wait_seconds=0,
            by="sweep",
            receive_until=receive_until,
        )
    except Exception as exc:  # the sweep must never stop the worker
        yield Emit(
            "dlq_reconcile_failed",
            {"error_code": type(exc).__name__, "reason": outside_text(str(exc))[:300]},
        )
        return None
    env.tally("dlq_parked", dlq.count(DlqVerdict.PARKED))
    return dlq


# ----------------------------------------------------------------------------- startup


def redrive_rules(
    max_receives: int | None, most_attempts: int, unknown_class_receives: int
) -> tuple[int, Emit | None]:
    """The queue's redrive against the classes' attempts, at startup: the receives an
    unknown class may have before our DLQ copy, and the warning for a redrive so
    tight that it can move a live job's message to the DLQ."""
    warning: Emit | None = None
    if max_receives is not None and redrive_too_tight(max_receives, most_attempts):
        # Receives that end in no claim (unanswered claims, duplicates) count too:
        # a redrive this tight can move a live job's message to the DLQ and leave
        # its record without a message (found by the simulation, tight_redrive).
        warning = Emit(
            "redrive_too_tight",
            {
                "max_receive_count": max_receives,
                "max_attempts": most_attempts,
                "fix": "raise the queue's maxReceiveCount well above max_attempts "
                "(sqs-lease queue create --max-receives N)",
            },
        )
    # Our DLQ copy (with the reason) must come before SQS's own redrive (without).
    bound = (
        unknown_class_receives
        if max_receives is None
        else max(1, min(unknown_class_receives, max_receives - 1))
    )
    return bound, warning


__all__ = [
    "DLQ_SWEEP_RECEIVES",
    "SCHEDULED_DLQ_RECEIVES",
    "SCHEDULED_SWEEP_PAGE",
    "SWEEP_MAX_PAGES",
    "SWEEP_PAGE_SECONDS",
    "ActFor",
    "AttemptEnv",
    "ClassRules",
    "HandlerRun",
    "Now",
    "Observer",
    "Parallel",
    "SlotEnv",
    "SweepRun",
    "attempt_flow",
    "first_beat_reserve",
    "first_sweep_wait",
    "flush_deletes_flow",
    "heartbeat_round_flow",
    "heartbeat_tick_flow",
    "held_effect_flow",
    "now_of",
    "receive_size",
    "redrive_rules",
    "release_unstarted_flow",
    "result_json",
    "rules_for",
    "shutdown_flow",
    "sweep_once_flow",
    "sweep_pages_flow",
    "watchdog_drops_flow",
]
